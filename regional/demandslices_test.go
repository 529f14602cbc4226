package regional

import (
	"fmt"
	"github.com/isobar-mesh/isobar/summary"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/residency"
)

func sliceReport(slices ...*isobarpb.SliceDemand) *isobarpb.DataPlaneReport {
	return &isobarpb.DataPlaneReport{Node: "gw", Region: "r1", IntervalSeconds: 1,
		Demand: []*isobarpb.ModelDemand{{Model: "m", Requests: 100, Slices: slices}}}
}

// A data plane's slices are kept per (criticality, set); a set this
// controller does not define is counted and taken as standard unpinned,
// as are the requests the slices leave out; the summary reports the split
// by allowed regions, adding up to demand_rps.
func TestDemandSlicesInAndOut(t *testing.T) {
	f, s := residencyTestFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	rep := sliceReport(
		&isobarpb.SliceDemand{Criticality: isobarpb.Criticality_CRITICALITY_CRITICAL, Residency: "home", Requests: 20},
		&isobarpb.SliceDemand{Criticality: isobarpb.Criticality_CRITICALITY_STANDARD, Residency: "away", Requests: 30},
		&isobarpb.SliceDemand{Criticality: isobarpb.Criticality_CRITICALITY_SHEDDABLE, Requests: 10, Shed: 10},
		&isobarpb.SliceDemand{Criticality: isobarpb.Criticality_CRITICALITY_CRITICAL, Residency: "bogus", Requests: 15},
	)
	if err := validateReport(rep, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := f.reg.send(t.Context(), message{report: rep}); err != nil {
		t.Fatal(err)
	}
	v := f.waitView(func(v *View) bool { return v.DemandSlices["m"] != nil })
	want := map[SliceKey]float64{
		{reqclass.Critical, "home"}: 20, {reqclass.Standard, "away"}: 30, {reqclass.Sheddable, ""}: 10, unpinnedStandard: 40,
	}
	if got := v.DemandSlices["m"]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("slices %v, want %v", got, want)
	}
	if n := testutil.ToFloat64(f.m.slicesFolded.WithLabelValues("unknown_set")); n != 1 {
		t.Fatalf("unknown sets counted %v, want 1", n)
	}

	sm := s.summary.build(f.clock.Now())
	m := sm.GetModels()[0]
	if m.GetDemandRps() != 100 {
		t.Fatalf("demand %v", m.GetDemandRps())
	}
	wantOut := []string{"CRITICALITY_CRITICAL [r1 r3] 20", "CRITICALITY_STANDARD [] 40", "CRITICALITY_STANDARD [r2 r3] 30", "CRITICALITY_SHEDDABLE [] 10"}
	var sum float64
	for i, ds := range m.GetDemandSlices() {
		sum += ds.GetRps()
		if got := fmt.Sprintf("%s %v %.6g", ds.GetCriticality(), ds.GetAllowedRegions(), ds.GetRps()); i >= len(wantOut) || got != wantOut[i] {
			t.Errorf("slice %d: %s", i, got)
		}
	}
	if len(m.GetDemandSlices()) != len(wantOut) || math.Abs(sum-m.GetDemandRps()) > 1e-9 {
		t.Fatalf("slices %v add up to %v of %v", m.GetDemandSlices(), sum, m.GetDemandRps())
	}
}

