package optimize

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// threeRegions is the docs/design.md §5.2 worked example: demand A 90, B 120,
// C 40 rps; capacity A 100, B 100, C 80 rps; L0 300 ms each; RTT A–B 20,
// B–C 30, A–C 60 ms.
func threeRegions(headroom float64) Problem {
	return Problem{
		Regions: []Region{
			{Name: "a", DemandRPS: 90, CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "b", DemandRPS: 120, CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "c", DemandRPS: 40, CapacityRPS: 80, EngineLatencyMs: 300},
		},
		RTTms:    [][]float64{{0, 20, 60}, {20, 0, 30}, {60, 30, 0}},
		Headroom: headroom,
	}
}

func TestValidate(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name string
		edit func(*Problem)
		want string // substring of the error; "" means valid
	}{
		{"worked example", func(*Problem) {}, ""},
		{"defaults applied", func(p *Problem) { p.Headroom, p.Beta, p.K, p.ShedPenaltyMs = 0, 0, 0, 0 }, ""},
		{"unreachable pair", func(p *Problem) { p.RTTms[0][2], p.RTTms[2][0] = inf, inf }, ""},
		{"zero capacity and zero demand", func(p *Problem) { p.Regions[2].CapacityRPS, p.Regions[2].DemandRPS = 0, 0 }, ""},
		{"no regions", func(p *Problem) { p.Regions, p.RTTms = nil, nil }, "Regions is empty"},
		{"headroom above 1", func(p *Problem) { p.Headroom = 1.5 }, "Headroom = 1.5"},
		{"negative headroom", func(p *Problem) { p.Headroom = -0.1 }, "Headroom"},
		{"NaN headroom", func(p *Problem) { p.Headroom = math.NaN() }, "Headroom"},
		{"negative beta", func(p *Problem) { p.Beta = -1 }, "Beta"},
		{"tiny headroom", func(p *Problem) { p.Headroom = 1e-9 }, "Headroom = 1e-09"},
		{"subnormal capacity counts as 0", func(p *Problem) { p.Regions[1].CapacityRPS = 1e-317 }, ""},
		{"tiny demand counts as 0", func(p *Problem) { p.Regions[1].DemandRPS = 1e-9 }, ""},
		{"tiny latency counts as MinValue", func(p *Problem) { p.Regions[1].EngineLatencyMs = 1e-300 }, ""},
		{"k below 1", func(p *Problem) { p.K = 0.5 }, "K = 0.5"},
		{"k too large", func(p *Problem) { p.K = 100 }, "K = 100"},
		{"negative penalty", func(p *Problem) { p.ShedPenaltyMs = -5 }, "ShedPenaltyMs"},
		{"penalty below latency", func(p *Problem) { p.ShedPenaltyMs = 200 }, `region "a": EngineLatencyMs = 300 is not below ShedPenaltyMs = 200`},
		{"tolerance above 1", func(p *Problem) { p.Tolerance = 2 }, "Tolerance"},
		{"negative iterations", func(p *Problem) { p.MaxIterations = -1 }, "MaxIterations"},
		{"empty name", func(p *Problem) { p.Regions[1].Name = "" }, "Regions[1].Name is empty"},
		{"duplicate name", func(p *Problem) { p.Regions[2].Name = "a" }, `Regions[2].Name "a" duplicates Regions[0]`},
		{"negative demand", func(p *Problem) { p.Regions[1].DemandRPS = -1 }, `region "b": DemandRPS = -1`},
		{"NaN demand", func(p *Problem) { p.Regions[1].DemandRPS = math.NaN() }, `region "b": DemandRPS = NaN`},
		{"infinite capacity", func(p *Problem) { p.Regions[0].CapacityRPS = inf }, `region "a": CapacityRPS = +Inf`},
		{"huge demand", func(p *Problem) { p.Regions[0].DemandRPS = 2e9 }, `DemandRPS = 2e+09`},
		{"zero latency", func(p *Problem) { p.Regions[2].EngineLatencyMs = 0 }, `region "c": EngineLatencyMs = 0`},
		{"negative capacity", func(p *Problem) { p.Regions[2].CapacityRPS = -3 }, `region "c": CapacityRPS = -3`},
		{"missing RTT row", func(p *Problem) { p.RTTms = p.RTTms[:2] }, "RTTms has 2 rows"},
		{"short RTT row", func(p *Problem) { p.RTTms[1] = p.RTTms[1][:2] }, `RTTms[1] (region "b") has 2 entries`},
		{"self RTT", func(p *Problem) { p.RTTms[1][1] = 3 }, `RTTms[1][1] ("b" to itself) = 3`},
		{"negative RTT", func(p *Problem) { p.RTTms[0][1], p.RTTms[1][0] = -2, -2 }, `RTTms[0][1] ("a" to "b") = -2`},
		{"NaN RTT", func(p *Problem) { p.RTTms[0][1] = math.NaN() }, `RTTms[0][1] ("a" to "b") = NaN`},
		{"-Inf RTT", func(p *Problem) { p.RTTms[0][1], p.RTTms[1][0] = math.Inf(-1), math.Inf(-1) }, `= -Inf`},
		{"asymmetric RTT", func(p *Problem) { p.RTTms[0][1] = 25 }, `RTTms[0][1] ("a" to "b") = 25 but RTTms[1][0] = 20`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := threeRegions(0.9)
			tc.edit(&p)
			err := p.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				solve(t, p)
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted the problem; want an error containing %q", tc.want)
			}
			if !errors.Is(err, ErrInvalidProblem) {
				t.Errorf("error %v does not wrap ErrInvalidProblem", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if _, serr := Solve(p); !errors.Is(serr, ErrInvalidProblem) {
				t.Errorf("Solve error = %v, want one wrapping ErrInvalidProblem", serr)
			}
		})
	}
}

