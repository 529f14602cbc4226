package optimize

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"testing/iotest"
)

// workedExampleJSON is docs/design.md §5.2 in the input format
// (testdata/worked-example.json, shared with cmd/isobar's tests): demand
// A 90, B 120, C 40 rps; capacity 100, 100, 80; L0 300 ms; RTT A–B 20,
// B–C 30, A–C 60 ms.
func workedExampleJSON(headroom string) string {
	b, err := os.ReadFile("testdata/worked-example.json")
	if err != nil {
		panic(err) // a file of the repository
	}
	return strings.Replace(string(b), "HEADROOM", headroom, 1)
}

func TestParseInputWorkedExample(t *testing.T) {
	p, err := ReadInput(strings.NewReader(workedExampleJSON("1.0")))
	if err != nil {
		t.Fatal(err)
	}
	if p.Headroom != 1 || p.Beta != DefaultBeta || p.K != DefaultK || p.ShedPenaltyMs != DefaultShedPenaltyMs {
		t.Errorf("parameters %+v", p)
	}
	want := []Region{
		{Name: "a", DemandRPS: 90, CapacityRPS: 100, EngineLatencyMs: 300},
		{Name: "b", DemandRPS: 120, CapacityRPS: 100, EngineLatencyMs: 300},
		{Name: "c", DemandRPS: 40, CapacityRPS: 80, EngineLatencyMs: 300},
	}
	if len(p.Regions) != len(want) {
		t.Fatalf("regions %+v", p.Regions)
	}
	for i := range want {
		if p.Regions[i] != want[i] {
			t.Errorf("region %d: %+v, want %+v", i, p.Regions[i], want[i])
		}
	}
	rtt := [][]float64{{0, 20, 60}, {20, 0, 30}, {60, 30, 0}}
	for i := range rtt {
		for j := range rtt[i] {
			if p.RTTms[i][j] != rtt[i][j] {
				t.Errorf("rtt[%d][%d] = %v, want %v", i, j, p.RTTms[i][j], rtt[i][j])
			}
		}
	}
}

