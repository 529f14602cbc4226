package projection

import (
	"math"
	"time"
)

// penalty is one cell's error-rate outlier state: a level in [0,1] that
// jumps to 1 when the cell's error rate crosses the threshold, holds for a
// time that doubles with every consecutive trip, then decays exponentially.
// While the level is below one half after a trip the cell is on probation
// (which starts one half-life after the hold ends); clean for ClearAfter
// after that, its trip count resets.
type penalty struct {
	level      float64
	trips      int
	holdUntil  time.Time
	lastUpdate time.Time
}

func (p *penalty) probation() bool { return p.trips > 0 && p.level < 0.5 }

// update advances the penalty to now given the cell's latest error rate and
// reports whether it tripped anew.
func (p *penalty) update(now time.Time, cfg PenaltyConfig, c Cell) bool {
	defer func() { p.lastUpdate = now }()
	bad := c.ErrorOK && c.ErrorRequests >= cfg.MinRequests && c.ErrorRate > cfg.ErrorThreshold
	if bad {
		tripped := p.level < 0.5
		if tripped {
			p.trips++
		}
		hold := cfg.BaseHold
		for i := 1; i < p.trips && hold < cfg.MaxHold; i++ {
			hold *= 2
		}
		hold = min(hold, cfg.MaxHold)
		p.level = 1
		if until := now.Add(hold); until.After(p.holdUntil) {
			p.holdUntil = until
		}
		return tripped
	}
	if p.level > 0 && now.After(p.holdUntil) {
		from := p.lastUpdate
		if from.Before(p.holdUntil) {
			from = p.holdUntil
		}
		if dt := now.Sub(from); dt > 0 {
			p.level *= math.Exp2(-float64(dt) / float64(cfg.HalfLife))
		}
		if p.level < 0.01 {
			p.level = 0
		}
	}
	if p.trips > 0 && p.level < 0.5 && now.Sub(p.holdUntil.Add(cfg.HalfLife)) >= cfg.ClearAfter {
		p.trips = 0
	}
	return false
}
