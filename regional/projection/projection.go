package projection

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/internal/keepwrite"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// Config holds the projection parameters. It is comparable, so that a
// caller can tell the zero value (use DefaultConfig) from a set one.
type Config struct {
	// MaxWeight is the weight of the top band for a cell of relative speed
	// 1. Default 100.
	MaxWeight uint32
	// Bands is the number of weight bands: band k carries MaxWeight/2^k
	// (100, 50, 25 by default). Default 3; 1 to 7.
	Bands int
	// BandHysteresis is the relative margin on every band edge: a capacity
	// fraction must cross an edge by this share of it before the band
	// changes. Default 0.1.
	BandHysteresis float64
	// MinInterval: a band change that does not change which cells are in
	// the load balancer is pushed at most this often. Default 1 s.
	MinInterval time.Duration
	// DrainRamp: a Draining cell's capacity fraction falls linearly to 0
	// over this long (stepping down through the bands), then the endpoint
	// is removed. Default 5 s.
	DrainRamp time.Duration
	Penalty   PenaltyConfig
	Derate    DerateConfig
}

// PenaltyConfig parameterises error-rate outlier penalties and the
// count-bounded probation that follows them (see penalty).
type PenaltyConfig struct {
	// ErrorThreshold: an error rate above this is an outlier. Default 0.05.
	ErrorThreshold float64
	// MinRequests: requests the cell must have seen in its window before
	// its error rate can trip a penalty. Default 4. On probation a single
	// failing request is enough.
	MinRequests float64
	// ProbeRequests: on probation, the probe slot of each hold window
	// closes once the cell has reported this many requests since it
	// opened. Default 3. The control plane learns the count from the
	// cell's heartbeats, so up to one heartbeat's worth more may arrive;
	// an exact bound needs the data plane (see doc.go).
	ProbeRequests float64
	// ProbeSlot: the longest a probe slot stays open. Default 1 s.
	ProbeSlot time.Duration
	// BaseHold: how long a tripped cell stays out of the load balancer;
	// doubled for each consecutive trip, up to MaxHold. It is also the
	// probation window: one probe slot per hold. Defaults 5 s and 60 s.
	BaseHold time.Duration
	MaxHold  time.Duration
	// ClearAfter: a cell whose penalty cleared and that stays clean this
	// long has its trip count reset. Default 30 s.
	ClearAfter time.Duration
	// MaxHeldPercent caps the cells under a penalty at once, as a share of
	// the Ready cells, like Envoy's max_ejection_percent: a new trip that
	// would pass it does not happen (the cell keeps its weight; the data
	// plane's own outlier detection still applies), except that one cell
	// may always be held. It keeps a fleet-wide error burst — an overload,
	// a bad client — from emptying a region's load balancer. Default 50.
	MaxHeldPercent float64
	// MaxLoadAfterHold caps what a penalty may cost in capacity: a cell is
	// held (or kept held) only while the rest of its pool, the Ready cells
	// of its model, would carry the pool's load at no more than this share
	// of their capacity (Cell.Utilisation × ready / (ready − held)). A cell
	// failing a share of its requests fast still serves the rest, and its
	// failures are retried elsewhere; holding it out when the others cannot
	// carry its load turns a partial brownout into an overload of the
	// whole pool. A cell whose error rate is above MaxKeptErrorRate is
	// held whatever the load: it serves too little to be worth the
	// retries. 0 turns the cap off. Default 0.9.
	//
	// Envoy's counterpart is count-based, not load-based: its panic
	// threshold (common_lb_config.healthy_panic_threshold, default 50 %;
	// source/common/upstream/load_balancer_impl.cc, isHostSetInPanic)
	// balances over every host, ejected or not, once too few are healthy,
	// and outlier detection's max_ejection_percent (default 10 %) caps the
	// ejected share. MaxHeldPercent is the latter; this is what neither
	// can see: whether the hosts left can carry the load.
	MaxLoadAfterHold float64
	// MaxKeptErrorRate: above this error rate, on at least
	// KeptEvidenceRequests requests, a cell is held even when its pool
	// needs its capacity (see MaxLoadAfterHold). The evidence matters: a
	// held cell sees only probes, and one failure in two probes is no
	// proof that it fails half its requests. Defaults 0.5 and 20.
	MaxKeptErrorRate     float64
	KeptEvidenceRequests float64
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		MaxWeight:      100,
		Bands:          3,
		BandHysteresis: 0.1,
		MinInterval:    time.Second,
		DrainRamp:      5 * time.Second,
		Penalty: PenaltyConfig{
			ErrorThreshold: 0.05,
			MinRequests:    4,
			ProbeRequests:  3,
			ProbeSlot:      time.Second,
			BaseHold:       5 * time.Second,
			MaxHold:        60 * time.Second,
			ClearAfter:     30 * time.Second,
			MaxHeldPercent: 50,
			// A pool at 90 % of its capacity at SLO has 10 % headroom:
			// holding out more than that overloads the rest.
			MaxLoadAfterHold:     0.9,
			MaxKeptErrorRate:     0.5,
			KeptEvidenceRequests: 20,
		},
		Derate: DerateConfig{On: 1, Off: 0.6, MinHold: 10 * time.Second},
	}
}

