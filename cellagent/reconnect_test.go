package cellagent

import (
	"testing"
	"time"
)

// TestReconnectBoundedAfterLongOutage: with the default config, the first
// reconnect comes within 250 ms, and however many attempts a controller
// restart made fail, no wait reaches 2 s — the bound the regional
// controller's warm start holds its first push for (TTL + 2 s). The old
// default (5 s) let agents trail a restarted controller by up to 5 s.
func TestReconnectBoundedAfterLongOutage(t *testing.T) {
	c := Config{}.withDefaults()
	p := reconnectPolicy(c)
	if got := p.Ceiling(0); got <= 0 || got > 250*time.Millisecond {
		t.Errorf("first reconnect within %v, want within (0, 250ms]", got)
	}
	for _, attempt := range []int{1, 5, 10, 50, 1 << 20} {
		if got := p.Ceiling(attempt); got > 2*time.Second {
			t.Errorf("attempt %d waits up to %v, want at most 2s", attempt, got)
		}
	}
	for attempt := range 64 {
		if d := p.Delay(attempt); d < 0 || d >= max(p.Ceiling(attempt), 1) {
			t.Fatalf("attempt %d drew %v outside [0, %v)", attempt, d, p.Ceiling(attempt))
		}
	}
}