// A report whose slices break the bounds is refused as a whole.
func TestDemandSlicesBounds(t *testing.T) {
	std := isobarpb.Criticality_CRITICALITY_STANDARD
	many := make([]*isobarpb.SliceDemand, maxReportSlices+1)
	for i := range many {
		many[i] = &isobarpb.SliceDemand{Criticality: std, Residency: fmt.Sprint("s", i), Requests: 1}
	}
	for name, rep := range map[string]*isobarpb.DataPlaneReport{
		"too many":        sliceReport(many...),
		"more than all":   sliceReport(&isobarpb.SliceDemand{Criticality: std, Requests: 60}, &isobarpb.SliceDemand{Requests: 41}),
		"shed above rate": sliceReport(&isobarpb.SliceDemand{Criticality: std, Requests: 1, Shed: 1 << 62}),
		"long set name":   sliceReport(&isobarpb.SliceDemand{Residency: string(make([]byte, 200)), Requests: 1}),
	} {
		if err := validateReport(rep, "r1"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A queued request may be refused in a later report than the one
	// that counted it: shed above the interval's requests is accepted.
	if err := validateReport(sliceReport(&isobarpb.SliceDemand{Criticality: std, Requests: 1, Shed: 2}), "r1"); err != nil {
		t.Errorf("shed of earlier requests refused: %v", err)
	}
	if err := validateReport(sliceReport(many[:maxReportSlices]...), "r1"); err != nil {
		t.Errorf("%d slices refused: %v", maxReportSlices, err)
	}
}

// More (criticality, regions) slices than a summary may carry: the
// summary keeps at most summary.MaxDemandSlices, adding up to demand_rps
// less the dropped ones' share; a combined set with no region in common
// is dropped from the demand, never planned as unpinned; all-standard
// demand gives no slices.
func TestSummarySlicesBounded(t *testing.T) {
	cfg := `{"sets": {"a": ["r1"], "b": ["r2"]`
	for i := range 12 {
		cfg += fmt.Sprintf(`, "s%d": ["r%d"]`, i, i)
	}
	rc, err := residency.Parse([]byte(cfg + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	split := map[SliceKey]float64{unpinnedStandard: 5}
	for i := range 12 {
		for _, c := range reqclass.All() {
			split[SliceKey{c, fmt.Sprint("s", i)}] = float64(1 + i)
		}
	}
	aggregate := func(split map[SliceKey]float64) *isobarpb.ModelSummary {
		return summary.Aggregate(summary.Input{Region: "r0", Demand: map[string]float64{"m": 50},
			DemandSlices: summarySlices(map[string]map[SliceKey]float64{"m": split}, rc)}).GetModels()[0]
	}
	ms := aggregate(split)
	var sum float64
	for _, d := range ms.GetDemandSlices() {
		sum += d.GetRps()
	}
	if n := len(ms.GetDemandSlices()); n != summary.MaxDemandSlices || math.Abs(sum-ms.GetDemandRps()) > 1e-9 || ms.GetDemandRps() >= 50 {
		t.Fatalf("%d slices adding up to %v of demand %v", n, sum, ms.GetDemandRps())
	}
	ms = aggregate(map[SliceKey]float64{unpinnedStandard: 5, {reqclass.Standard, "a+b"}: 5})
	if ms.GetDemandRps() != 25 || len(ms.GetDemandSlices()) != 0 && len(ms.GetDemandSlices()[0].GetAllowedRegions()) != 0 {
		t.Fatalf("nowhere slice: demand %v slices %v, want half the demand gone, nothing pinned", ms.GetDemandRps(), ms.GetDemandSlices())
	}
	if ms := aggregate(map[SliceKey]float64{unpinnedStandard: 3}); ms.GetDemandSlices() != nil {
		t.Fatal("slices for all-standard demand")
	}
}

// The retry budget follows the region's utilisation: full below the
// knee, the minimum near saturation, whole percent between; the gauge
// shows what was pushed. With StaticRetryBudget it stays static.
func TestRetryBudgetFollowsUtilisation(t *testing.T) {
	f := newRegFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	budget := func(want float64) func(xds.State) bool {
		return func(st xds.State) bool { return len(st.Models) == 1 && st.Models[0].RetryBudgetPercent == want }
	}
	for _, tc := range []struct{ util, want float64 }{{1, 1}, {(100.0/120 + 1) / 2, 11}, {0.1, 20}, {math.NaN(), 20}} {
		if err := f.reg.SetUtilisation(t.Context(), map[string]float64{"m": tc.util}); err != nil {
			t.Fatal(err)
		}
		if tc.want != 20 || tc.util == 0.1 {
			f.awaitState(fmt.Sprintf("budget %v at utilisation %v", tc.want, tc.util), budget(tc.want))
		}
		if g := testutil.ToFloat64(f.m.retryBudget.WithLabelValues("m")); g != tc.want {
			t.Fatalf("gauge %v at utilisation %v, want %v", g, tc.util, tc.want)
		}
	}

	fs := newLimitedFixture(t, func(c *Config) { c.StaticRetryBudget = true })
	fs.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	if err := fs.reg.SetUtilisation(t.Context(), map[string]float64{"m": 0.99}); err != nil {
		t.Fatal(err)
	}
	if err := fs.reg.SetRoutes(t.Context(), &RouteTable{Source: RoutesLocal}); err != nil {
		t.Fatal(err)
	}
	st := fs.awaitState("routes", func(st xds.State) bool { return len(st.Models) == 1 })
	for len(fs.push.pushed) > 0 {
		st = <-fs.push.pushed
	}
	if st.Models[0].RetryBudgetPercent != 0 || testutil.ToFloat64(fs.m.retryBudget.WithLabelValues("m")) != 20 {
		t.Fatalf("static budget: state %v, gauge %v", st.Models[0].RetryBudgetPercent, testutil.ToFloat64(fs.m.retryBudget.WithLabelValues("m")))
	}
}

func TestUtilisation(t *testing.T) {
	sm := &isobarpb.RegionSummary{Models: []*isobarpb.ModelSummary{
		{Model: "a", LoadRps: 5, CapacityRps: 10}, {Model: "b", LoadRps: 1}, {Model: "c"},
	}}
	if u := utilisation(sm); u["a"] != 0.5 || u["b"] != 1 || u["c"] != 0 {
		t.Fatalf("utilisation %v", u)
	}
}
