// Package projection turns per-cell pressure and lifecycle state into the
// integer endpoint weights the data plane receives, with hysteresis, drain
// ramps and decaying error-rate outlier penalties (DESIGN.md §3).
//
// A Projector holds the weights last published and each cell's penalty; it
// does no I/O and reads no clock (now is an argument). It is not safe for
// concurrent use: the regional registry goroutine owns it.
//
// Publishing rules:
//   - a change of the set of cells in the load balancer (a cell becomes Ready,
//     fails, finishes draining) or a newly tripped penalty is pushed at once;
//   - otherwise weights are pushed only when one moved by more than
//     max(AbsThreshold, RelThreshold·published), at most once per MinInterval.
package projection

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// Config holds the projection parameters.
type Config struct {
	// MaxWeight is the weight of an idle healthy cell. Default 100.
	MaxWeight uint32
	// Gamma sharpens the pressure → weight curve:
	// weight = MaxWeight·(1−pressure)^Gamma·penaltyMultiplier, at least 1.
	// Default 2.
	Gamma float64
	// RelThreshold and AbsThreshold: hysteresis. Defaults 0.15 and 3.
	RelThreshold float64
	AbsThreshold uint32
	// MinInterval: non-urgent pushes happen at most this often. Default 1 s.
	MinInterval time.Duration
	// DrainRamp: a Draining cell's weight falls linearly to 0 over this
	// long, then the endpoint is removed. Default 5 s.
	DrainRamp time.Duration
	Penalty   PenaltyConfig
}

// PenaltyConfig parameterises error-rate outlier penalties.
type PenaltyConfig struct {
	// ErrorThreshold: an error rate above this is an outlier. Default 0.05.
	ErrorThreshold float64
	// MinRequests: requests the agent must have seen in its window before
	// its error rate is trusted. Default 4.
	MinRequests float64
	// Floor: weight multiplier while fully penalised. Default 0.02 (the
	// cell keeps a trickle of traffic, so recovery can be observed).
	Floor float64
	// BaseHold: how long a tripped penalty stays at full strength; doubled
	// for each consecutive trip, up to MaxHold. Defaults 5 s and 60 s.
	BaseHold time.Duration
	MaxHold  time.Duration
	// HalfLife: after the hold the penalty decays exponentially. Default 5 s.
	HalfLife time.Duration
	// ClearAfter: a cell on probation that stays clean this long has its
	// trip count reset. Default 30 s.
	ClearAfter time.Duration
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		MaxWeight:    100,
		Gamma:        2,
		RelThreshold: 0.15,
		AbsThreshold: 3,
		MinInterval:  time.Second,
		DrainRamp:    5 * time.Second,
		Penalty: PenaltyConfig{
			ErrorThreshold: 0.05,
			MinRequests:    4,
			Floor:          0.02,
			BaseHold:       5 * time.Second,
			MaxHold:        60 * time.Second,
			HalfLife:       5 * time.Second,
			ClearAfter:     30 * time.Second,
		},
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
		{"Gamma must be in (0, 10]", c.Gamma > 0 && c.Gamma <= 10},
		{"RelThreshold must be in [0, 1)", c.RelThreshold >= 0 && c.RelThreshold < 1},
		{"MinInterval must be >= 0", c.MinInterval >= 0},
		{"DrainRamp must be >= 0", c.DrainRamp >= 0},
		{"Penalty.ErrorThreshold must be in (0, 1)", p.ErrorThreshold > 0 && p.ErrorThreshold < 1},
		{"Penalty.MinRequests must be >= 0", p.MinRequests >= 0},
		{"Penalty.Floor must be in (0, 1]", p.Floor > 0 && p.Floor <= 1},
		{"Penalty.BaseHold must be > 0 and <= MaxHold", p.BaseHold > 0 && p.BaseHold <= p.MaxHold},
		{"Penalty.HalfLife must be > 0", p.HalfLife > 0},
		{"Penalty.ClearAfter must be >= 0", p.ClearAfter >= 0},
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
	ID       string
	State    lifecycle.State
	Pressure float64 // [0,1]
	// ErrorRate over the agent's window, the number of requests it saw, and
	// whether the rate is known at all.
	ErrorRate     float64
	ErrorRequests float64
	ErrorOK       bool
}

// Weight is one cell's projected weight.
type Weight struct {
	ID string
	// Published is the weight the data plane has (or will have after this
	// push): 0 means not in the load balancer.
	Published uint32
	// Target is what the current signals alone would give.
	Target uint32
	// Penalty is the outlier penalty level in [0,1]; Probation is set while
	// a cell that tripped is being re-admitted.
	Penalty   float64
	Probation bool
	Trips     int
}

