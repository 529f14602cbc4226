package regional

import (
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/score"
)

// reading takes each signal that is set, and nothing from a heartbeat that
// carries no signals.
func TestReading(t *testing.T) {
	s := &isobarpb.Signals{QueueDepth: f64(2), TtftP95Seconds: f64(0.3), VramUsed: f64(0.8), ClockThrottleReasons: new(uint64(score.ThrottleSWThermal))}
	r := reading(s, true, false, 3*time.Millisecond, time.Millisecond, true)
	want := score.Reading{
		AppOK: true, QueueDepth: score.Some(2), TTFTP95: score.Some(0.3),
		VRAM: score.Some(0.8), ThrottleReasons: score.ThrottleSWThermal, ThrottleOK: true,
		RTT: 3 * time.Millisecond, Jitter: time.Millisecond, RTTOK: true,
	}
	if r != want {
		t.Errorf("reading:\n got %+v\nwant %+v", r, want)
	}
	if got := reading(nil, true, true, 0, 0, false); got != (score.Reading{AppOK: true, HardwareOK: true}) {
		t.Errorf("no signals: %+v", got)
	}
}

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
