package flowcontrol

import (
	"testing"
	"time"
)

func TestEndpointCap(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name       string
		seqs       int64
		rtt, hold  time.Duration
		configured int
		want       int
	}{
		{"undeclared: the configured cap", 0, 50 * ms, 5 * time.Second, 64, 64},
		{"negative: the configured cap", -3, 50 * ms, 5 * time.Second, 64, 64},
		{"batch above the configured cap (KV-bound engine)", 1024, 50 * ms, 5 * time.Second, 64, 64},
		{"batch equal to the configured cap", 64, 50 * ms, 5 * time.Second, 64, 64},
		{"no hold measured yet: the batch", 9, 50 * ms, 0, 64, 9},
		{"no rtt measured yet: the batch", 9, 0, 5 * time.Second, 64, 9},
		{"short round trip: the batch", 9, 40 * ms, 6 * time.Second, 64, 9},
		{"round trip worth 2.25 completions: 2 early", 9, 250 * ms, time.Second, 64, 11},
		{"exactly 2 completions per round trip: 2 early", 8, 250 * ms, time.Second, 64, 10},
		{"just under 1 completion per round trip: none early", 9, 111 * ms, time.Second, 64, 9},
		{"margin past the configured cap: the configured cap", 32, time.Second, time.Second, 48, 48},
		{"huge margin: the configured cap", 9, time.Hour, time.Nanosecond, 64, 64},
		{"configured 1", 9, 50 * ms, time.Second, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EndpointCap(tc.seqs, tc.rtt, tc.hold, tc.configured); got != tc.want {
				t.Fatalf("EndpointCap(%d, %s, %s, %d) = %d, want %d", tc.seqs, tc.rtt, tc.hold, tc.configured, got, tc.want)
			}
		})
	}
}
