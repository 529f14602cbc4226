package sim

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// DCGM clock-throttle reason bits (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, the
// same values as NVML's nvmlClocksThrottleReason*).
const (
	ThrottleGPUIdle        uint64 = 0x1
	ThrottleAppClocks      uint64 = 0x2
	ThrottleSWPowerCap     uint64 = 0x4
	ThrottleHWSlowdown     uint64 = 0x8
	ThrottleSyncBoost      uint64 = 0x10
	ThrottleSWThermal      uint64 = 0x20
	ThrottleHWThermal      uint64 = 0x40
	ThrottleHWPowerBrake   uint64 = 0x80
	ThrottleDisplayClocks  uint64 = 0x100
	throttleFaultBits             = ThrottleHWSlowdown | ThrottleSWThermal | ThrottleHWThermal
	throttleClockDropAtMax        = 0.5  // severity 1 halves the SM clock
	pcieFaultBytesPerSec          = 12e9 // severity 1 adds 12 GB/s each way
	pcieFaultSlowdownAtMax        = 0.5  // severity 1 makes steps 1.5x longer
)

// GPUInfo identifies one GPU; the fields become dcgm-exporter's labels.
type GPUInfo struct {
	Index     int    // label gpu
	UUID      string // label UUID, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	PCIBusID  string // label pci_bus_id, "00000000:07:00.0"
	Device    string // label device, "nvidia0"
	ModelName string // label modelName
}

// GPUSample is one reading of the DCGM fields the fake exporter serves.
type GPUSample struct {
	UtilPct         float64 // DCGM_FI_DEV_GPU_UTIL, 0–100
	MemCopyUtilPct  float64 // DCGM_FI_DEV_MEM_COPY_UTIL, 0–100
	FBUsedMiB       float64 // DCGM_FI_DEV_FB_USED
	FBFreeMiB       float64 // DCGM_FI_DEV_FB_FREE
	SMActive        float64 // DCGM_FI_PROF_SM_ACTIVE, 0–1
	TensorActive    float64 // DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, 0–1
	DRAMActive      float64 // DCGM_FI_PROF_DRAM_ACTIVE, 0–1
	GPUTempC        float64 // DCGM_FI_DEV_GPU_TEMP
	MemTempC        float64 // DCGM_FI_DEV_MEMORY_TEMP
	PowerW          float64 // DCGM_FI_DEV_POWER_USAGE
	EnergyMJ        float64 // DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since the GPU was created)
	SMClockMHz      float64 // DCGM_FI_DEV_SM_CLOCK
	MemClockMHz     float64 // DCGM_FI_DEV_MEM_CLOCK
	ThrottleReasons uint64  // DCGM_FI_DEV_CLOCK_THROTTLE_REASONS bitmask
	PCIeTxBytes     float64 // DCGM_FI_PROF_PCIE_TX_BYTES, bytes/s
	PCIeRxBytes     float64 // DCGM_FI_PROF_PCIE_RX_BYTES, bytes/s
	XID             float64 // DCGM_FI_DEV_XID_ERRORS, last XID seen (0: none)
}

// GPUSource is what the DCGM exporter reads. Implementations must be safe
// for concurrent use.
type GPUSource interface {
	GPUInfo() GPUInfo
	GPUSample() GPUSample
}

var _ GPUSource = (*GPU)(nil)

// GPUProcess is the state of the inference process on a GPU.
type GPUProcess int

// Process states.
const (
	ProcessNone    GPUProcess = iota // no process: memory free, idle
	ProcessLoading                   // loading weights: memory filling
	ProcessReady                     // serving: vLLM's preallocation in place
)

// GPUConfig configures a simulated GPU.
type GPUConfig struct {
	// Info identifies the GPU. Zero fields get defaults derived from
	// Info.Index: UUID from the index and Seed, PCIBusID "00000000:<07+i>:00.0",
	// Device "nvidia<i>", ModelName from Profile.
	Info GPUInfo
	// Profile holds the hardware parameters (default: the 70b-awq profile's
	// A100 80 GB).
	Profile GPUProfile
	// TimeScale multiplies the GPU's time constants (utilisation window 1 s,
	// power time constant 1 s, temperature time constant 8 s) and fault lead
	// times. Default 1.
	TimeScale float64
	// Seed makes the default UUID differ between fleets.
	Seed int64
}

