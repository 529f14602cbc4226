package global

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
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

// dampToward spreads a change over cycles, never sheds more than the
// target, and takes the target outright when the mix is not a valid plan.
func TestDampToward(t *testing.T) {
	prob := optimize.Problem{
		Regions: []optimize.Region{{Name: "a", DemandRPS: 95, CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "b", DemandRPS: 10, CapacityRPS: 100, EngineLatencyMs: 300}},
		RTTms: [][]float64{{0, 20}, {20, 0}}, Headroom: 0.9,
	}
	target, err := optimize.SolveLocalFirst(prob, 0)
	if err != nil {
		t.Fatal(err)
	}
	home := optimize.Plan{Fractions: [][]float64{{1, 0}, {0, 1}}, Shed: []float64{0, 0}}
	// Home-only at 95 rps loads a past c·h = 90: not a valid plan, so
	// nothing of it is kept.
	if got := dampToward(prob, home, target, 0.5); got.Fractions[0][1] != target.Fractions[0][1] {
		t.Errorf("invalid mix kept: a→b %v, want the target's %v", got.Fractions[0][1], target.Fractions[0][1])
	}
	prob.Regions[0].DemandRPS = 88
	target, _ = optimize.SolveLocalFirstFills(prob, []float64{0.9, 0.9})
	got := dampToward(prob, home, target, 0.5)
	if want := target.Fractions[0][1] / 2; target.Fractions[0][1] == 0 || math.Abs(got.Fractions[0][1]-want) > 1e-12 {
		t.Errorf("a→b %v, want half of the target's %v", got.Fractions[0][1], target.Fractions[0][1])
	}
	shedding := optimize.Plan{Fractions: [][]float64{{0.9, 0}, {0, 1}}, Shed: []float64{0.1, 0}}
	if got := dampToward(prob, shedding, target, 0.5); got.Shed[0] != target.Shed[0] {
		t.Errorf("damped shed %v, want the target's %v (never more)", got.Shed[0], target.Shed[0])
	}
}
