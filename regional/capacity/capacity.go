package capacity

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config holds the estimator's parameters. A zero field takes its default
// (see WithDefaults).
type Config struct {
	// PriorRPS is the cold-start prior: one healthy cell's capacity at SLO
	// (requests/s) before any measurement. Default 1.3 (the fitted 70B-AWQ
	// profile's knee).
	PriorRPS float64
	// TTFTSLO is the TTFT P95 the capacity is measured against. Default
	// 1.5 s (the tier-2 SLO).
	TTFTSLO time.Duration
	// KVTarget is the KV-cache use at which a cell counts as full (vLLM
	// starts to preempt near it). Default 0.9.
	KVTarget float64
	// Tau is the time constant over which the measurement and the
	// utilisation are smoothed. Default 30 s.
	Tau time.Duration
	// BaselineTau is how slowly the learned low-load TTFT (T0) follows a
	// higher TTFT seen on a nearly idle engine (at most one running
	// request, none waiting); a lower one is taken at once. Default 10 min.
	BaselineTau time.Duration
	// EvidenceRequests: after this many requests the evidence factor of the
	// confidence is 1 − 1/e. Default 100.
	EvidenceRequests float64
	// StaleAfter: the confidence decays as exp(−age/StaleAfter) with the
	// time since the last heartbeat that showed traffic. Default 5 min.
	StaleAfter time.Duration
	// MinUtilisation bounds the extrapolation from low load: a measurement
	// is at most λ·ρ*/MinUtilisation. Default 0.05.
	MinUtilisation float64
	// MinFraction floors a measurement at MinFraction·PriorRPS, so that no
	// cell is planned at zero capacity from noise. Default 0.05.
	MinFraction float64
	// MaxRPS: a request rate or measurement above this is absurd and the
	// heartbeat is rejected. Default 1e5.
	MaxRPS float64
}

// Defaults.
const (
	DefaultPriorRPS         = 1.3
	DefaultTTFTSLO          = 1500 * time.Millisecond
	DefaultKVTarget         = 0.9
	DefaultTau              = 30 * time.Second
	DefaultBaselineTau      = 10 * time.Minute
	DefaultEvidenceRequests = 100.0
	DefaultStaleAfter       = 5 * time.Minute
	DefaultMinUtilisation   = 0.05
	DefaultMinFraction      = 0.05
	DefaultMaxRPS           = 1e5
)

// Bounds beyond which a heartbeat value is absurd.
const (
	maxCount   = 1e6              // running or waiting requests on one cell
	maxTTFTSec = 24 * 3600        // one day
	maxKV      = 1 + 1e-9         // KV use is a fraction
	maxDt      = 10 * time.Minute // a gap longer than this counts as this
)

// lowLoadRunning: a heartbeat with at most this many running requests and
// none waiting may raise the learned low-load TTFT.
const lowLoadRunning = 1

// ErrConfig is wrapped by the errors of Config.Validate; test with
// errors.Is.
var ErrConfig = errors.New("capacity: invalid config")

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.PriorRPS == 0 {
		c.PriorRPS = DefaultPriorRPS
	}
	if c.TTFTSLO == 0 {
		c.TTFTSLO = DefaultTTFTSLO
	}
	if c.KVTarget == 0 {
		c.KVTarget = DefaultKVTarget
	}
	if c.Tau == 0 {
		c.Tau = DefaultTau
	}
	if c.BaselineTau == 0 {
		c.BaselineTau = DefaultBaselineTau
	}
	if c.EvidenceRequests == 0 {
		c.EvidenceRequests = DefaultEvidenceRequests
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.MinUtilisation == 0 {
		c.MinUtilisation = DefaultMinUtilisation
	}
	if c.MinFraction == 0 {
		c.MinFraction = DefaultMinFraction
	}
	if c.MaxRPS == 0 {
		c.MaxRPS = DefaultMaxRPS
	}
	return c
}