// Model time constants of the GPU model.
const (
	utilWindow = time.Second     // DCGM utilisation sample period
	powerTau   = time.Second     // power follows activity quickly
	tempTau    = 8 * time.Second // temperature follows power slowly
)

type activity struct {
	start, end       time.Time
	sm, tensor, dram float64
	pcieTx, pcieRx   float64 // bytes/s while active
	busy             float64 // 1 for a kernel running the whole interval
}

type hwFault struct {
	severity  float64
	start     time.Time
	lead      time.Duration // real (scaled) time
	modelLead time.Duration // as given
}

// GPU is a simulated GPU whose DCGM fields follow the activity an engine
// reports (RecordStep) and the faults injected into it. Reads are lazy: the
// thermal and power state is integrated up to the clock's now on every read
// or record, so a GPU needs no goroutine. Safe for concurrent use.
type GPU struct {
	info  GPUInfo
	prof  GPUProfile
	clock clockwork.Clock
	scale float64

	mu        sync.Mutex
	acts      []activity // intervals ending after now-window, oldest first
	proc      GPUProcess
	loadStart time.Time
	loadEnd   time.Time
	hung      bool
	throttle  *hwFault
	pcie      *hwFault
	xid       float64

	last     time.Time // time the EWMA state was integrated to
	powerW   float64
	tempC    float64
	energyMJ float64
}

func (c GPUConfig) withDefaults() GPUConfig {
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.Profile.MemoryMiB == 0 {
		c.Profile = a100
	}
	i := c.Info.Index
	if c.Info.UUID == "" {
		c.Info.UUID = syntheticUUID(c.Seed, i)
	}
	if c.Info.PCIBusID == "" {
		c.Info.PCIBusID = fmt.Sprintf("00000000:%02X:00.0", (7+i)%256)
	}
	if c.Info.Device == "" {
		c.Info.Device = fmt.Sprintf("nvidia%d", i)
	}
	if c.Info.ModelName == "" {
		c.Info.ModelName = c.Profile.ModelName
	}
	return c
}

func (c GPUConfig) validate() error {
	switch {
	case !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0):
		return fmt.Errorf("sim: GPUConfig.TimeScale %v: must be a positive number", c.TimeScale)
	case c.Info.Index < 0:
		return fmt.Errorf("sim: GPUConfig.Info.Index %d: must be >= 0", c.Info.Index)
	case c.Profile.MaxWatts <= c.Profile.IdleWatts || c.Profile.MemoryUtilization <= 0 || c.Profile.MemoryUtilization > 1:
		return fmt.Errorf("sim: GPUConfig.Profile: MaxWatts must exceed IdleWatts and MemoryUtilization be in (0,1]")
	}
	return nil
}

// NewGPU returns an idle GPU with no process. A nil clock means the real
// clock.
func NewGPU(cfg GPUConfig, clock clockwork.Clock) (*GPU, error) {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &GPU{info: cfg.Info, prof: cfg.Profile, clock: clock, scale: cfg.TimeScale}
	g.last = clock.Now()
	g.powerW = g.prof.IdleWatts
	g.tempC = g.prof.AmbientC
	return g, nil
}

// syntheticUUID derives a stable, UUID-shaped GPU id (splitmix64 of seed and
// index).
func syntheticUUID(seed int64, index int) string {
	x := uint64(seed)*0x9e3779b97f4a7c15 + uint64(index+1)*0xbf58476d1ce4e5b9
	next := func() uint64 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		return z ^ (z >> 31)
	}
	a, b := next(), next()
	return fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", uint32(a>>32), uint16(a>>16), uint16(a), uint16(b>>48), b&0xffffffffffff)
}

