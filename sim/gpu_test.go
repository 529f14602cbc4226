package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func newTestGPU(t *testing.T) (*GPU, *clockwork.FakeClock) {
	t.Helper()
	fc := clockwork.NewFakeClock()
	g, err := NewGPU(GPUConfig{Info: GPUInfo{Index: 2}, Seed: 7}, fc)
	if err != nil {
		t.Fatal(err)
	}
	return g, fc
}

// busyFor records back-to-back steps of the given batch for d.
func busyFor(g *GPU, fc *clockwork.FakeClock, d time.Duration, batch int) {
	const step = 40 * time.Millisecond
	for end := fc.Now().Add(d); fc.Now().Before(end); {
		now := fc.Now()
		g.RecordStep(now, now.Add(step), StepLoad{Batch: batch, Tokens: batch})
		fc.Advance(step)
	}
}

func TestGPUDefaultsIdentity(t *testing.T) {
	g, _ := newTestGPU(t)
	info := g.GPUInfo()
	if info.Index != 2 || info.Device != "nvidia2" || info.PCIBusID != "00000000:09:00.0" || info.ModelName != "NVIDIA A100-SXM4-80GB" {
		t.Fatalf("info = %+v", info)
	}
	if !strings.HasPrefix(info.UUID, "GPU-") || len(info.UUID) != len("GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52") {
		t.Fatalf("UUID %q is not UUID-shaped", info.UUID)
	}
	other, _ := NewGPU(GPUConfig{Info: GPUInfo{Index: 2}, Seed: 8}, nil)
	if other.GPUInfo().UUID == info.UUID {
		t.Fatal("different seeds gave the same UUID")
	}
}

func TestGPUUtilFollowsActivity(t *testing.T) {
	g, fc := newTestGPU(t)
	g.SetProcess(ProcessReady, 0)
	idle := g.GPUSample()
	if idle.UtilPct != 0 || idle.ThrottleReasons&ThrottleGPUIdle == 0 || idle.SMClockMHz != 210 {
		t.Fatalf("idle sample = %+v", idle)
	}
	busyFor(g, fc, 2*time.Second, 4)
	small := g.GPUSample()
	if small.UtilPct != 100 || small.SMClockMHz != 1410 || small.ThrottleReasons&ThrottleGPUIdle != 0 {
		t.Fatalf("busy sample = %+v", small)
	}
	busyFor(g, fc, 2*time.Second, 32)
	big := g.GPUSample()
	if !(big.SMActive > small.SMActive && big.TensorActive > small.TensorActive && big.DRAMActive > small.DRAMActive) {
		t.Fatalf("activity did not rise with batch: batch 4 %+v, batch 32 %+v", small, big)
	}
	for _, v := range []float64{big.SMActive, big.TensorActive, big.DRAMActive} {
		if v < 0 || v > 1 {
			t.Fatalf("ratio out of [0,1]: %+v", big)
		}
	}
	// Half busy over the last second.
	now := fc.Now()
	g.RecordStep(now, now.Add(500*time.Millisecond), StepLoad{Batch: 4})
	fc.Advance(time.Second)
	if s := g.GPUSample(); s.UtilPct != 50 {
		t.Fatalf("util after 0.5 s busy in 1 s = %v, want 50", s.UtilPct)
	}
	fc.Advance(time.Second)
	if s := g.GPUSample(); s.UtilPct != 0 {
		t.Fatalf("util after an idle second = %v, want 0", s.UtilPct)
	}
}

func TestGPUPowerAndTemperatureFollowLoadSlowly(t *testing.T) {
	g, fc := newTestGPU(t)
	g.SetProcess(ProcessReady, 0)
	cold := g.GPUSample()
	busyFor(g, fc, time.Second, 16)
	warm := g.GPUSample()
	busyFor(g, fc, 40*time.Second, 16)
	hot := g.GPUSample()
	if !(cold.PowerW < warm.PowerW && warm.PowerW <= hot.PowerW+1) {
		t.Fatalf("power did not rise: %v -> %v -> %v", cold.PowerW, warm.PowerW, hot.PowerW)
	}
	if !(cold.GPUTempC < warm.GPUTempC && warm.GPUTempC < hot.GPUTempC) {
		t.Fatalf("temperature did not climb gradually: %v -> %v -> %v", cold.GPUTempC, warm.GPUTempC, hot.GPUTempC)
	}
	if hot.EnergyMJ <= warm.EnergyMJ || hot.MemTempC <= hot.GPUTempC {
		t.Fatalf("energy or memory temperature wrong: %+v", hot)
	}
	fc.Advance(10 * time.Minute)
	idle := g.GPUSample()
	if idle.PowerW > cold.PowerW+1 || idle.GPUTempC > cold.GPUTempC+1 {
		t.Fatalf("did not cool down: %+v", idle)
	}
}