// ErrInvalidConfig is wrapped by Validate errors; test with errors.Is.
var ErrInvalidConfig = errors.New("projection: invalid config")

// Validate reports the first invalid field.
func (c Config) Validate() error {
	p := c.Penalty
	checks := []struct {
		msg string
		ok  bool
	}{
		{"MaxWeight must be in [1, 10000]", c.MaxWeight >= 1 && c.MaxWeight <= 10000},
		{"Bands must be in [1, 7]", c.Bands >= 1 && c.Bands <= maxBands},
		{"BandHysteresis must be in [0, 0.3]", c.BandHysteresis >= 0 && c.BandHysteresis <= 0.3},
		{"MinInterval must be >= 0", c.MinInterval >= 0},
		{"DrainRamp must be >= 0", c.DrainRamp >= 0},
		{"Penalty.ErrorThreshold must be in (0, 1)", p.ErrorThreshold > 0 && p.ErrorThreshold < 1},
		{"Penalty.MaxHeldPercent must be in [0, 100]", p.MaxHeldPercent >= 0 && p.MaxHeldPercent <= 100},
		{"Penalty.MaxLoadAfterHold must be 0 (off) or in (0, 10]", p.MaxLoadAfterHold >= 0 && p.MaxLoadAfterHold <= 10},
		{"Penalty.MaxKeptErrorRate must be in [0, 1]", p.MaxKeptErrorRate >= 0 && p.MaxKeptErrorRate <= 1},
		{"Penalty.KeptEvidenceRequests must be >= 1", p.KeptEvidenceRequests >= 1},
		{"Penalty.MinRequests must be >= 0", p.MinRequests >= 0},
		{"Penalty.ProbeRequests must be >= 1", p.ProbeRequests >= 1},
		{"Penalty.ProbeSlot must be > 0 and <= BaseHold", p.ProbeSlot > 0 && p.ProbeSlot <= p.BaseHold},
		{"Penalty.BaseHold must be > 0 and <= MaxHold", p.BaseHold > 0 && p.BaseHold <= p.MaxHold},
		{"Penalty.ClearAfter must be >= 0", p.ClearAfter >= 0},
		{"Derate.Off must be >= 0 and below Derate.On", c.Derate.Off >= 0 && c.Derate.Off < c.Derate.On},
		{"Derate.On must be <= 1", c.Derate.On <= 1},
		{"Derate.MinHold must be >= 0", c.Derate.MinHold >= 0},
	}
	for _, ch := range checks {
		if !ch.ok {
			return fmt.Errorf("%w: %s", ErrInvalidConfig, ch.msg)
		}
	}
	return nil
}