// A pair left out is unreachable; options and down are read.
func TestParseInputOptions(t *testing.T) {
	p, err := ParseInput([]byte(`{"headroom": 0.8, "beta": 0.2, "k": 3, "shed_penalty_ms": 5000,
	  "regions": [
	    {"name": "us-east", "demand_rps": 150, "capacity_rps": 100, "engine_latency_ms": 250},
	    {"name": "us-west", "demand_rps": 20, "capacity_rps": 100, "engine_latency_ms": 250},
	    {"name": "eu", "demand_rps": 30, "capacity_rps": 100, "engine_latency_ms": 250, "down": true}
	  ],
	  "rtt_ms": {"us-west": {"us-east": 70}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Headroom != 0.8 || p.Beta != 0.2 || p.K != 3 || p.ShedPenaltyMs != 5000 {
		t.Errorf("parameters %+v", p)
	}
	if !p.Regions[2].Down || p.Regions[0].Down {
		t.Errorf("down: %+v", p.Regions)
	}
	if p.RTTms[0][1] != 70 || p.RTTms[1][0] != 70 || !math.IsInf(p.RTTms[0][2], 1) || !math.IsInf(p.RTTms[2][1], 1) {
		t.Errorf("rtt %v", p.RTTms)
	}
}

func TestParseInputErrors(t *testing.T) {
	region := func(extra string) string {
		return `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3` + extra + `}]}`
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", ``, "not valid JSON"},
		{"syntax", `{"regions": [}`, "not valid JSON"},
		{"NaN", `{"regions": [{"name": "a", "demand_rps": NaN, "capacity_rps": 2, "engine_latency_ms": 3}]}`, "not valid JSON"},
		{"too large", `{"regions": [` + strings.Repeat(" ", MaxInputBytes) + `]}`, "larger than 16777216 bytes"},
		{"not an object", `[1, 2]`, "want a JSON object"},
		{"null", `null`, "want a JSON object"},
		{"trailing data", region("") + ` {}`, "more than one value"},
		{"unknown field", `{"regions": [], "headroom": 0.9, "extra": 1}`, `unknown field "extra"`},
		{"field case", `{"Headroom": 0.9}`, `unknown field "Headroom"`},
		{"duplicate top key", `{"headroom": 0.9, "headroom": 0.8}`, `input: duplicate key "headroom"`},
		{"duplicate rtt key", `{"rtt_ms": {"a": {"b": 1, "b": 2}}}`, `rtt_ms.a: duplicate key "b"`},
		{"missing regions", `{"headroom": 0.9}`, "regions: missing"},
		{"empty regions", `{"regions": []}`, "regions: empty"},
		{"regions not array", `{"regions": {"a": 1}}`, "regions: want an array of regions, got an object"},
		{"region not object", `{"regions": [3]}`, "regions[0]: want an object"},
		{"unknown region field", region(`, "gpu": 8`), `regions[0]: unknown field "gpu"`},
		{"missing name", `{"regions": [{"demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, "regions[0].name: missing"},
		{"empty name", `{"regions": [{"name": "", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, `regions[0].name "": empty`},
		{"name with space", `{"regions": [{"name": "a b", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, "use printable characters without spaces"},
		{"name not string", `{"regions": [{"name": 7, "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, "regions[0].name: want a string, got a number"},
		{"name too long", `{"regions": [{"name": "` + strings.Repeat("x", MaxRegionNameBytes+1) + `", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, "longer than 128 bytes"},
		{"duplicate region", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}, {"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, `regions[1].name "a": duplicate of regions[0]`},
		{"negative demand", `{"regions": [{"name": "a", "demand_rps": -1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, `regions[0] ("a").demand_rps = -1`},
		{"missing capacity", `{"regions": [{"name": "a", "demand_rps": 1, "engine_latency_ms": 3}]}`, `regions[0] ("a").capacity_rps: missing`},
		{"string latency", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": "3"}]}`, `regions[0] ("a").engine_latency_ms: want a number, got a string`},
		{"null demand", `{"regions": [{"name": "a", "demand_rps": null, "capacity_rps": 2, "engine_latency_ms": 3}]}`, `demand_rps: want a number, got null`},
		{"zero latency", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 0}]}`, `engine_latency_ms = 0`},
		{"huge number", `{"regions": [{"name": "a", "demand_rps": 1e999, "capacity_rps": 2, "engine_latency_ms": 3}]}`, `demand_rps: 1e999 is out of range`},
		{"too much demand", `{"regions": [{"name": "a", "demand_rps": 2e9, "capacity_rps": 2, "engine_latency_ms": 3}]}`, `demand_rps = 2e+09`},
		{"latency above penalty", `{"shed_penalty_ms": 100, "regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 300}]}`, "must be below shed_penalty_ms"},
		{"down not bool", region(`, "down": "yes"`), `regions[0] ("a").down: want true or false, got a string`},
		{"headroom 0", `{"headroom": 0, "regions": []}`, "headroom = 0: want 0 < headroom ≤ 1"},
		{"headroom 1.5", `{"headroom": 1.5}`, "headroom = 1.5"},
		{"headroom string", `{"headroom": "0.9"}`, "headroom: want a number, got a string"},
		{"k below 1", `{"k": 0.5}`, "k = 0.5: want 1 ≤ k ≤ 64"},
		{"negative beta", `{"beta": -1}`, "beta = -1"},
		{"rtt not object", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": [1]}`, "rtt_ms: want an object of objects"},
		{"rtt unknown source", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": {"x": {"a": 1}}}`, `rtt_ms.x: unknown region "x"`},
		{"rtt unknown destination", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": {"a": {"y": 1}}}`, `rtt_ms.a.y: unknown region "y"`},
		{"rtt inner null", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": {"a": null}}`, `rtt_ms.a: want an object of RTTs by region, got null`},
		{"rtt to itself", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": {"a": {"a": 5}}}`, "rtt_ms.a.a = 5: the RTT of a region to itself is 0"},
		{"rtt negative", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}, {"name": "b", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": {"a": {"b": -5}}}`, "rtt_ms.a.b = -5"},
		{"rtt both ways differ", `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}, {"name": "b", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": {"a": {"b": 5}, "b": {"a": 6}}}`, "rtt_ms.b.a = 6 but rtt_ms.a.b = 5: RTT is symmetric"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadInput(strings.NewReader(tc.in))
			if err == nil {
				t.Fatalf("accepted %s", tc.in)
			}
			if !errors.Is(err, ErrInvalidInput) {
				t.Errorf("error %v does not match ErrInvalidInput", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if strings.HasPrefix(err.Error(), "optimize:") {
				t.Errorf("error %q: the message is the field's, without a package prefix", err)
			}
		})
	}
	// Both directions with the same value are fine.
	same := `{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}, {"name": "b", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3}], "rtt_ms": {"a": {"b": 5}, "b": {"a": 5}}}`
	if _, err := ParseInput([]byte(same)); err != nil {
		t.Errorf("a pair given both ways with one value: %v", err)
	}
}

// A reader's own error comes back as it is, not as invalid input.
func TestReadInputReaderError(t *testing.T) {
	boom := errors.New("disk on fire")
	_, err := ReadInput(iotest.ErrReader(boom))
	if !errors.Is(err, boom) || errors.Is(err, ErrInvalidInput) {
		t.Errorf("error %v, want the reader's", err)
	}
}

// FuzzParseInput feeds arbitrary bytes to the input parser: it must
// refuse or accept, never panic, and whatever it accepts must validate,
// solve and report rows adding up to 1.
func FuzzParseInput(f *testing.F) {
	f.Add([]byte(workedExampleJSON("0.9")))
	f.Add([]byte(workedExampleJSON("1")))
	f.Add([]byte(`{"regions": [{"name": "a", "demand_rps": 1, "capacity_rps": 2, "engine_latency_ms": 3, "down": true}], "rtt_ms": {}}`))
	f.Add([]byte(`{"rtt_ms": {"a": {"b": 1, "b": 2}}}`))
	f.Add([]byte(`{"headroom": 1e999, "k": "4", "regions": null}`))
	f.Add([]byte(`[{"a": [1, {"b": [2, {"c": 3}]}]}]`))
	f.Add([]byte(`{"regions": [{"name": "\u00e9\t", "demand_rps": 0}]} x`))
	f.Add([]byte(slicedJSON))
	f.Add([]byte(`{"regions": [{"name": "a", "demand_rps": 3, "capacity_rps": 2, "engine_latency_ms": 3, "demand": [{"rps": 1, "criticality": "sheddable", "allowed_regions": ["a"]}, {"rps": 2}]}]}`))
	f.Add([]byte(`{"regions": [{"name": "a", "capacity_rps": 2, "engine_latency_ms": 3, "demand": [{"rps": -1, "criticality": "x", "allowed_regions": ["b", "a", "a"]}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := ParseSlicedInput(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("error %v does not match ErrInvalidInput", err)
			}
			return
		}
		p := in.Problem
		sp, err := SolveSlices(p, in.Slices, 0)
		if err != nil {
			t.Fatalf("SolveSlices on accepted input: %v", err)
		}
		checkSlicePlan(t, p, in.Slices, sp)
		if _, err := json.Marshal(NewSliceReport(p, in.Slices, sp, "local-first", nil)); err != nil {
			t.Fatalf("slice report does not encode: %v", err)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("accepted input fails Validate: %v", err)
		}
		p.MaxIterations = 100
		pl, err := Solve(p)
		if err != nil {
			t.Fatalf("Solve: %v", err)
		}
		out := NewReport(p, pl, "latency", nil)
		for i, r := range p.Regions {
			if r.Down {
				continue
			}
			units := math.Round(out.Shed[r.Name] / ShareUnit)
			for _, f := range out.Fractions[r.Name] {
				units += math.Round(f / ShareUnit)
			}
			if units != 1/ShareUnit {
				t.Fatalf("row %d (%s) reports %v units", i, r.Name, units)
			}
		}
		if _, err := json.Marshal(out); err != nil {
			t.Fatalf("report does not encode: %v", err)
		}
	})
}
