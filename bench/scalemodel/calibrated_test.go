package scalemodel

import (
	"math"
	"reflect"
	"testing"
)

// TestCalibratedMatchesFixture refits the constants from the trimmed run
// they were frozen from (testdata/xeon-scale.json) and checks they agree within
// rounding: the frozen constants are what the rules give on that run, not
// edited by hand. A change to the rules or the fixture shows here; the
// message carries the refitted literal.
func TestCalibratedMatchesFixture(t *testing.T) {
	rep, err := ReadReport("testdata/xeon-scale.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Fit(rep, FitOptions{NearestRTT: CalibratedNearestRTT})
	if err != nil {
		t.Fatal(err)
	}
	want := Calibrated()
	gv, wv := reflect.ValueOf(flatten(got)), reflect.ValueOf(flatten(want))
	for i := 0; i < gv.Len(); i++ {
		g, w := gv.Index(i).Float(), wv.Index(i).Float()
		if math.Abs(g-w) > 1e-4*math.Max(math.Abs(w), 1e-9) {
			t.Errorf("constant %d: refitted %.6g, frozen %.6g", i, g, w)
		}
	}
	if got.FullCycle.NLogN != want.FullCycle.NLogN || got.FullCycleCPU.NLogN != want.FullCycleCPU.NLogN || got.LiveCycle.NLogN != want.LiveCycle.NLogN || got.LiveBuild.NLogN != want.LiveBuild.NLogN {
		t.Errorf("cost forms differ")
	}
	if t.Failed() {
		t.Logf("refitted: %#v", got)
	}
}

func flatten(p Params) []float64 {
	return []float64{p.HeartbeatCPUUs, p.HeartbeatCPUExp, p.ControllerCPUMsPerS, p.ProcessCPUMsPerS, p.FullCycle.A, p.FullCycle.B, p.FullCycleCPU.A, p.FullCycleCPU.B, p.CycleSpread,
		p.LiveCycle.A, p.LiveCycle.B, p.LiveBuild.A, p.LiveBuild.B, p.PushesPerControllerPerS, p.HeartbeatBytes,
		p.SummaryBaseBytes, p.SummaryPerRTTBytes, p.Solve.C, p.Solve.P}
}