// Cell is one cell's input to a projection.
type Cell struct {
	ID    string
	State lifecycle.State
	// Pressure is the cell's composite load pressure in [0,1]. It explains
	// and alerts (and feeds the regional summary) but does not move the
	// weight: load balancing among eligible cells is the data plane's job.
	Pressure float64
	// ErrorRate over the agent's window, the number of requests it saw, and
	// whether the rate is known at all.
	ErrorRate     float64
	ErrorRequests float64
	ErrorOK       bool
	// Thermal is the normalised thermal signal (score.Thermal: the
	// temperature ramp, 1 when a throttle bit is set), when ThermalOK.
	Thermal   float64
	ThermalOK bool
	// HardwareFault reports a PCIe or DRAM fault (or another hardware
	// error) that derates the cell. Hook: no heartbeat carries one yet.
	HardwareFault bool
	// Speed is the cell's measured relative speed (its capacity class),
	// 1 for the fastest class; 0 means unknown and counts as 1. Hook: the
	// registry does not measure it yet, so every cell is full speed.
	Speed float64
	// ContextShare is the cell's declared max_model_len over the longest
	// declared by its model's cells; 0 (unknown) or 1 counts as full. A
	// cell below 1 cannot hold every prompt of its model: its Published
	// weight, used in the model's main cluster (requests of unknown size),
	// is 1, and its band weight is its ClassWeight, used in the
	// context-class clusters whose prompts it holds.
	ContextShare float64
	// Pool groups the cells that stand in for each other (the cells of one
	// model); Utilisation is the pool's load over the capacity of its
	// Ready cells, 0 when unknown. Together they bound the capacity a
	// penalty may take (PenaltyConfig.MaxLoadAfterHold).
	Pool        string
	Utilisation float64
}

// Weight is one cell's projected weight.
type Weight struct {
	ID string
	// Published is the weight the data plane has (or will have after this
	// push): 0 means not in the load balancer.
	Published uint32
	// Target is what the cell's state alone would give now.
	Target uint32
	// ClassWeight, when not 0, is the weight in the context-class clusters
	// the cell fits, Published being 1: the cell's ContextShare is below 1
	// (see Cell.ContextShare). It follows Published: 0 while the cell is
	// out.
	ClassWeight uint32
	// Band names the band behind Target: "full", "1/2", "1/4", ...,
	// "probe" (a probation probe slot) or "out"; BandReason says why.
	Band       string
	BandReason string
	// Degraded: a hardware derate is active; the endpoint is published
	// with EDS health DEGRADED (its weight is unchanged).
	Degraded bool
	// ProbeBudget is Penalty.ProbeRequests while the cell is in a probe
	// slot (Band "probe"), else 0: the requests a data plane that counts
	// them should send it before the slot closes.
	ProbeBudget uint32
	// Penalty is the outlier penalty level: 1 while held out, 0.5 on
	// probation, 0 otherwise; Probation is set while a cell that tripped is
	// being re-admitted on probes.
	Penalty   float64
	Probation bool
	Trips     int
}

// Decision is the result of one projection.
type Decision struct {
	// Weights of every cell passed in, in input order. The Projector
	// reuses this buffer: it is valid until the next Project call (a
	// caller that keeps weights copies them, as views do).
	Weights []Weight
	// Same[i] reports that Weights[i] equals the weight the previous
	// Project gave the same cell at the same position (false for a cell
	// that was not there), so that a caller that keeps weights need not
	// compare them. A reused buffer too, valid until the next Project.
	Same []bool
	// Push says the published weights changed and must be sent.
	Push bool
	// Urgent says the change must go out now (membership change, a new
	// penalty or a derate change), not wait for the rate limit.
	Urgent bool
	// Reason explains Push, for logs.
	Reason string
	// NewTrips lists cells whose penalty tripped in this projection.
	NewTrips []string
	// Kept lists cells above the error threshold that stayed in (or
	// returned to) the load balancer in this projection because their
	// pool needs their capacity (PenaltyConfig.MaxLoadAfterHold).
	Kept []string
}

