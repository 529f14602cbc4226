package regional

import (
	"testing"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/score"
)

// A heartbeat without signals (valid: every source may have nothing to
// say yet) is scored on what there is, not a crash.
func TestRegistryHeartbeatWithoutSignals(t *testing.T) {
	f := newRegFixture(t)
	hb := heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)
	hb.Signals = nil
	f.send(hb)
	c, ok := f.reg.View().Cell("a")
	if !ok || c.Score.Pressure != score.NeutralPressure {
		t.Fatalf("cell %+v (ok %v): want the neutral pressure", c, ok)
	}
}