func (g *GPU) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * g.scale)
}

// GPUInfo returns the GPU's identity.
func (g *GPU) GPUInfo() GPUInfo { return g.info }

// StepLoad describes one engine step for the GPU model.
type StepLoad struct {
	// Batch is the number of sequences in the step.
	Batch int
	// PrefillShare is the fraction of the step spent on prefill, 0–1.
	PrefillShare float64
	// Tokens is the number of tokens the step streams back to clients.
	Tokens int
}

// RecordStep reports that the engine runs a step on the GPU from start to
// end (real times).
func (g *GPU) RecordStep(start, end time.Time, l StepLoad) {
	fill := math.Min(1, float64(l.Batch)/32)
	fp := math.Max(0, math.Min(1, l.PrefillShare))
	a := activity{
		start:  start,
		end:    end,
		busy:   1,
		sm:     fp*0.92 + (1-fp)*(0.55+0.35*fill),
		tensor: fp*0.70 + (1-fp)*(0.18+0.30*fill),
		dram:   fp*0.35 + (1-fp)*(0.62+0.23*fill),
		// Host<->device traffic of a serving engine is small: sampled token
		// ids out, input ids and metadata in.
		pcieTx: 4e6 + 2e5*float64(l.Tokens),
		pcieRx: 6e6 + 1e5*float64(l.Batch),
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.advanceLocked(g.clock.Now())
	g.acts = append(g.acts, a)
}

// SetProcess records the inference process state. loading is how long the
// process takes to load (real time) when p is ProcessLoading.
func (g *GPU) SetProcess(p GPUProcess, loading time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	g.advanceLocked(now)
	g.proc = p
	g.loadStart = now
	g.loadEnd = now.Add(loading)
	if p == ProcessNone {
		g.hung = false
		g.acts = g.acts[:0]
	}
}

// SetHung marks the GPU as running a kernel that never completes: GPU
// utilisation reads 100 % while SM activity is low, the signature of a
// stuck kernel or collective.
func (g *GPU) SetHung(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.advanceLocked(g.clock.Now())
	g.hung = on
}

// Throttle starts thermal throttling of the given severity (0–1): from now
// the temperature climbs, the HW_SLOWDOWN, SW_THERMAL and HW_THERMAL throttle
// bits are set and the SM clock drops by up to 50 %; after lead (model time,
// scaled by TimeScale) StepMultiplier slows the engine in proportion to the
// clock drop. Severity 0 clears the fault.
func (g *GPU) Throttle(severity float64, lead time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	g.advanceLocked(now)
	if severity <= 0 {
		g.throttle = nil
		return
	}
	g.throttle = &hwFault{severity: math.Min(1, severity), start: now, lead: g.scaled(lead), modelLead: lead}
}

// PCIe starts PCIe contention of the given severity (0–1): from now PCIe
// TX/RX bytes rise by up to 12 GB/s and DRAM activity by up to 0.3; after
// lead (model time, scaled) StepMultiplier slows the engine by up to 1.5x.
// Severity 0 clears the fault.
func (g *GPU) PCIe(severity float64, lead time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	g.advanceLocked(now)
	if severity <= 0 {
		g.pcie = nil
		return
	}
	g.pcie = &hwFault{severity: math.Min(1, severity), start: now, lead: g.scaled(lead), modelLead: lead}
}

// SetXID records an XID error code (0 clears it).
func (g *GPU) SetXID(code int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.xid = float64(code)
}

// ClearFaults removes throttling, PCIe contention and the XID.
func (g *GPU) ClearFaults() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.advanceLocked(g.clock.Now())
	g.throttle, g.pcie, g.xid = nil, nil, 0
}

// StepMultiplier is the factor by which hardware faults lengthen an engine
// step that starts at now: 1 without faults or before their lead time has
// passed.
func (g *GPU) StepMultiplier(now time.Time) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := 1.0
	if f := g.throttle; f != nil && !now.Before(f.start.Add(f.lead)) {
		m /= 1 - throttleClockDropAtMax*f.severity
	}
	if f := g.pcie; f != nil && !now.Before(f.start.Add(f.lead)) {
		m *= 1 + pcieFaultSlowdownAtMax*f.severity
	}
	return m
}

