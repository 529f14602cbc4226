package chaos

import (
	"testing"

	"github.com/isobar-mesh/isobar/adminapi"
)

// The jitter drill's baseline takes each gossip RTT at the lower of two
// samples, so a scheduling spike in one cannot hide the injected rise.
func TestRTTBaseline(t *testing.T) {
	state := func(ab, ac float64) *adminapi.FleetState {
		return &adminapi.FleetState{Regions: []adminapi.RegionState{{Name: "a", RTTms: map[string]float64{"b": ab, "c": ac}}}}
	}
	tg := &target{regions: []string{"a"}, faults: []adminapi.Fault{{Kind: adminapi.FaultWANDelay, DelayMS: 20}}}
	for _, tc := range []struct {
		name             string
		early, late, now *adminapi.FleetState
		want             bool
	}{
		{"rise over a clean baseline", state(1, 1), state(1, 1), state(22, 22), true},
		{"no rise", state(1, 1), state(1, 1), state(2, 2), false},
		// The sample just before the injection caught 15 ms of noise.
		{"spike in the last sample", state(1, 1), state(16, 16), state(22, 22), true},
		{"no early sample", nil, state(16, 16), state(22, 22), false},
	} {
		minRTT(tc.late, tc.early)
		tg.before = tc.late
		if got := rttRaised(tg, tc.now); got != tc.want {
			t.Errorf("%s: rttRaised = %v, want %v", tc.name, got, tc.want)
		}
	}
}