func TestGPUMemoryFollowsProcess(t *testing.T) {
	g, fc := newTestGPU(t)
	if s := g.GPUSample(); s.FBUsedMiB != 0 || s.FBFreeMiB < 80000 {
		t.Fatalf("no process: %+v", s)
	}
	g.SetProcess(ProcessLoading, 10*time.Second)
	fc.Advance(5 * time.Second)
	half := g.GPUSample()
	if half.FBUsedMiB < 15000 || half.FBUsedMiB > 25000 {
		t.Fatalf("halfway through loading FB used = %v", half.FBUsedMiB)
	}
	fc.Advance(6 * time.Second)
	ready := g.GPUSample()
	if want := 0.9 * 81920; ready.FBUsedMiB != want {
		t.Fatalf("ready FB used = %v, want %v (vLLM preallocation)", ready.FBUsedMiB, want)
	}
	if ready.FBUsedMiB+ready.FBFreeMiB > 81920 {
		t.Fatalf("used+free exceeds the frame buffer: %+v", ready)
	}
	if g.Process() != ProcessReady {
		t.Fatalf("process = %v after loading, want ready", g.Process())
	}
	g.SetProcess(ProcessNone, 0)
	if s := g.GPUSample(); s.FBUsedMiB != 0 {
		t.Fatalf("after kill FB used = %v", s.FBUsedMiB)
	}
}

func TestGPUThrottleHardwareFirstLatencyAfterLead(t *testing.T) {
	g, fc := newTestGPU(t)
	g.SetProcess(ProcessReady, 0)
	busyFor(g, fc, 2*time.Second, 8)
	before := g.GPUSample()
	g.Throttle(1, 12*time.Second)
	now := fc.Now()
	s := g.GPUSample()
	want := ThrottleHWSlowdown | ThrottleSWThermal | ThrottleHWThermal
	if s.ThrottleReasons&want != want {
		t.Fatalf("throttle reasons = %#x, want %#x set", s.ThrottleReasons, want)
	}
	if s.SMClockMHz >= before.SMClockMHz {
		t.Fatalf("SM clock %v did not drop from %v", s.SMClockMHz, before.SMClockMHz)
	}
	if m := g.StepMultiplier(now.Add(11 * time.Second)); m != 1 {
		t.Fatalf("step multiplier before the lead = %v, want 1", m)
	}
	if m := g.StepMultiplier(now.Add(12 * time.Second)); m != 2 {
		t.Fatalf("step multiplier after the lead = %v, want 2 (clock halved)", m)
	}
	busyFor(g, fc, 5*time.Second, 8)
	if later := g.GPUSample(); later.GPUTempC <= before.GPUTempC {
		t.Fatalf("temperature %v did not climb from %v", later.GPUTempC, before.GPUTempC)
	}
	g.ClearFaults()
	if s := g.GPUSample(); s.ThrottleReasons&want != 0 || g.StepMultiplier(fc.Now()) != 1 {
		t.Fatalf("after clear: reasons %#x multiplier %v", s.ThrottleReasons, g.StepMultiplier(fc.Now()))
	}
}

func TestGPUPCIeContention(t *testing.T) {
	g, fc := newTestGPU(t)
	g.SetProcess(ProcessReady, 0)
	busyFor(g, fc, 2*time.Second, 8)
	before := g.GPUSample()
	g.PCIe(0.5, 5*time.Second)
	s := g.GPUSample()
	if s.PCIeTxBytes < before.PCIeTxBytes+5e9 || s.PCIeRxBytes < before.PCIeRxBytes+5e9 || s.DRAMActive <= before.DRAMActive {
		t.Fatalf("pcie fault: before %+v after %+v", before, s)
	}
	if m := g.StepMultiplier(fc.Now()); m != 1 {
		t.Fatalf("multiplier before lead = %v", m)
	}
	if m := g.StepMultiplier(fc.Now().Add(5 * time.Second)); m != 1.25 {
		t.Fatalf("multiplier after lead = %v, want 1.25", m)
	}
}

func TestGPUHungReadsBusy(t *testing.T) {
	g, _ := newTestGPU(t)
	g.SetProcess(ProcessReady, 0)
	g.SetHung(true)
	if s := g.GPUSample(); s.UtilPct != 100 || s.SMActive > 0.2 {
		t.Fatalf("hung sample = %+v, want util 100 and low SM activity", s)
	}
}

func TestGPUTimeScale(t *testing.T) {
	fc := clockwork.NewFakeClock()
	g, err := NewGPU(GPUConfig{TimeScale: 0.1}, fc)
	if err != nil {
		t.Fatal(err)
	}
	g.Throttle(1, 10*time.Second)
	if m := g.StepMultiplier(fc.Now().Add(time.Second)); m != 2 {
		t.Fatalf("scaled lead: multiplier after 1 s (10 s × 0.1) = %v, want 2", m)
	}
	if _, err := NewGPU(GPUConfig{TimeScale: -1}, fc); err == nil {
		t.Fatal("negative time scale accepted")
	}
}