// window returns the activity averages over the utilisation window ending
// at now.
func (g *GPU) windowLocked(now time.Time) (busy, sm, tensor, dram, tx, rx float64) {
	w := g.scaled(utilWindow)
	from := now.Add(-w)
	for _, a := range g.acts {
		s, e := a.start, a.end
		if s.Before(from) {
			s = from
		}
		if e.After(now) {
			e = now
		}
		if !e.After(s) {
			continue
		}
		f := float64(e.Sub(s)) / float64(w)
		busy += f * a.busy
		sm += f * a.sm
		tensor += f * a.tensor
		dram += f * a.dram
		tx += f * a.pcieTx
		rx += f * a.pcieRx
	}
	return math.Min(busy, 1), math.Min(sm, 1), math.Min(tensor, 1), math.Min(dram, 1), tx, rx
}

// targetsLocked returns the instantaneous power and temperature the GPU
// tends to at time t.
func (g *GPU) targetsLocked(t time.Time) (powerW, tempC float64) {
	busy, sm, _, dram, _, _ := g.windowLocked(t)
	p := g.prof
	load := 0.25*busy + 0.5*sm + 0.25*dram
	switch {
	case g.hung:
		load = 0.45
	case g.procAtLocked(t) == ProcessLoading:
		load = math.Max(load, 0.12)
	}
	powerW = p.IdleWatts + (p.MaxWatts-p.IdleWatts)*load
	if f := g.throttle; f != nil {
		// A throttled GPU runs hot and is clocked down, drawing less.
		powerW *= 1 - 0.3*f.severity*throttleClockDropAtMax
	}
	tempC = p.AmbientC + p.LoadRiseC*(powerW-p.IdleWatts)/(p.MaxWatts-p.IdleWatts)
	if f := g.throttle; f != nil {
		tempC = math.Max(tempC, 84+8*f.severity)
	}
	return powerW, tempC
}

// advanceLocked integrates power, temperature and energy from g.last to now.
func (g *GPU) advanceLocked(now time.Time) {
	if !now.After(g.last) {
		return
	}
	maxStep := g.scaled(utilWindow) / 8
	for t := g.last; t.Before(now); {
		next := t.Add(maxStep)
		if next.After(now) {
			next = now
		}
		dt := next.Sub(t)
		pT, tT := g.targetsLocked(next)
		g.powerW += (pT - g.powerW) * (1 - math.Exp(-float64(dt)/float64(g.scaled(powerTau))))
		g.tempC += (tT - g.tempC) * (1 - math.Exp(-float64(dt)/float64(g.scaled(tempTau))))
		g.energyMJ += g.powerW * dt.Seconds() * 1000
		t = next
		if now.Sub(t) > 10*g.scaled(tempTau) && g.quietLocked(t) {
			// Nothing changes any more: converge and jump to now.
			g.energyMJ += pT * now.Sub(t).Seconds() * 1000
			g.powerW, g.tempC = pT, tT
			break
		}
	}
	g.last = now
	// Forget intervals that left the window.
	from := now.Add(-g.scaled(utilWindow))
	k := 0
	for k < len(g.acts) && g.acts[k].end.Before(from) {
		k++
	}
	if k > 0 {
		g.acts = append(g.acts[:0], g.acts[k:]...)
	}
}

// quietLocked reports whether no activity is recorded after t, so the
// targets stay constant from t on.
func (g *GPU) quietLocked(t time.Time) bool {
	for _, a := range g.acts {
		if a.end.After(t.Add(-g.scaled(utilWindow))) {
			return false
		}
	}
	return g.proc != ProcessLoading || !t.Before(g.loadEnd)
}

