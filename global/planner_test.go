package global

import (
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/reqclass"
)

// A region near its local-fill threshold does not flap: once home-only it
// starts spilling only above the raised threshold, and once spilling it
// stops only below the plain one.
func TestPlannerLocalFillHysteresis(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sum := func(region, peer string, demand float64) received {
		return received{at: now, s: &isobarpb.RegionSummary{
			Region: region, Incarnation: "x", Sequence: 1, At: timestamppb.New(now), IngressAddress: "10.0.0.1:10001",
			Models: []*isobarpb.ModelSummary{{Model: "m", CellsReady: 10, CapacityRps: 100, DemandRps: demand, EngineLatencyMs: 300}},
			Rtt:    []*isobarpb.PeerRTT{{Region: peer, RttMs: 20}},
		}}
	}
	// share is a's fraction kept home in a plan for a's demand d.
	run := func(pl *planner, d float64) float64 {
		plan, _ := pl.plan(now, map[string]received{"a": sum("a", "b", d), "b": sum("b", "a", 10)}, time.Minute, time.Minute)
		for _, mp := range plan.GetPlans() {
			if mp.GetIngressRegion() == "a" {
				for _, r := range mp.GetRoutes() {
					if r.GetDestination() == "a" {
						return r.GetFraction()
					}
				}
				return 0
			}
		}
		t.Fatal("no plan for a")
		return 0
	}
	cfg := PlanConfig{Headroom: 0.9, Beta: 0.1, K: 4, ShedPenaltyMs: 10_000, DampStep: 1, LocalFill: 0.9, LocalFillBand: 0.05}
	// Local fill 0.9·100·0.9 = 81 rps plain, 0.95·100·0.9 = 85.5 raised;
	// the excess stays home while home's marginal latency is under b's
	// plus the 20 ms RTT, so a spills from about 85.3 rps with the plain
	// fill and from about 87.7 rps with the raised one.
	steps := []struct {
		demand float64
		home   bool
	}{
		{80, true},    // under both
		{86.5, true},  // a was home: the raised fill keeps it home
		{90, false},   // above both: spills
		{86.5, false}, // a was spilling: the plain fill, so it keeps spilling
		{80, true},    // home again
		{86.5, true},
	}
	pl := newPlanner(cfg)
	for _, s := range steps {
		f := run(pl, s.demand)
		if home := f == 1; home != s.home {
			t.Errorf("demand %v: a keeps %v home, want home-only %v", s.demand, f, s.home)
		}
	}
	// Without the band, 86.5 rps spills at once.
	cfg.LocalFillBand = -1
	if f := run(newPlanner(cfg), 86.5); f == 1 {
		t.Errorf("no band: demand 86.5 kept wholly home")
	}
}

// dampToward is the damping of the plans before demand slices (one row
// per region), kept as the reference dampSlices must reproduce.
func dampToward(prob optimize.Problem, prev, target optimize.Plan, step float64) optimize.Plan {
	n := len(target.Fractions)
	mixed := optimize.Plan{Fractions: make([][]float64, n), Shed: make([]float64, n), Load: make([]float64, n)}
	near := true
	for i := range n {
		mixed.Fractions[i] = make([]float64, n)
		for j := range n {
			mixed.Fractions[i][j] = prev.Fractions[i][j] + step*(target.Fractions[i][j]-prev.Fractions[i][j])
			near = near && math.Abs(mixed.Fractions[i][j]-target.Fractions[i][j]) < minRoute
		}
		mixed.Shed[i] = prev.Shed[i] + step*(target.Shed[i]-prev.Shed[i])
		if mixed.Shed[i] > target.Shed[i]+minRoute {
			return target
		}
		near = near && math.Abs(mixed.Shed[i]-target.Shed[i]) < minRoute
	}
	if near {
		return target
	}
	cost := optimize.Cost(prob, mixed)
	if math.IsInf(cost, 0) || math.IsNaN(cost) {
		return target
	}
	mixed.CostMs = cost
	for i := range n {
		for j := range n {
			mixed.Load[j] += mixed.Fractions[i][j] * prob.Regions[i].DemandRPS
		}
	}
	return mixed
}

// rowsFor wraps a per-region plan as one unsliced slice per region.
func rowsFor(live []string, pl optimize.Plan) ([]planSlice, sliceRows) {
	ps := make([]planSlice, len(live))
	rows := sliceRows{keys: make([]string, len(live)), fr: pl.Fractions, shed: pl.Shed, agg: pl}
	for i := range live {
		ps[i] = planSlice{region: i, crit: reqclass.Standard}
		rows.keys[i] = ps[i].key(live)
	}
	return ps, rows
}

// dampSlices spreads a change over cycles, never sheds more than the
// target, and takes the target outright when the mix is not a valid plan.
func TestDampSlices(t *testing.T) {
	live := []string{"a", "b"}
	prob := optimize.Problem{
		Regions: []optimize.Region{{Name: "a", DemandRPS: 95, CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "b", DemandRPS: 10, CapacityRPS: 100, EngineLatencyMs: 300}},
		RTTms: [][]float64{{0, 20}, {20, 0}}, Headroom: 0.9,
	}
	damp := func(prev, target optimize.Plan) optimize.Plan {
		ps, tr := rowsFor(live, target)
		for k := range ps {
			ps[k].rps = prob.Regions[k].DemandRPS
		}
		_, pr := rowsFor(live, prev)
		got := dampSlices(prob, ps, pr, tr, 0.5)
		if want := dampToward(prob, prev, target, 0.5); !plansEqual(got.agg, want) {
			t.Errorf("dampSlices %v, the damping before slices %v", got.agg, want)
		}
		return got.agg
	}
	target, err := optimize.SolveLocalFirst(prob, 0)
	if err != nil {
		t.Fatal(err)
	}
	home := optimize.Plan{Fractions: [][]float64{{1, 0}, {0, 1}}, Shed: []float64{0, 0}}
	// Home-only at 95 rps loads a past c·h = 90: not a valid plan, so
	// nothing of it is kept.
	if got := damp(home, target); got.Fractions[0][1] != target.Fractions[0][1] {
		t.Errorf("invalid mix kept: a→b %v, want the target's %v", got.Fractions[0][1], target.Fractions[0][1])
	}
	prob.Regions[0].DemandRPS = 88
	target, _ = optimize.SolveLocalFirstFills(prob, []float64{0.9, 0.9})
	got := damp(home, target)
	if want := target.Fractions[0][1] / 2; target.Fractions[0][1] == 0 || math.Abs(got.Fractions[0][1]-want) > 1e-12 {
		t.Errorf("a→b %v, want half of the target's %v", got.Fractions[0][1], target.Fractions[0][1])
	}
	shedding := optimize.Plan{Fractions: [][]float64{{0.9, 0}, {0, 1}}, Shed: []float64{0.1, 0}}
	if got := damp(shedding, target); got.Shed[0] != target.Shed[0] {
		t.Errorf("damped shed %v, want the target's %v (never more)", got.Shed[0], target.Shed[0])
	}
}

func plansEqual(a, b optimize.Plan) bool {
	if len(a.Fractions) != len(b.Fractions) || a.CostMs != b.CostMs {
		return false
	}
	for i := range a.Fractions {
		if !slices.Equal(a.Fractions[i], b.Fractions[i]) || a.Shed[i] != b.Shed[i] || a.Load[i] != b.Load[i] {
			return false
		}
	}
	return true
}
