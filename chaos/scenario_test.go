package chaos

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseScenario(t *testing.T) {
	s, err := ParseScenario([]byte(`
options: {before: 2s, rps: 4}
thresholds: {max_error_rate: 0.01}
drills:
  - drill: kill-cell
    region: us-west
    cells: [1]
    thresholds: {max_rto: 1500ms}
  - drill: jitter
    delay_ms: 20
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Drills) != 2 || s.Drills[0].Region != "us-west" || s.Drills[0].Cells[0] != 1 || s.Drills[1].DelayMS != 20 {
		t.Fatalf("parsed %+v", s)
	}
	var o Options
	s.Options.Apply(&o)
	if o.Before != 2*time.Second || o.Load.RPS != 4 {
		t.Errorf("options %+v", o)
	}
	th := s.Thresholds.Thresholds().Merge(s.Drills[0].Thresholds.Thresholds())
	if *th.MaxErrorRate != 0.01 || *th.MaxRTO != 1500*time.Millisecond {
		t.Errorf("thresholds %+v", th)
	}
	for in, want := range map[string]string{
		"drills: []":                                                    "no drills",
		"drills: [{drill: nope}]":                                       `no drill "nope"`,
		"drills: [{drill: kill-cell, cell: 1}]":                         "unknown field",
		"drills: [{drill: jitter, delay_ms: -1}]":                       "delay_ms",
		"thresholds: {max_error_rate: 2}\ndrills: [{drill: kill-cell}]": "max_error_rate",
		"options: {before: soon}\ndrills: [{drill: kill-cell}]":         "duration",
		"drills: [{drill: brownout, severity: 3}]":                      "severity",
	} {
		if _, err := ParseScenario([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one mentioning %q", in, err, want)
		}
	}
}

func FuzzParseScenario(f *testing.F) {
	f.Add([]byte("drills: [{drill: kill-cell, cells: [0]}]"))
	f.Add([]byte("options: {before: 1s}\nthresholds: {max_rto: 2s}\ndrills:\n- drill: jitter\n  delay_ms: 20\n"))
	f.Add([]byte(`{"drills": [{"drill": "partition", "region": "b"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseScenario(b)
		if err != nil {
			return
		}
		for _, d := range s.Drills {
			if _, err := Lookup(d.Drill); err != nil {
				t.Fatalf("accepted unknown drill %q", d.Drill)
			}
		}
	})
}

// TestDocsScenarioListsEveryDrill keeps docs/drills.yaml parseable and
// complete.
func TestDocsScenarioListsEveryDrill(t *testing.T) {
	b, err := os.ReadFile("../docs/drills.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseScenario(b)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range s.Drills {
		names = append(names, d.Drill)
	}
	for _, d := range Drills() {
		if !slices.Contains(names, d.Name) {
			t.Errorf("docs/drills.yaml lacks %s", d.Name)
		}
	}
}