// Decision is the result of one projection.
type Decision struct {
	// Weights of every cell passed in, in input order.
	Weights []Weight
	// Push says the published weights changed and must be sent.
	Push bool
	// Urgent says the change must go out now (membership change or a new
	// penalty), not wait for the rate limit.
	Urgent bool
	// Reason explains Push, for logs.
	Reason string
	// NewTrips lists cells whose penalty tripped in this projection.
	NewTrips []string
}

// Projector keeps the published weights between projections.
type Projector struct {
	cfg      Config
	cells    map[string]*cellState
	lastPush time.Time
	pushed   bool
	gen      uint64
	targets  []uint32
}

type cellState struct {
	gen        uint64 // projection that last saw the cell
	published  uint32
	drainStart time.Time
	drainFrom  uint32
	draining   bool
	pen        penalty
}

// New returns a Projector; cfg must be valid.
func New(cfg Config) (*Projector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Projector{cfg: cfg, cells: make(map[string]*cellState)}, nil
}

// Project computes weights for cells at now. Cells missing from the input
// are forgotten (and leave the load balancer).
func (p *Projector) Project(now time.Time, cells []Cell) Decision {
	var d Decision
	d.Weights = make([]Weight, 0, len(cells))
	p.gen++
	urgentReason, driftReason := "", ""
	targets := p.targets[:0]

	for _, c := range cells {
		st := p.cells[c.ID]
		if st == nil {
			st = &cellState{}
			p.cells[c.ID] = st
		}
		st.gen = p.gen
		if st.pen.update(now, p.cfg.Penalty, c) {
			d.NewTrips = append(d.NewTrips, c.ID)
			if st.published > 0 && urgentReason == "" {
				urgentReason = "penalty tripped on " + c.ID
			}
		}
		target := p.target(now, st, c)
		targets = append(targets, target)
		switch {
		case (st.published == 0) != (target == 0):
			if urgentReason == "" {
				urgentReason = fmt.Sprintf("%s entered or left the load balancer (%d→%d)", c.ID, st.published, target)
			}
		case p.moved(st.published, target) && driftReason == "":
			driftReason = fmt.Sprintf("%s weight %d→%d", c.ID, st.published, target)
		}
	}
	p.targets = targets
	for id, st := range p.cells {
		if st.gen != p.gen {
			if st.published > 0 && urgentReason == "" {
				urgentReason = id + " removed"
			}
			delete(p.cells, id)
		}
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
		st := p.cells[c.ID]
		if d.Push {
			st.published = targets[i]
		}
		d.Weights = append(d.Weights, Weight{
			ID: c.ID, Published: st.published, Target: targets[i],
			Penalty: st.pen.level, Probation: st.pen.probation(), Trips: st.pen.trips,
		})
	}
	return d
}

// target is the weight c would get from its current state and signals.
func (p *Projector) target(now time.Time, st *cellState, c Cell) uint32 {
	if c.State != lifecycle.Draining {
		st.draining = false
	}
	switch c.State {
	case lifecycle.Ready:
		return p.healthyWeight(st, c)
	case lifecycle.Draining:
		if !st.draining {
			st.draining, st.drainStart, st.drainFrom = true, now, st.published
		}
		if st.drainFrom == 0 || p.cfg.DrainRamp <= 0 {
			return 0
		}
		left := 1 - float64(now.Sub(st.drainStart))/float64(p.cfg.DrainRamp)
		if left <= 0 {
			return 0
		}
		return uint32(math.Max(1, math.Round(float64(st.drainFrom)*left)))
	default:
		return 0
	}
}

func (p *Projector) healthyWeight(st *cellState, c Cell) uint32 {
	pr := c.Pressure
	if math.IsNaN(pr) {
		pr = 0.5
	}
	pr = math.Min(1, math.Max(0, pr))
	mult := 1 - st.pen.level*(1-p.cfg.Penalty.Floor)
	w := float64(p.cfg.MaxWeight) * math.Pow(1-pr, p.cfg.Gamma) * mult
	return uint32(math.Max(1, math.Round(w)))
}

func (p *Projector) moved(published, target uint32) bool {
	diff := math.Abs(float64(target) - float64(published))
	return diff > 0 && diff >= math.Max(float64(p.cfg.AbsThreshold), p.cfg.RelThreshold*float64(published))
}