// Validate checks a config after WithDefaults.
func (c Config) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(f, a...)) }
	switch {
	case !(c.PriorRPS > 0) || math.IsInf(c.PriorRPS, 0) || !(c.PriorRPS <= c.MaxRPS):
		return bad("PriorRPS %v: want a value in (0, MaxRPS %v]", c.PriorRPS, c.MaxRPS)
	case c.TTFTSLO <= 0:
		return bad("TTFTSLO %v: want > 0", c.TTFTSLO)
	case !(c.KVTarget > 0 && c.KVTarget <= 1):
		return bad("KVTarget %v: want a share in (0, 1]", c.KVTarget)
	case c.Tau <= 0 || c.BaselineTau <= 0 || c.StaleAfter <= 0:
		return bad("Tau %v, BaselineTau %v, StaleAfter %v: want > 0", c.Tau, c.BaselineTau, c.StaleAfter)
	case !(c.EvidenceRequests > 0) || math.IsInf(c.EvidenceRequests, 0):
		return bad("EvidenceRequests %v: want > 0", c.EvidenceRequests)
	case !(c.MinUtilisation > 0 && c.MinUtilisation < 1):
		return bad("MinUtilisation %v: want a share in (0, 1)", c.MinUtilisation)
	case !(c.MinFraction > 0 && c.MinFraction <= 1):
		return bad("MinFraction %v: want a share in (0, 1]", c.MinFraction)
	case !(c.MaxRPS > 0) || math.IsInf(c.MaxRPS, 0):
		return bad("MaxRPS %v: want a finite value > 0", c.MaxRPS)
	}
	return nil
}

// Sample is what one heartbeat says about a cell's load. A nil field is a
// value the heartbeat did not carry.
type Sample struct {
	// RequestRate: completed requests/s over the agent's window.
	RequestRate *float64
	// Running and Waiting: requests in the batch and in the queue.
	Running, Waiting *float64
	// KVUsage: KV-cache use in [0,1].
	KVUsage *float64
	// TTFTP95: P95 time to first token over the window, in seconds.
	TTFTP95 *float64
}

// Estimate is one cell's capacity at SLO.
type Estimate struct {
	// RPS is the capacity (requests/s): the prior blended with the
	// measurement by Confidence, times the derate Estimate was given.
	// Never 0 for a derate above 0.
	RPS float64
	// Confidence in [0,1] that RPS is measured rather than the prior.
	Confidence float64
	// MeasuredRPS is the smoothed measurement (0 before any).
	MeasuredRPS float64
	// ServedRPS is the smoothed throughput the cell completed within the
	// SLO and without a queue: times the evidence and freshness factors
	// of the confidence, a floor of RPS.
	ServedRPS float64
	// LowLoadTTFT is the learned TTFT P95 at low load, T0 (seconds; 0
	// before the first heartbeat with a TTFT).
	LowLoadTTFT float64
}

// cellState is one cell's running estimate.
type cellState struct {
	last     time.Time // last Observe
	lastLoad time.Time // last sample with traffic
	measured float64   // m from the smoothed inputs; 0 before the first
	util     float64   // u from the smoothed inputs
	served   float64   // smoothed λ of the heartbeats at SLO (demonstrated)
	// Smoothed inputs: λ, TTFT P95 and KV use (0: not seen yet).
	lambda, ttft, kv float64
	requests         float64 // Σ λ·Δt
	t0               float64 // learned low-load TTFT P95 (s); 0 before the first
}

// Estimator keeps one running estimate per cell. Not safe for concurrent
// use (see the package doc).
type Estimator struct {
	cfg      Config
	cells    map[string]*cellState
	rejected uint64
}

// New returns an estimator; cfg takes defaults for its zero fields.
func New(cfg Config) (*Estimator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Estimator{cfg: cfg, cells: map[string]*cellState{}}, nil
}

// Config returns the configuration in use (with defaults).
func (e *Estimator) Config() Config { return e.cfg }

// Rejected counts the samples ignored as bad input since New.
func (e *Estimator) Rejected() uint64 { return e.rejected }

// Forget drops a cell's estimate (the cell left the registry).
func (e *Estimator) Forget(id string) { delete(e.cells, id) }

// Cells returns the ids the estimator holds, in no order.
func (e *Estimator) Cells() []string {
	out := make([]string, 0, len(e.cells))
	for id := range e.cells {
		out = append(out, id)
	}
	return out
}

// ok reports whether v is absent or a finite value in [0, max].
func ok(v *float64, max float64) bool {
	return v == nil || (!math.IsNaN(*v) && *v >= 0 && *v <= max)
}

