//go:build nvml

package cellagent

import (
	"context"
	"testing"
)

// TestNVMLReadsGPU0 runs only in binaries built with -tags nvml, on a host
// with an NVIDIA driver; elsewhere it skips.
func TestNVMLReadsGPU0(t *testing.T) {
	src, err := newNVMLSource("0")
	if err != nil {
		t.Skipf("no NVML here: %v", err)
	}
	defer src.close()
	hw, err := src.read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := Signals{}.mergeHardware(hw)
	checkSignalsInRange(t, s)
	if s.GPUUtil == nil || s.VRAMUsed == nil || s.TemperatureCelsius == nil {
		t.Errorf("NVML sample lacks basic fields: %+v", hw)
	}
	t.Logf("%s: util %v vram %v temp %v power %v throttle %v", hw.Device,
		deref(s.GPUUtil), deref(s.VRAMUsed), deref(s.TemperatureCelsius), deref(s.PowerWatts), s.ClockThrottleReasons)
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
