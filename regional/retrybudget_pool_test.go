package regional

import (
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// The pool utilisation reaches the projection: of three cells, one
// failing 30 % of its requests is held out while the pool has headroom,
// and kept in (its band reason says why) when the two others would have
// to carry a pool at 90 % of its capacity.
func TestPoolUtilisationBoundsThePenalty(t *testing.T) {
	for _, tc := range []struct {
		util float64
		want bool // the failing cell in the load balancer
	}{{0.3, false}, {0.9, true}} {
		f := newRegFixture(t)
		if err := f.reg.SetPoolUtilisation(t.Context(), map[string]float64{"m": tc.util}); err != nil {
			t.Fatal(err)
		}
		for i, ep := range []string{"127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"} {
			hb := heartbeat(string(rune('a'+i)), ep, isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)
			hb.Signals.ErrorRate, hb.Signals.WindowRequests = f64(0), f64(40)
			if i == 0 {
				hb.Signals.ErrorRate = f64(0.3)
			}
			f.send(hb)
		}
		v := f.waitView(func(v *View) bool {
			a, ok := v.Cell("a")
			b, _ := v.Cell("b")
			return ok && b.Weight.Published > 0 && (a.Weight.Published > 0) == tc.want
		})
		if a, _ := v.Cell("a"); tc.want && (a.Weight.Penalty != 0 || !strings.Contains(a.Weight.BandReason, "kept")) {
			t.Errorf("at %v: the failing cell has penalty %v, band reason %q; want kept", tc.util, a.Weight.Penalty, a.Weight.BandReason)
		}
	}
}