func TestValidateRegionLimit(t *testing.T) {
	n := MaxRegions + 1
	p := Problem{Regions: make([]Region, n)}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("Validate with %d regions = %v, want a limit error", n, err)
	}
}

// TestValidateRTTScan plants one bad RTT entry at random places of
// matrices that span several of Validate's tiles: each must be found and
// named, and a matrix without one must pass.
func TestValidateRTTScan(t *testing.T) {
	rng := newRand(7, 7)
	bad := []struct {
		v    float64
		want string
	}{
		{math.NaN(), "= NaN"}, {-1, "= -1"}, {2 * MaxValue, "want 0 ≤ rtt"}, {math.Inf(-1), "= -Inf"},
	}
	for round := range 200 {
		n := 1 + rng.IntN(150)
		p := randomProblem(rng, n)
		if err := p.Validate(); err != nil {
			t.Fatalf("n=%d: valid problem refused: %v", n, err)
		}
		i, j := rng.IntN(n), rng.IntN(n)
		var want string
		switch k := round % 6; {
		case i == j || k == 4: // the diagonal
			p.RTTms[i][i] = 1
			want = "to itself) = 1"
		case k == 5: // asymmetric
			p.RTTms[i][j] += 0.5
			lo, hi := min(i, j), max(i, j)
			want = "RTTms[" + strconv.Itoa(lo) + "][" + strconv.Itoa(hi) + "]"
		default: // out of range, on both sides or one
			b := bad[k]
			p.RTTms[i][j] = b.v
			if rng.IntN(2) == 0 {
				p.RTTms[j][i] = b.v
				i, j = min(i, j), max(i, j)
			}
			want = b.want
		}
		err := p.Validate()
		if err == nil || !errors.Is(err, ErrInvalidProblem) || !strings.Contains(err.Error(), want) {
			t.Fatalf("n=%d, entry (%d, %d): Validate = %v, want an error containing %q", n, i, j, err, want)
		}
	}
}
