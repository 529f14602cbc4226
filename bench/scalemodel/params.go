package scalemodel

import "math"

// Linear is a cost a + b·n, or a + b·n·log₂n when NLogN (n cells per
// controller), in ms.
type Linear struct {
	A     float64 `json:"a"`
	B     float64 `json:"b"`
	NLogN bool    `json:"nlogn,omitempty"`
}

// At is the cost at n cells, never below zero.
func (l Linear) At(n float64) float64 { return math.Max(0, l.A+l.B*growth(n, l.NLogN)) }

// growth is n, or n·log₂n (n below 2 counts as 2).
func growth(n float64, nlogn bool) float64 {
	if !nlogn {
		return n
	}
	return n * math.Log2(math.Max(n, 2))
}

// Power is a cost c·xᵖ (x regions), in ms.
type Power struct {
	C float64 `json:"c"`
	P float64 `json:"p"`
}

// At is the cost at x regions.
func (p Power) At(x float64) float64 { return p.C * math.Pow(x, p.P) }

// Params are the model's per-operation costs. Each field's comment says
// what it is fitted from; Fit holds the rules.
type Params struct {
	// HeartbeatCPUUs is the controllers' CPU per accepted heartbeat at
	// RefHeartbeatsPerS, in µs, with the live cycles' share folded in: at
	// a fixed heartbeat and cycle interval both grow with the cells, and
	// the measured points cannot tell them apart (stream receive, decode,
	// validate, apply; and the cycle's per-cell work while the cycle is
	// unsaturated). HeartbeatCPUExp is α in ingest CPU ∝ rateᵅ: below 1,
	// a busier process spends less per heartbeat (wake-ups, syscalls and
	// timers amortised over more work), so the per-heartbeat CPU at rate
	// r is HeartbeatCPUUs·(r/RefHeartbeatsPerS)^(α−1).
	HeartbeatCPUUs  float64 `json:"heartbeat_cpu_us"`
	HeartbeatCPUExp float64 `json:"heartbeat_cpu_exp"`
	// ControllerCPUMsPerS is one controller's CPU that does not scale with
	// its cells or heartbeats (timers, summary loop, prober), ms per s.
	ControllerCPUMsPerS float64 `json:"controller_cpu_ms_per_s"`
	// ProcessCPUMsPerS is the measuring process's own CPU beside the
	// controllers (the harness's xDS client and probe sink, the Go
	// runtime's background work), ms per s; counted in the validation,
	// not in a deployment's cores.
	ProcessCPUMsPerS float64 `json:"process_cpu_ms_per_s"`
	// FullCycle is a full-push cycle's wall time (score + project + xDS
	// build/validate/set, every weight moving) against cells per
	// controller, its median, as measured beside the live fleet.
	FullCycle Linear `json:"full_cycle_ms"`
	// FullCycleCPU is the same cycle's cost: the CPU time of the thread
	// that ran it (bench scale's cycle_cpu_p50_ms), its median. Zero when
	// the runs fitted had no thread clock (reports from before it was
	// measured); the model then takes FullCycle as the cost.
	FullCycleCPU Linear `json:"full_cycle_cpu_ms,omitzero"`
	// CycleSpread is the σ of the lognormal a cycle's cost is drawn from
	// (median FullCycleCPU, or FullCycle, and LiveCycle): the measured
	// P99/P50 ratio of the full-push cycles (their CPU times where
	// measured), ln(ratio)/2.326, which holds what the model leaves out
	// (GC, scheduler) as noise, not as a mechanism.
	CycleSpread float64 `json:"cycle_spread"`
	// LiveCycle is a live controller's score + project per cycle against
	// its cells, and LiveBuild its xDS build per push, both means.
	LiveCycle Linear `json:"live_cycle_ms"`
	LiveBuild Linear `json:"live_build_ms"`
	// PushesPerControllerPerS is one controller's live pushes per second
	// (capped at its cycle rate). Measured, it does not grow with the
	// cells a controller holds: about one a second, whatever changed.
	PushesPerControllerPerS float64 `json:"pushes_per_controller_per_s"`
	// HeartbeatBytes is the mean marshalled heartbeat.
	HeartbeatBytes float64 `json:"heartbeat_bytes"`
	// SummaryBaseBytes + SummaryPerRTTBytes × RTT entries is a region's
	// summary (the entries: every peer, or the k nearest).
	SummaryBaseBytes   float64 `json:"summary_base_bytes"`
	SummaryPerRTTBytes float64 `json:"summary_per_rtt_bytes"`
	// Solve is optimize.Solve's median time against the region count.
	Solve Power `json:"solve_ms"`
}

// RefHeartbeatsPerS is the rate HeartbeatCPUUs is quoted at.
const RefHeartbeatsPerS = 1000

// IngestCores is the controllers' heartbeat CPU (cycles' share included)
// at hb heartbeats per second, in cores.
func (p Params) IngestCores(hb float64) float64 {
	if hb <= 0 {
		return 0
	}
	return p.HeartbeatCPUUs / 1e6 * RefHeartbeatsPerS * math.Pow(hb/RefHeartbeatsPerS, p.HeartbeatCPUExp)
}

// SummaryBytes is one region's summary at regions regions, carrying the
// RTT to its nearest peers (0: to every peer, as the calibration run's
// summaries did).
func (p Params) SummaryBytes(regions, nearest int) float64 {
	entries := regions - 1
	if nearest > 0 && nearest < entries {
		entries = nearest
	}
	return p.SummaryBaseBytes + p.SummaryPerRTTBytes*float64(max(entries, 0))
}

// PushesPerS is one controller's live pushes per second at cycleRate
// cycles per second.
func (p Params) PushesPerS(cycleRate float64) float64 {
	return math.Min(cycleRate, p.PushesPerControllerPerS)
}

// CycleCPU is one controller's live cycle CPU, ms per s, with n cells:
// a cycle each tick and a build each push, at most one core (one
// goroutine runs the cycle; a cycle longer than the tick runs back to
// back and the ticks between are dropped).
func (p Params) CycleCPU(n, cycleRate float64) float64 {
	return math.Min(1000, cycleRate*p.LiveCycle.At(n)+p.PushesPerS(cycleRate)*p.LiveBuild.At(n))
}

// CycleCost is a full-push cycle's cost at n cells per controller, in ms:
// FullCycleCPU where fitted, else FullCycle.
func (p Params) CycleCost(n float64) float64 {
	if p.FullCycleCPU != (Linear{}) {
		return p.FullCycleCPU.At(n)
	}
	return p.FullCycle.At(n)
}
