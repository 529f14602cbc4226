package score

import (
	"testing"
	"time"
)

func TestInputFrom(t *testing.T) {
	full := Reading{
		AppOK: true, QueueDepth: Some(3), Running: Some(2), TTFTP95: Some(0.4), ErrorRate: Some(0.02), KVCache: Some(0.6),
		HardwareOK: true, GPUUtil: Some(0.7), VRAM: Some(0.9), SMActive: Some(0.5), DRAMActive: Some(0.4), TemperatureC: Some(70),
		ThrottleReasons: ThrottleHWThermal, ThrottleOK: true,
		RTT: 5 * time.Millisecond, Jitter: time.Millisecond, RTTOK: true,
	}
	want := Input{
		QueueDepth: Some(3), Running: Some(2), TTFTP95: Some(0.4), ErrorRate: Some(0.02), KVCache: Some(0.6),
		GPUUtil: Some(0.7), VRAM: Some(0.9), SMActive: Some(0.5), DRAMActive: Some(0.4), TemperatureC: Some(70),
		ThrottleReasons: ThrottleHWThermal, ThrottleOK: true,
		RTT: 5 * time.Millisecond, Jitter: time.Millisecond, RTTOK: true, JitterOK: true,
	}
	if got := InputFrom(full); got != want {
		t.Errorf("every source up:\n got %+v\nwant %+v", got, want)
	}

	appDown := full
	appDown.AppOK = false
	got := InputFrom(appDown)
	if got.QueueDepth.OK || got.Running.OK || got.TTFTP95.OK || got.ErrorRate.OK || got.KVCache.OK {
		t.Errorf("vLLM down: application values kept: %+v", got)
	}
	if !got.GPUUtil.OK || !got.RTTOK {
		t.Errorf("vLLM down: other sources dropped: %+v", got)
	}

	hwDown := full
	hwDown.HardwareOK = false
	got = InputFrom(hwDown)
	if got.GPUUtil.OK || got.VRAM.OK || got.SMActive.OK || got.DRAMActive.OK || got.TemperatureC.OK || got.ThrottleOK || got.ThrottleReasons != 0 {
		t.Errorf("DCGM down: hardware values kept: %+v", got)
	}
	if !got.QueueDepth.OK {
		t.Errorf("DCGM down: application values dropped: %+v", got)
	}

	noProbe := full
	noProbe.RTTOK = false
	if got := InputFrom(noProbe); got.RTTOK || got.JitterOK {
		t.Errorf("no probe: RTT %v jitter %v", got.RTTOK, got.JitterOK)
	}

	for _, tc := range []struct {
		name      string
		appOK     bool
		engine    Value
		dataPlane Value
		want      Value
	}{
		{"data plane higher", true, Some(0.02), Some(0.3), Some(0.3)},
		{"engine higher", true, Some(0.2), Some(0.1), Some(0.2)},
		{"engine has none", true, Value{}, Some(0.1), Some(0.1)},
		{"engine down", false, Some(0.5), Some(0.1), Some(0.1)},
		{"no data-plane report", true, Some(0.2), Value{}, Some(0.2)},
		{"neither", false, Value{}, Value{}, Value{}},
	} {
		r := full
		r.AppOK, r.ErrorRate, r.DataPlaneErrorRate = tc.appOK, tc.engine, tc.dataPlane
		if got := InputFrom(r).ErrorRate; got != tc.want {
			t.Errorf("%s: error rate %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
