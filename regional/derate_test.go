package regional

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// A cell reporting a thermal throttle bit is pushed with EDS health
// DEGRADED at an unchanged weight, and /debug/cells says so; load signals
// leave its weight where it was.
func TestRegistryThrottleIsDegradedNotAWeight(t *testing.T) {
	f := newRegFixture(t)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	f.send(heartbeat("b", "127.0.0.1:1002", ready, 0))
	f.waitView(func(v *View) bool {
		a, _ := v.Cell("a")
		b, _ := v.Cell("b")
		return a.Weight.Published == 100 && b.Weight.Published == 100
	})
	for len(f.push.pushed) > 0 {
		<-f.push.pushed
	}

	hot := heartbeat("a", "127.0.0.1:1001", ready, 0)
	hot.Signals.QueueDepth, hot.Signals.KvCacheUsage = f64(40), f64(0.95)
	hot.Signals.ClockThrottleReasons = proto.Uint64(score.ThrottleHWThermal)
	f.send(hot)
	v := f.waitView(func(v *View) bool { a, _ := v.Cell("a"); return a.Weight.Degraded })
	a, _ := v.Cell("a")
	if a.Weight.Published != 100 {
		t.Errorf("throttled and loaded cell weight %d, want 100 (health carries the derate)", a.Weight.Published)
	}
	d := debugCell(a, f.reg.cfg.Score)
	if !d.Degraded || d.Band != "full" || d.BandReason == "" {
		t.Errorf("debug view: degraded %v band %q reason %q", d.Degraded, d.Band, d.BandReason)
	}
	var st xds.State
	for !degradedCells(st)["a"] {
		select {
		case st = <-f.push.pushed:
		case <-time.After(5 * time.Second):
			t.Fatal("no push with the derate")
		}
	}
	if w := weights(st); w["a"] != 100 || w["b"] != 100 || degradedCells(st)["b"] {
		t.Errorf("pushed weights %v degraded %v, want both 100 and only a degraded", w, degradedCells(st))
	}
}

func degradedCells(st xds.State) map[string]bool {
	out := map[string]bool{}
	for _, m := range st.Models {
		for _, l := range m.Localities {
			for _, e := range l.Endpoints {
				if e.Degraded {
					out[e.CellID] = true
				}
			}
		}
	}
	return out
}
