package optimize

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

const slicedJSON = `{"regions": [
  {"name": "a", "capacity_rps": 100, "engine_latency_ms": 300,
   "demand": [{"rps": 30, "criticality": "critical", "allowed_regions": ["a"]},
              {"rps": 60}, {"rps": 70, "criticality": "sheddable"}]},
  {"name": "b", "demand_rps": 20, "capacity_rps": 50, "engine_latency_ms": 300},
  {"name": "c", "demand_rps": 10, "capacity_rps": 50, "engine_latency_ms": 300,
   "demand": [{"rps": 4, "allowed_regions": ["c", "b"]}, {"rps": 6, "criticality": "standard"}]}],
 "rtt_ms": {"a": {"b": 20, "c": 40}, "b": {"c": 30}}}`

func TestParseSlicedInput(t *testing.T) {
	in, err := ParseSlicedInput([]byte(slicedJSON))
	if err != nil {
		t.Fatal(err)
	}
	want := []Slice{
		{Source: 0, Band: 0, RPS: 30, Allowed: []int{0}},
		{Source: 0, Band: 1, RPS: 60},
		{Source: 0, Band: 2, RPS: 70},
		{Source: 1, Band: 1, RPS: 20},
		{Source: 2, Band: 1, RPS: 4, Allowed: []int{2, 1}},
		{Source: 2, Band: 1, RPS: 6},
	}
	if !in.Sliced || len(in.Slices) != len(want) {
		t.Fatalf("slices %+v, want %+v", in.Slices, want)
	}
	for k := range want {
		g, w := in.Slices[k], want[k]
		if g.Source != w.Source || g.Band != w.Band || g.RPS != w.RPS || !slices.Equal(g.Allowed, w.Allowed) || (g.Allowed == nil) != (w.Allowed == nil) {
			t.Errorf("slice %d = %+v, want %+v", k, g, w)
		}
	}
	if d := in.Problem.Regions[0].DemandRPS; d != 160 {
		t.Errorf("region a demand %v, want the slices' sum 160", d)
	}
	// ParseInput reads the same file as one number per region.
	p, err := ParseInput([]byte(slicedJSON))
	if err != nil || p.Regions[0].DemandRPS != 160 {
		t.Fatalf("ParseInput: %v, demand %v", err, p.Regions[0].DemandRPS)
	}
	// Today's input: one standard slice per region, not sliced.
	plain, err := ParseSlicedInput([]byte(workedExampleJSON("0.9")))
	if err != nil || plain.Sliced || len(plain.Slices) != 3 || plain.Slices[1].RPS != 120 || plain.Slices[1].Band != DefaultBand {
		t.Fatalf("worked example: %+v, %v", plain.Slices, err)
	}
}

func TestParseSlicedInputErrors(t *testing.T) {
	region := func(extra string) string {
		return `{"regions": [{"name": "a", "capacity_rps": 2, "engine_latency_ms": 3` + extra + `}]}`
	}
	for _, tc := range []struct{ name, in, want string }{
		{"neither", region(``), `regions[0] ("a").demand_rps: missing`},
		{"not a list", region(`, "demand": {"rps": 1}`), `regions[0] ("a").demand: want an array of slices`},
		{"slice not object", region(`, "demand": [1]`), `regions[0] ("a").demand[0]: want an object`},
		{"unknown field", region(`, "demand": [{"rps": 1, "tenant": "x"}]`), `demand[0]: unknown field "tenant"`},
		{"missing rps", region(`, "demand": [{"criticality": "critical"}]`), `demand[0].rps: missing`},
		{"negative rps", region(`, "demand": [{"rps": 1}, {"rps": -2}]`), `regions[0] ("a").demand[1].rps = -2`},
		{"rps string", region(`, "demand": [{"rps": "2"}]`), `demand[0].rps: want a number`},
		{"unknown criticality", region(`, "demand": [{"rps": 1, "criticality": "urgent"}]`), `demand[0].criticality "urgent": unknown (known: critical, standard, sheddable)`},
		{"criticality number", region(`, "demand": [{"rps": 1, "criticality": 0}]`), `demand[0].criticality: want a string`},
		{"unknown allowed", region(`, "demand": [{"rps": 1, "allowed_regions": ["a", "x"]}]`), `regions[0] ("a").demand[0].allowed_regions[1]: unknown region "x"`},
		{"empty allowed", region(`, "demand": [{"rps": 1, "allowed_regions": []}]`), `allowed_regions: empty`},
		{"allowed twice", region(`, "demand": [{"rps": 1, "allowed_regions": ["a", "a"]}]`), `allowed_regions[1]: region "a" listed twice`},
		{"allowed not list", region(`, "demand": [{"rps": 1, "allowed_regions": "a"}]`), `allowed_regions: want an array`},
		{"disagree", region(`, "demand_rps": 5, "demand": [{"rps": 1}]`), `demand_rps = 5 but its demand slices add up to 1`},
		{"too many", region(`, "demand": [` + strings.TrimSuffix(strings.Repeat(`{"rps": 1},`, MaxInputSlices+1), ",") + `]`), `65 slices, at most 64`},
		{"sum too large", region(`, "demand": [{"rps": 1e9}, {"rps": 1e9}]`), `add up to 2e+09 rps`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSlicedInput([]byte(tc.in))
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalidInput containing %q", err, tc.want)
			}
		})
	}
	// Both given and agreeing is fine.
	if _, err := ParseSlicedInput([]byte(region(`, "demand_rps": 3, "demand": [{"rps": 1}, {"rps": 2}]`))); err != nil {
		t.Errorf("agreeing demand_rps and demand: %v", err)
	}
}

func TestNewSliceReport(t *testing.T) {
	in, err := ParseSlicedInput([]byte(slicedJSON))
	if err != nil {
		t.Fatal(err)
	}
	sp, err := SolveSlices(in.Problem, in.Slices, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := NewSliceReport(in.Problem, in.Slices, sp, "local-first", nil)
	a := out.Slices["a"]
	if len(a) != 3 || a[0].Criticality != "critical" || !slices.Equal(a[0].AllowedRegions, []string{"a"}) || a[1].AllowedRegions != nil {
		t.Fatalf("slices of a: %+v", a)
	}
	by := out.ShedByCriticality["a"]
	if len(by) != 3 || by["critical"] != 0 || by["standard"] != 0 || by["sheddable"] <= 0 {
		t.Errorf("a's shed by criticality %v: want sheddable only", by)
	}
	for src, list := range out.Slices {
		for k, s := range list {
			units := math.Round(s.ShedRPS / math.Max(s.RPS, 1e-12) / ShareUnit)
			for _, f := range s.Fractions {
				units += math.Round(f / ShareUnit)
			}
			if s.RPS > 0 && math.Abs(units-1/ShareUnit) > 2 {
				t.Errorf("%s slice %d: shares add up to %v units", src, k, units)
			}
			if s.AllowedRegions != nil {
				for dst := range s.Fractions {
					if !slices.Contains(s.AllowedRegions, dst) {
						t.Errorf("%s slice %d routed to %s outside %v", src, k, dst, s.AllowedRegions)
					}
				}
			}
		}
	}
}
