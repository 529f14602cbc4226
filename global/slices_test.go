package global

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

var sliceNow = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	pbCritical  = isobarpb.Criticality_CRITICALITY_CRITICAL
	pbStandard  = isobarpb.Criticality_CRITICALITY_STANDARD
	pbSheddable = isobarpb.Criticality_CRITICALITY_SHEDDABLE
)

// sliceSummary is region's summary for model "m": capacity, demand and
// its slices (nil: none), RTT 20 ms to every peer.
func sliceSummary(region string, peers []string, capacity, demand float64, ds ...*isobarpb.DemandSlice) received {
	var rtt []*isobarpb.PeerRTT
	for _, p := range peers {
		if p != region {
			rtt = append(rtt, &isobarpb.PeerRTT{Region: p, RttMs: 20})
		}
	}
	return received{at: sliceNow, s: &isobarpb.RegionSummary{
		Region: region, Incarnation: "x", Sequence: 1, At: timestamppb.New(sliceNow), IngressAddress: "10.0.0.1:10001",
		Models: []*isobarpb.ModelSummary{{Model: "m", CellsReady: 10, CapacityRps: capacity, DemandRps: demand, EngineLatencyMs: 300, DemandSlices: ds}},
		Rtt:    rtt,
	}}
}

func slice(c isobarpb.Criticality, rps float64, allowed ...string) *isobarpb.DemandSlice {
	return &isobarpb.DemandSlice{Criticality: c, Rps: rps, AllowedRegions: allowed}
}

func planFor(t *testing.T, plan *isobarpb.RoutingPlan, ingress string) *isobarpb.ModelPlan {
	t.Helper()
	for _, mp := range plan.GetPlans() {
		if mp.GetIngressRegion() == ingress {
			return mp
		}
	}
	t.Fatalf("no plan for %s", ingress)
	return nil
}

func sliceOf(t *testing.T, mp *isobarpb.ModelPlan, c isobarpb.Criticality, allowed ...string) *isobarpb.SlicePlan {
	t.Helper()
	for _, s := range mp.GetSlices() {
		if s.GetCriticality() == c && slices.Equal(s.GetAllowedRegions(), allowed) {
			return s
		}
	}
	t.Fatalf("plan for %s has no slice %v %v: %v", mp.GetIngressRegion(), c, allowed, mp.GetSlices())
	return nil
}

var testPlanConfig = PlanConfig{Headroom: 0.9, Beta: 0.1, K: 4, ShedPenaltyMs: 10_000, DampStep: 0.5, LocalFill: 0.9, LocalFillBand: 0.05}

// Under a shortfall the plan sheds sheddable demand first; critical and
// standard lose nothing, and routes/shed stay the standard slice's.
func TestPlannerShedsSheddableFirst(t *testing.T) {
	regions := []string{"a", "b"}
	sums := map[string]received{
		"a": sliceSummary("a", regions, 100, 160, slice(pbCritical, 30), slice(pbStandard, 60), slice(pbSheddable, 70)),
		"b": sliceSummary("b", regions, 50, 20),
	}
	plan, _ := newPlanner(testPlanConfig).plan(sliceNow, sums, time.Minute, time.Minute)
	a := planFor(t, plan, "a")
	if s := sliceOf(t, a, pbCritical).GetShed(); s != 0 {
		t.Errorf("critical shed %v, want 0", s)
	}
	std := sliceOf(t, a, pbStandard)
	if std.GetShed() != 0 {
		t.Errorf("standard shed %v, want 0", std.GetShed())
	}
	if s := sliceOf(t, a, pbSheddable).GetShed(); s < 0.3 {
		t.Errorf("sheddable shed %v, want it to absorb the shortfall (> 0.3)", s)
	}
	if !proto.Equal(&isobarpb.ModelPlan{Routes: a.GetRoutes(), Shed: a.GetShed()}, &isobarpb.ModelPlan{Routes: std.GetRoutes(), Shed: std.GetShed()}) {
		t.Errorf("routes/shed %v %v, want the standard slice's %v %v", a.GetRoutes(), a.GetShed(), std.GetRoutes(), std.GetShed())
	}
	if b := planFor(t, plan, "b"); len(b.GetSlices()) != 0 {
		t.Errorf("b's summary has no slices, its plan has %v", b.GetSlices())
	}
}