// Projector keeps the published weights between projections.
type Projector struct {
	cfg      Config
	cells    map[string]*cellState
	lastPush time.Time
	pushed   bool
	gen      uint64
	targets  []target
	pool     map[string]*poolLoad // per pool, rebuilt each projection
	// states holds the state of each cell of the current projection, in
	// its order; prev the last projection's. A cell at the same position
	// as last time is found there without a map lookup (at 10,000 cells
	// the three lookups per cell were a fifth of the projection).
	states, prev []*cellState
	// weights is the buffer of Decision.Weights, reused by each
	// projection: at 10,000 cells it was a sixth of a cycle's garbage.
	weights []Weight
	same    []bool // the buffer of Decision.Same
	// bands are cfg's band edges and weights.
	bands bands
	// fresh counts the cells of the current projection seen for the
	// first time in it (resolve): when the states held are exactly those,
	// none is left to forget.
	fresh int
	// settled[i] is what the cell at position i was projected from when
	// the projection that last wrote the entry (gen) left it settled
	// (settledAfter); skip[i] says the current projection keeps that
	// cell's target and weight (skippable). noSkip turns skipping off: the
	// tests project the same inputs both ways and compare.
	settled []settled
	skip    []bool
	noSkip  bool
}

// settled is one position's entry in Projector.settled: the cell there
// and the inputs its target and weight came from, besides those that
// cannot move a settled cell's (Pressure, Utilisation, an error rate
// below the threshold).
type settled struct {
	id           string
	gen          uint64 // the projection that settled it; 0: not settled
	state        lifecycle.State
	speed, share float64
}

type cellState struct {
	id         string
	gen        uint64 // projection that last saw the cell
	published  uint32
	degraded   bool // as published
	band       int  // current band, -1 before the first
	drainStart time.Time
	draining   bool
	pen        penalty
	der        derate
	kept       bool // above the error threshold, kept for its pool's capacity
}

// target is what one cell should have now.
type target struct {
	weight   uint32
	degraded bool
	band     string
	reason   string
}

// New returns a Projector; cfg must be valid.
func New(cfg Config) (*Projector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Projector{cfg: cfg, cells: make(map[string]*cellState), pool: make(map[string]*poolLoad),
		bands: newBands(cfg.Bands, cfg.BandHysteresis, cfg.MaxWeight)}, nil
}

// Project computes weights for cells at now. Cells missing from the input
// are forgotten (and leave the load balancer).
func (p *Projector) Project(now time.Time, cells []Cell) Decision {
	var d Decision
	prevW := p.weights // the last projection's weights, overwritten in place below
	// The buffers keep last cycle's elements (keepwrite.Resize): only
	// what changed is written (keepwrite.Set's reason), and a settled
	// cell keeps its weight (markSkips).
	d.Weights = keepwrite.Resize(p.weights, len(cells))
	d.Same = keepwrite.Resize(p.same, len(cells))
	p.gen++
	p.resolve(cells)
	p.markSkips(cells)
	targets, urgentReason, driftReason := p.evaluate(now, cells, &d)
	p.targets = targets
	if r := p.forgetRemoved(); urgentReason == "" {
		urgentReason = r
	}

	switch {
	case urgentReason != "":
		d.Push, d.Urgent, d.Reason = true, true, urgentReason
	case driftReason != "" && (!p.pushed || now.Sub(p.lastPush) >= p.cfg.MinInterval):
		d.Push, d.Reason = true, driftReason
	}
	if d.Push {
		p.lastPush, p.pushed = now, true
	}
	for i, c := range cells {
		if p.skip[i] {
			// Settled with the same inputs: its weight is the one last
			// projection gave it, which the buffer holds (markSkips).
			d.Same[i], p.settled[i].gen = true, p.gen
			continue
		}
		w := p.weight(p.states[i], c, targets[i], d.Push)
		p.settled[i] = p.settledAfter(p.states[i], c, targets[i])
		// prevW[i] is d.Weights[i] unless the buffer grew; a Weight
		// carries its cell's ID, so an equal one is the same cell's. The
		// comparison that sets Same also spares writing an equal weight
		// over itself (keepwrite's reason).
		same := i < len(prevW) && prevW[i] == w
		d.Same[i] = same
		if !same || &d.Weights[i] != &prevW[i] {
			d.Weights[i] = w
		}
	}
	p.weights, p.same = d.Weights, d.Same
	return d
}