func val(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

// Observe feeds one heartbeat of cell id taken at now. It returns false
// (and counts it in Rejected) when a value is NaN, infinite, negative or
// absurd: a request rate above MaxRPS, more than a million running or
// waiting requests, KV use above 1, a TTFT above a day. Samples must come
// in time order per cell; an older one is rejected too.
func (e *Estimator) Observe(id string, now time.Time, s Sample) bool {
	if !ok(s.RequestRate, e.cfg.MaxRPS) || !ok(s.Running, maxCount) || !ok(s.Waiting, maxCount) ||
		!ok(s.KVUsage, maxKV) || !ok(s.TTFTP95, maxTTFTSec) {
		e.rejected++
		return false
	}
	st := e.cells[id]
	if st == nil {
		st = &cellState{last: now}
		e.cells[id] = st
	}
	if now.Before(st.last) {
		e.rejected++
		return false
	}
	dt := min(now.Sub(st.last), maxDt)
	st.last = now
	lambda := val(s.RequestRate)
	if lambda <= 0 {
		return true // no traffic: nothing measured, the estimate holds
	}
	hasT := s.TTFTP95 != nil && *s.TTFTP95 > 0
	hasK := s.KVUsage != nil && *s.KVUsage > 0
	if !hasT && !hasK {
		return true // neither TTFT nor KV use: not a measurement
	}
	st.requests += lambda * dt.Seconds()
	a := 1 - math.Exp(-dt.Seconds()/e.cfg.Tau.Seconds())
	// The inputs are smoothed, not m: m is convex in TTFT (1/ρ), so
	// smoothing it would let noisy windows bias it upward.
	smooth := func(avg *float64, v float64) {
		if *avg == 0 {
			*avg = v
		} else {
			*avg += a * (v - *avg)
		}
	}
	smooth(&st.lambda, lambda)
	if hasT {
		e.learnT0(st, *s.TTFTP95, dt, s)
		smooth(&st.ttft, *s.TTFTP95)
	}
	if hasK {
		smooth(&st.kv, *s.KVUsage)
	}
	st.measured, st.util = e.measure(st)
	// Demonstrated: the cell completed λ within the SLO without a queue.
	atSLO := s.TTFTP95 != nil && *s.TTFTP95 <= e.cfg.TTFTSLO.Seconds() && val(s.Waiting) < 1
	switch {
	case !atSLO:
		st.served -= a * st.served
	case st.served == 0:
		st.served = lambda
	default:
		st.served += a * (lambda - st.served)
	}
	st.lastLoad = now
	return true
}

// learnT0 updates the learned low-load TTFT with a heartbeat's TTFT t.
func (e *Estimator) learnT0(st *cellState, t float64, dt time.Duration, s Sample) {
	switch {
	case st.t0 == 0 || t < st.t0:
		st.t0 = t
	case s.Running != nil && *s.Running <= lowLoadRunning && val(s.Waiting) == 0:
		// Only a nearly idle engine shows T0 (for the mix it serves now);
		// a loaded one's TTFT would drag T0 up to itself.
		st.t0 += (t - st.t0) * (1 - math.Exp(-dt.Seconds()/e.cfg.BaselineTau.Seconds()))
	}
}

// measure computes the measurement m and the utilisation u (see the
// package doc) from the smoothed inputs; at least one of TTFT and KV use
// has been seen.
func (e *Estimator) measure(st *cellState) (m, u float64) {
	slo := e.cfg.TTFTSLO.Seconds()
	m = math.Inf(1)
	if st.ttft > 0 {
		t0 := math.Min(st.t0, slo)
		rhoStar := math.Max(1-t0/slo, e.cfg.MinUtilisation)
		rho := min(max(1-t0/st.ttft, e.cfg.MinUtilisation), 1)
		m = st.lambda * rhoStar / rho
		u = rho / rhoStar
	}
	if st.kv > 0 {
		m = math.Min(m, st.lambda*e.cfg.KVTarget/st.kv)
		u = math.Max(u, st.kv/e.cfg.KVTarget)
	}
	m = min(max(m, e.cfg.MinFraction*e.cfg.PriorRPS), e.cfg.MaxRPS)
	return m, min(max(u, 0), 1)
}

// Estimate returns cell id's capacity at now, scaled by derate in [0,1]
// (1 − the cell's outlier penalty; values outside are clamped). A cell
// the estimator has not seen gets the prior with confidence 0.
func (e *Estimator) Estimate(id string, now time.Time, derate float64) Estimate {
	if math.IsNaN(derate) {
		derate = 1
	}
	derate = min(max(derate, 0), 1)
	prior := e.cfg.PriorRPS
	st := e.cells[id]
	if st == nil || st.measured == 0 {
		out := Estimate{RPS: prior * derate}
		if st != nil {
			out.LowLoadTTFT = st.t0
		}
		return out
	}
	fresh := 1.0
	if age := now.Sub(st.lastLoad); age > 0 {
		fresh = math.Exp(-age.Seconds() / e.cfg.StaleAfter.Seconds())
	}
	evidence := 1 - math.Exp(-st.requests/e.cfg.EvidenceRequests)
	c := min(max(st.util*st.util*evidence*fresh, 0), 1)
	rps := max((1-c)*prior+c*st.measured, st.served*evidence*fresh)
	return Estimate{
		RPS:         rps * derate,
		Confidence:  c,
		MeasuredRPS: st.measured,
		ServedRPS:   st.served,
		LowLoadTTFT: st.t0,
	}
}