// A pinned slice's routes stay inside its regions, cycle after cycle of
// damping, while the unpinned demand spills; a pinned slice with no live
// region is shed whole and its unknown regions counted.
func TestPlannerPinnedSliceStaysInside(t *testing.T) {
	regions := []string{"eu-a", "eu-b", "us"}
	pl := newPlanner(testPlanConfig)
	for cycle, hot := range []float64{60, 150, 200, 150, 90, 200} {
		sums := map[string]received{
			"eu-a": sliceSummary("eu-a", regions, 100, hot+5,
				slice(pbStandard, hot*0.6, "eu-a", "eu-b"), slice(pbCritical, hot*0.2, "eu-a"), slice(pbStandard, hot*0.2),
				slice(pbStandard, 5, "gone", "zz")),
			"eu-b": sliceSummary("eu-b", regions, 30, 25),
			"us":   sliceSummary("us", regions, 300, 10),
		}
		plan, st := pl.plan(sliceNow, sums, time.Minute, time.Minute)
		if st.unknownAllowed != 2 {
			t.Errorf("cycle %d: %d unknown allowed regions counted, want 2", cycle, st.unknownAllowed)
		}
		mp := planFor(t, plan, "eu-a")
		for _, s := range mp.GetSlices() {
			sum := s.GetShed()
			for _, r := range s.GetRoutes() {
				sum += r.GetFraction()
				if len(s.GetAllowedRegions()) > 0 && !slices.Contains(s.GetAllowedRegions(), r.GetDestination()) {
					t.Fatalf("cycle %d (demand %v): slice %v routes %v to %s outside its regions", cycle, hot, s.GetAllowedRegions(), r.GetFraction(), r.GetDestination())
				}
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Errorf("cycle %d: slice %v adds up to %v", cycle, s.GetAllowedRegions(), sum)
			}
		}
		if gone := sliceOf(t, mp, pbStandard, "gone", "zz"); gone.GetShed() != 1 || len(gone.GetRoutes()) != 0 {
			t.Errorf("cycle %d: slice pinned to no live region %v, want shed whole", cycle, gone)
		}
		if hot >= 150 {
			if any := sliceOf(t, mp, pbStandard); !routesTo(any, "us") {
				t.Errorf("cycle %d (demand %v): the unpinned slice does not spill to us: %v", cycle, hot, any.GetRoutes())
			}
			if pinned := sliceOf(t, mp, pbStandard, "eu-a", "eu-b"); routesTo(pinned, "us") || pinned.GetShed() == 0 {
				t.Errorf("cycle %d (demand %v): the pinned slice %v: want it within the EU and shedding", cycle, hot, pinned)
			}
		}
	}
}

func routesTo(s *isobarpb.SlicePlan, dest string) bool {
	for _, r := range s.GetRoutes() {
		if r.GetDestination() == dest && r.GetFraction() > 0 {
			return true
		}
	}
	return false
}

// Summaries without slices give the plans of before: the local-first
// target damped toward the previous plan, region by region, cycle after
// cycle (a reference planner built from the earlier code).
func TestPlannerWithoutSlicesUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 25))
	regions := []string{"a", "b", "c", "d"}
	pl, ref := newPlanner(testPlanConfig), newPlanner(testPlanConfig)
	for cycle := range 30 {
		sums := map[string]received{}
		for k, r := range regions {
			sums[r] = sliceSummary(r, regions, 50+50*float64(k), (30+60*float64(k))*(0.3+rng.Float64()))
		}
		plan, _ := pl.plan(sliceNow, sums, time.Minute, time.Minute)
		live := slices.Clone(regions)
		prob := ref.problem("m", live, sums, rttMatrix(live, sums))
		target, err := optimize.SolveLocalFirstFills(prob, ref.fills("m", live))
		if err != nil {
			t.Fatal(err)
		}
		chosen := target
		demand := make([]float64, len(live))
		for i := range live {
			demand[i] = prob.Regions[i].DemandRPS
		}
		if prev, ok := ref.prev["m"]; ok && comparable(prev, live, demand) {
			chosen = dampToward(prob, prev.plan, target, testPlanConfig.DampStep)
		}
		ref.prev["m"] = prevPlan{regions: live, demand: demand, plan: chosen}
		for i, r := range live {
			want := modelPlan("m", r, live, chosen.Fractions[i], chosen.Shed[i])
			if got := planFor(t, plan, r); !proto.Equal(got, want) {
				t.Fatalf("cycle %d, %s: plan %v, before slices %v", cycle, r, got, want)
			}
		}
	}
}

// slicePlan never routes outside a slice's regions, whatever row it is
// given: such a share is shed, and a row left with nothing sheds whole
// rather than falling back home.
func TestSlicePlanGuardsResidency(t *testing.T) {
	live := []string{"a", "b", "c"}
	s := planSlice{region: 0, allowed: []string{"b", "c"}, at: []int{1, 2}}
	sp := slicePlan(s, live, []float64{0.5, 0.3, 0}, 0.2)
	if len(sp.GetRoutes()) != 1 || sp.GetRoutes()[0].GetDestination() != "b" || math.Abs(sp.GetShed()-0.7) > 1e-12 {
		t.Errorf("slice plan %v, want b 0.3 and the 0.5 outside shed (0.7)", sp)
	}
	if sp := slicePlan(s, live, []float64{0, 0, 0}, 0); sp.GetShed() != 1 || len(sp.GetRoutes()) != 0 {
		t.Errorf("empty row: %v, want shed whole", sp)
	}
}

// An ingress whose only demand is pinned to regions none of which is live
// still gets its slices, shed whole, never the route home.
func TestPlannerPinnedNowhere(t *testing.T) {
	regions := []string{"a", "b"}
	sums := map[string]received{
		"a": sliceSummary("a", regions, 100, 10, slice(pbCritical, 10, "eu-gone")),
		"b": sliceSummary("b", regions, 100, 20),
	}
	plan, st := newPlanner(testPlanConfig).plan(sliceNow, sums, time.Minute, time.Minute)
	if st.unknownAllowed != 1 {
		t.Errorf("%d unknown allowed regions counted, want 1", st.unknownAllowed)
	}
	s := sliceOf(t, planFor(t, plan, "a"), pbCritical, "eu-gone")
	if s.GetShed() != 1 || len(s.GetRoutes()) != 0 {
		t.Errorf("slice pinned to a region that is gone: %v, want shed whole", s)
	}
}
