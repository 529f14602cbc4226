package sim

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"
)

// Fault names, as used by the admin API ({"fault": NAME}) and in status
// listings.
const (
	FaultKill        = "kill"
	FaultRestart     = "restart"
	FaultHang        = "hang"
	FaultSlowStart   = "slow_start"
	FaultMaxModelLen = "max_model_len"
	FaultErrors      = "errors"
	FaultThrottle    = "throttle"
	FaultPCIe        = "pcie"
	FaultDCGMDown    = "dcgm_down"
	FaultXID         = "xid"
	FaultClear       = "clear"
)

// Default parameters of faults.
const (
	// DefaultThrottleLead is how long (model time) hardware signals of a
	// thermal throttle precede the engine's slowdown.
	DefaultThrottleLead = 12 * time.Second
	// DefaultPCIeLead is the same for PCIe contention.
	DefaultPCIeLead = 5 * time.Second
	// DefaultErrorStatus is the HTTP status of injected errors.
	DefaultErrorStatus = 500
)

// FaultStatus describes one active fault.
type FaultStatus struct {
	Fault     string    `json:"fault"`
	Severity  float64   `json:"severity,omitempty"`
	Lead      string    `json:"lead,omitempty"`
	Rate      float64   `json:"rate,omitempty"`
	Status    int       `json:"status,omitempty"`
	N         int       `json:"n,omitempty"`
	Advertise *bool     `json:"advertise,omitempty"`
	Code      int       `json:"code,omitempty"`
	Until     time.Time `json:"until,omitzero"`
	Since     time.Time `json:"since,omitzero"`
}

// Hang freezes (on) or thaws (off) the engine like a stopped process:
// connections are accepted but no request on any endpoint (/health and
// /metrics included) is answered and the scheduler takes no step, so
// streams stall. The GPU reads 100 % utilised (a stuck kernel). A kill ends
// a hang; thawing lets everything continue.
func (e *Engine) Hang(on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != StateRunning || on == e.hung {
		return
	}
	e.hung = on
	if on {
		e.unhang = make(chan struct{})
	} else {
		close(e.unhang)
		e.unhang = nil
	}
	e.gpu.SetHung(on)
	e.log.Warn("engine hang changed", "hung", on)
}

// hangGate returns a channel to wait on while the engine is hung, or nil.
func (e *Engine) hangGate() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.hung {
		return nil
	}
	return e.unhang
}

// SlowStart puts the running engine into Loading for d (model time): /health
// and the API answer 503, in-flight requests continue. A no-op unless
// running; use RestartLoading to bring a killed engine back slowly.
func (e *Engine) SlowStart(d time.Duration) {
	if d < 0 {
		d = 0
	}
	sd := e.scaled(d)
	e.mu.Lock()
	if e.state != StateRunning {
		e.mu.Unlock()
		return
	}
	e.loadingUntil = e.clock.Now().Add(sd)
	e.mu.Unlock()
	e.gpu.SetProcess(ProcessLoading, sd)
	e.log.Warn("engine loading", "duration", d)
}

// loading reports whether the engine is Loading at now.
func (e *Engine) loading(now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return now.Before(e.loadingUntil)
}

// SetMaxModelLen makes the engine enforce a context length of n: longer
// requests get HTTP 400 like vLLM. With advertise false, /v1/models keeps
// reporting the configured value (a misconfigured replica nobody declared).
// n <= 0 restores the configured value.
func (e *Engine) SetMaxModelLen(n int, advertise bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n <= 0 {
		n, advertise = e.cfg.MaxModelLen, true
	}
	e.maxLen, e.advertise = n, advertise
}

// maxModelLen returns the enforced and the advertised context length.
func (e *Engine) maxModelLen() (enforced, advertised int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.advertise {
		return e.maxLen, e.maxLen
	}
	return e.maxLen, e.cfg.MaxModelLen
}