// GPUSample reads every DCGM field at the clock's now.
func (g *GPU) GPUSample() GPUSample {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	g.advanceLocked(now)
	busy, sm, tensor, dram, tx, rx := g.windowLocked(now)
	p := g.prof
	s := GPUSample{
		UtilPct:      math.Round(busy * 100),
		SMActive:     sm,
		TensorActive: tensor,
		DRAMActive:   dram,
		PowerW:       g.powerW,
		EnergyMJ:     g.energyMJ,
		GPUTempC:     math.Round(g.tempC),
		MemTempC:     math.Round(g.tempC + 4),
		MemClockMHz:  float64(p.MemClockMHz),
		PCIeTxBytes:  tx,
		PCIeRxBytes:  rx,
		XID:          g.xid,
	}
	if g.hung {
		s.UtilPct, s.SMActive, s.TensorActive, s.DRAMActive = 100, 0.08, 0, 0.02
		busy = 1
	}
	// Memory: nothing, weights filling in while loading, vLLM's
	// preallocation when ready.
	const ctxMiB, reservedMiB = 520, 560
	proc := g.procAtLocked(now)
	switch proc {
	case ProcessLoading:
		frac := 1.0
		if total := g.loadEnd.Sub(g.loadStart); total > 0 {
			frac = math.Min(1, float64(now.Sub(g.loadStart))/float64(total))
		}
		s.FBUsedMiB = math.Round(ctxMiB + frac*float64(p.WeightsMiB))
		s.SMActive = math.Max(s.SMActive, 0.03)
		s.PCIeRxBytes += 2.5e9 // weights streaming in from host
	case ProcessReady:
		s.FBUsedMiB = math.Round(p.MemoryUtilization * float64(p.MemoryMiB))
	}
	s.FBFreeMiB = math.Max(0, float64(p.MemoryMiB)-reservedMiB-s.FBUsedMiB)
	s.MemCopyUtilPct = math.Round(s.DRAMActive * 100)

	// Clocks and throttle reasons.
	clock := float64(p.MaxSMClockMHz)
	if busy < 0.01 && proc != ProcessLoading {
		clock = float64(p.IdleSMClockMHz)
		s.ThrottleReasons |= ThrottleGPUIdle
	}
	if g.powerW >= 0.97*p.MaxWatts {
		s.ThrottleReasons |= ThrottleSWPowerCap
	}
	if f := g.throttle; f != nil {
		clock = math.Min(clock, float64(p.MaxSMClockMHz)*(1-throttleClockDropAtMax*f.severity))
		s.ThrottleReasons |= throttleFaultBits
		s.ThrottleReasons &^= ThrottleGPUIdle
	}
	if f := g.pcie; f != nil {
		s.PCIeTxBytes += pcieFaultBytesPerSec * f.severity
		s.PCIeRxBytes += pcieFaultBytesPerSec * f.severity
		s.DRAMActive = math.Min(1, s.DRAMActive+0.3*f.severity)
		s.MemCopyUtilPct = math.Round(s.DRAMActive * 100)
	}
	s.SMClockMHz = math.Round(clock)
	return s
}

// Process returns the current process state.
func (g *GPU) Process() GPUProcess {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.procAtLocked(g.clock.Now())
}

// procAtLocked is the process state at t: Loading turns Ready once the
// loading time has passed.
func (g *GPU) procAtLocked(t time.Time) GPUProcess {
	if g.proc == ProcessLoading && !t.Before(g.loadEnd) {
		return ProcessReady
	}
	return g.proc
}

// HardwareFaults describes the active hardware faults for status listings.
func (g *GPU) HardwareFaults() []FaultStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []FaultStatus
	if f := g.throttle; f != nil {
		out = append(out, FaultStatus{Fault: FaultThrottle, Severity: f.severity, Lead: f.modelLead.String(), Since: f.start})
	}
	if f := g.pcie; f != nil {
		out = append(out, FaultStatus{Fault: FaultPCIe, Severity: f.severity, Lead: f.modelLead.String(), Since: f.start})
	}
	if g.xid != 0 {
		out = append(out, FaultStatus{Fault: FaultXID, Code: int(g.xid)})
	}
	return out
}