// resolve sets p.states to the state of each of cells (made for a cell
// seen for the first time), marked seen in this generation.
func (p *Projector) resolve(cells []Cell) {
	p.prev, p.states = p.states, slices.Grow(p.prev[:0], len(cells))[:len(cells)]
	p.fresh = 0
	for i := range cells {
		id := cells[i].ID
		var st *cellState
		if i < len(p.prev) && p.prev[i].id == id {
			st = p.prev[i] // seen last generation, so still in p.cells
		} else if st = p.cells[id]; st == nil {
			st = &cellState{id: id, band: -1}
			p.cells[id] = st
		}
		if st.gen != p.gen {
			p.fresh++ // the first time this cell is seen in this projection
		}
		st.gen = p.gen
		keepwrite.Set(&p.states[i], st) // mostly the state it held two generations ago
	}
}

// evaluate updates every cell's penalty and computes its target, recording
// new trips in d; it returns the targets in the order of cells and the
// first reason for an urgent push and for a drift push ("" when none).
func (p *Projector) evaluate(now time.Time, cells []Cell, d *Decision) (targets []target, urgentReason, driftReason string) {
	targets = keepwrite.Resize(p.targets, len(cells)) // last cycle's, written where changed
	held, ready := p.pools(cells)
	var pl *poolLoad // c's pool: cells of one pool mostly come in runs
	plName := ""
	for i, c := range cells {
		if p.skip[i] {
			continue // settled, and its inputs the same: target unchanged (markSkips)
		}
		st := p.states[i]
		if pl == nil || c.Pool != plName {
			pl, plName = p.pool[c.Pool], c.Pool
		}
		capOK, kept := p.capacityGate(now, st, c, pl, &held)
		st.kept = kept
		if kept {
			d.Kept = append(d.Kept, c.ID)
		}
		wasClear := st.pen.phase == phaseClear
		countOK := held == 0 || float64(held+1)*100 <= p.cfg.Penalty.MaxHeldPercent*float64(ready)
		allowTrip := !wasClear || (countOK && capOK)
		if st.pen.update(now, p.cfg.Penalty, c, allowTrip) {
			if wasClear && c.State == lifecycle.Ready {
				pl.held++
			}
			if wasClear {
				held++
			}
			d.NewTrips = append(d.NewTrips, c.ID)
			if st.published > 0 && urgentReason == "" {
				urgentReason = "penalty tripped on " + c.ID
			}
		}
		t := p.target(now, st, c)
		keepwrite.Set(&targets[i], t)
		switch {
		case (st.published == 0) != (t.weight == 0):
			if urgentReason == "" {
				urgentReason = fmt.Sprintf("%s entered or left the load balancer (%d→%d)", c.ID, st.published, t.weight)
			}
		case t.weight > 0 && st.published != t.weight && st.pen.justCleared:
			if urgentReason == "" {
				urgentReason = fmt.Sprintf("%s penalty cleared (%d→%d)", c.ID, st.published, t.weight)
			}
		case t.weight > 0 && st.degraded != t.degraded:
			if urgentReason == "" {
				urgentReason = fmt.Sprintf("%s hardware derate %v→%v", c.ID, st.degraded, t.degraded)
			}
		case st.published != t.weight && driftReason == "":
			driftReason = fmt.Sprintf("%s weight %d→%d (band %s: %s)", c.ID, st.published, t.weight, t.band, t.reason)
		}
	}
	return targets, urgentReason, driftReason
}

// forgetRemoved drops the state of cells absent from this generation and
// returns the urgent reason the first published one gives ("" when none).
func (p *Projector) forgetRemoved() string {
	if len(p.cells) == p.fresh {
		return "" // every state held was seen in this generation
	}
	reason := ""
	for id, st := range p.cells {
		if st.gen != p.gen {
			if st.published > 0 && reason == "" {
				reason = id + " removed"
			}
			delete(p.cells, id)
		}
	}
	return reason
}