// SetErrorRate makes that fraction (0–1) of completion requests fail with
// the given HTTP status (0: DefaultErrorStatus). Rate 0 turns it off.
func (e *Engine) SetErrorRate(rate float64, status int) {
	rate = math.Max(0, math.Min(1, rate))
	if math.IsNaN(rate) {
		rate = 0
	}
	if status == 0 {
		status = DefaultErrorStatus
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errRate, e.errStatus = rate, status
}

// injectError decides whether this request fails on purpose.
func (e *Engine) injectError() (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.errRate > 0 && e.rng.Float64() < e.errRate {
		return e.errStatus, true
	}
	return 0, false
}

// frontendDelay draws a request's frontend latency (real time) from a
// source keyed by the request's body (FNV-1a), not by the engine's own
// sequence: the same request draws the same latency on any engine, on a
// retry, and in a later run, whichever requests came before it. So two
// runs of the lab that replay the same requests (isobar lab --seed) under
// different load balancers see the same per-request draws, as isobar bench
// paper's requests do (common random numbers), and their TTFT differs by
// the placement only. The distribution is unchanged: distinct requests
// draw independently.
func (e *Engine) frontendDelay(body []byte) time.Duration {
	if e.prof.FrontendJitter <= 0 { // fixed: no draw, no need to hash the body
		return e.scaled(e.prof.FrontendLatency)
	}
	h := fnv.New64a()
	h.Write(body)
	return e.scaled(e.prof.FrontendDelay(rand.New(rand.NewPCG(h.Sum64(), frontendSalt))))
}

// frontendSalt is the second word of the frontend draws' PCG seed.
const frontendSalt = 0xf707_e7d0

// newID returns a random hex id for responses.
func (e *Engine) newID() string {
	e.mu.Lock()
	a, b := e.rng.Uint64(), e.rng.Uint64()
	e.mu.Unlock()
	return fmt.Sprintf("%016x%016x", a, b)
}

// Throttle injects thermal throttling (see GPU.Throttle); lead is model
// time. Severity 0 clears it.
func (e *Engine) Throttle(severity float64, lead time.Duration) {
	e.gpu.Throttle(severity, lead)
	e.log.Warn("gpu throttle injected", "severity", severity, "lead", lead)
}

// PCIe injects PCIe contention (see GPU.PCIe); lead is model time.
// Severity 0 clears it.
func (e *Engine) PCIe(severity float64, lead time.Duration) {
	e.gpu.PCIe(severity, lead)
	e.log.Warn("pcie contention injected", "severity", severity, "lead", lead)
}

// ClearFaults lifts a hang, Loading, the max_model_len constraint, error
// injection and the GPU's hardware faults. It does not restart a killed
// engine.
func (e *Engine) ClearFaults() {
	e.Hang(false)
	e.SetMaxModelLen(0, true)
	e.SetErrorRate(0, 0)
	e.mu.Lock()
	wasLoading := e.clock.Now().Before(e.loadingUntil)
	e.loadingUntil = time.Time{}
	running := e.state == StateRunning
	e.mu.Unlock()
	if wasLoading && running {
		e.gpu.SetProcess(ProcessReady, 0)
	}
	e.gpu.ClearFaults()
}

// Faults lists the active faults.
func (e *Engine) Faults() []FaultStatus {
	e.mu.Lock()
	var out []FaultStatus
	now := e.clock.Now()
	if e.state == StateKilled {
		out = append(out, FaultStatus{Fault: FaultKill})
	}
	if e.hung {
		out = append(out, FaultStatus{Fault: FaultHang})
	}
	if e.state == StateRunning && now.Before(e.loadingUntil) {
		out = append(out, FaultStatus{Fault: FaultSlowStart, Until: e.loadingUntil})
	}
	if e.maxLen != e.cfg.MaxModelLen || !e.advertise {
		adv := e.advertise
		out = append(out, FaultStatus{Fault: FaultMaxModelLen, N: e.maxLen, Advertise: &adv})
	}
	if e.errRate > 0 {
		out = append(out, FaultStatus{Fault: FaultErrors, Rate: e.errRate, Status: e.errStatus})
	}
	e.mu.Unlock()
	return append(out, e.gpu.HardwareFaults()...)
}
