package cycle

import (
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/score"
)

func f64(v float64) *float64 { return &v }

// Reading takes each signal that is set, and nothing from a heartbeat that
// carries no signals.
func TestReading(t *testing.T) {
	s := &isobarpb.Signals{QueueDepth: f64(2), TtftP95Seconds: f64(0.3), VramUsed: f64(0.8), ClockThrottleReasons: new(uint64(score.ThrottleSWThermal))}
	r := Reading(s, true, false, 3*time.Millisecond, time.Millisecond, true)
	want := score.Reading{
		AppOK: true, QueueDepth: score.Some(2), TTFTP95: score.Some(0.3),
		VRAM: score.Some(0.8), ThrottleReasons: score.ThrottleSWThermal, ThrottleOK: true,
		RTT: 3 * time.Millisecond, Jitter: time.Millisecond, RTTOK: true,
	}
	if r != want {
		t.Errorf("Reading:\n got %+v\nwant %+v", r, want)
	}
	if got := Reading(nil, true, true, 0, 0, false); got != (score.Reading{AppOK: true, HardwareOK: true}) {
		t.Errorf("no signals: %+v", got)
	}
}