// weight publishes the cell's target when the decision pushes and returns
// the cell's Weight.
func (p *Projector) weight(st *cellState, c Cell, t target, push bool) Weight {
	if push {
		st.published, st.degraded = t.weight, t.degraded && t.weight > 0
	}
	w := Weight{
		ID: c.ID, Published: st.published, Target: t.weight, Band: t.band, BandReason: t.reason,
		Degraded: st.degraded, Penalty: st.pen.level(), Probation: st.pen.probation(), Trips: st.pen.trips,
	}
	if constrained(c) && st.published > 0 {
		w.ClassWeight, w.Published = st.published, 1
		w.BandReason += reasonConstrained
	}
	if st.published > 0 && t.band == BandProbe {
		w.ProbeBudget = uint32(math.Ceil(p.cfg.Penalty.ProbeRequests))
	}
	return w
}

// Band reasons that need no formatting.
const (
	reasonFull         = "eligible at full capacity"
	reasonSlow         = "measured relative speed (capacity class)"
	reasonDraining     = "draining: ramping down"
	reasonDrained      = "drained"
	reasonNotReady     = "not ready: "
	reasonHeld         = "error-rate penalty: held out of the load balancer"
	reasonProbeOpen    = "probation: probe slot open"
	reasonProbeWaiting = "probation: probe slot closed, waiting for results or the next hold window"
	reasonDegraded     = "; EDS health DEGRADED: "
	reasonKept         = "; error rate above the threshold, kept: the rest of its pool cannot carry its load"
	reasonConstrained  = "; max_model_len below the model's longest: weight 1 in the main cluster, the band's in the context classes it holds"
)

// constrained reports a cell whose declared context is below its model's
// longest.
func constrained(c Cell) bool { return c.ContextShare > 0 && c.ContextShare < 1 }

// target is the weight, health and band c should have from its state and
// slow signals alone.
func (p *Projector) target(now time.Time, st *cellState, c Cell) target {
	if c.State != lifecycle.Draining {
		st.draining = false
	}
	degraded := st.der.update(now, p.cfg.Derate, c)
	speed := c.Speed
	if !(speed > 0) || speed > 1 {
		speed = 1
	}
	var t target
	switch c.State {
	case lifecycle.Ready:
		switch st.pen.phase {
		case phaseHeld:
			st.band = -1
			return target{band: BandOut, reason: reasonHeld}
		case phaseProbation:
			st.band = -1
			if st.pen.slotOpen {
				t = target{weight: p.bands.weight[p.cfg.Bands-1], band: BandProbe, reason: reasonProbeOpen}
				break
			}
			return target{band: BandOut, reason: reasonProbeWaiting}
		default:
			st.band = p.bands.next(st.band, speed)
			t = target{weight: p.bands.weight[st.band], band: bandNames[st.band], reason: reasonFull}
			if st.band > 0 {
				t.reason = reasonSlow
			}
			if st.kept {
				t.reason += reasonKept
			}
		}
	case lifecycle.Draining:
		if !st.draining {
			st.draining, st.drainStart = true, now
			if st.published == 0 {
				st.band = -1
			}
		}
		left := 0.0
		if p.cfg.DrainRamp > 0 {
			left = 1 - float64(now.Sub(st.drainStart))/float64(p.cfg.DrainRamp)
		}
		if left <= 0 || st.band < 0 {
			st.band = -1
			return target{band: BandOut, reason: reasonDrained}
		}
		st.band = p.bands.next(st.band, speed*left)
		t = target{weight: p.bands.weight[st.band], band: bandNames[st.band], reason: reasonDraining}
	default:
		st.band = -1
		return target{band: BandOut, reason: reasonNotReady + c.State.String()}
	}
	if degraded {
		t.degraded = true
		t.reason += reasonDegraded + st.der.why
	}
	return t
}
