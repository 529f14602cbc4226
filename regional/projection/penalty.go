package projection

import "time"

// penaltyPhase is where a cell stands with its error-rate penalty.
type penaltyPhase uint8

const (
	phaseClear     penaltyPhase = iota // no penalty (trips may still count toward the next hold)
	phaseHeld                          // tripped: out of the load balancer until holdUntil
	phaseProbation                     // hold over: out except for one bounded probe slot per hold window
)

// penalty is one cell's error-rate outlier state.
//
// A cell whose error rate crosses the threshold (on at least MinRequests
// requests) trips: it leaves the load balancer for a hold that doubles with
// every consecutive trip (BaseHold, 2·BaseHold, ... up to MaxHold); error
// evidence seen during the hold extends it. After the hold the cell is on
// probation: every hold window opens with one probe slot, in which the cell
// is published at the lowest band's weight until it has reported
// ProbeRequests requests or ProbeSlot has passed, whichever comes first;
// outside the slot it is out. On probation one failing request is enough
// evidence to trip again; once the cell has reported requests since the
// slot opened and its window holds at least ProbeRequests requests within
// the threshold, the penalty clears (the cell returns to its band). A cleared cell that
// stays clean for ClearAfter has its trip count reset.
//
// There is no share-based floor: a penalised cell gets no traffic except
// the probes.
type penalty struct {
	phase     penaltyPhase
	trips     int
	hold      time.Duration // the current trip's hold
	holdUntil time.Time
	clearedAt time.Time

	// Probation schedule: the current window started at windowStart; its
	// slot is open while slotOpen; baseline is the request count the cell
	// reported when the slot opened.
	windowStart time.Time
	slotOpen    bool
	baseline    float64
	probes      float64 // requests reported since the slot opened

	// justCleared is set by the update that cleared the penalty.
	justCleared bool
}

func (p *penalty) probation() bool { return p.phase == phaseProbation }

// level is the penalty reported in Weight.Penalty: 1 while held, 0.5 on
// probation, 0 when clear.
func (p *penalty) level() float64 {
	switch p.phase {
	case phaseHeld:
		return 1
	case phaseProbation:
		return 0.5
	default:
		return 0
	}
}

// update advances the penalty to now given the cell's latest error rate and
// reports whether it tripped anew. With allowTrip false a clear cell does
// not trip whatever its error rate (the penalty cap is reached).
func (p *penalty) update(now time.Time, cfg PenaltyConfig, c Cell, allowTrip bool) bool {
	p.justCleared = false
	evidence := p.evidence(cfg, c)
	bad := p.bad(cfg, c)
	if bad {
		if p.phase == phaseHeld {
			if until := now.Add(p.hold); until.After(p.holdUntil) {
				p.holdUntil = until
			}
			return false
		}
		if p.phase == phaseClear && !allowTrip {
			return false
		}
		p.trips++
		p.hold = cfg.BaseHold
		for i := 1; i < p.trips && p.hold < cfg.MaxHold; i++ {
			p.hold *= 2
		}
		p.hold = min(p.hold, cfg.MaxHold)
		p.phase, p.holdUntil, p.slotOpen = phaseHeld, now.Add(p.hold), false
		return true
	}
	switch p.phase {
	case phaseHeld:
		if now.Before(p.holdUntil) {
			return false
		}
		p.phase = phaseProbation
		p.openSlot(p.holdUntil, c)
		fallthrough
	case phaseProbation:
		if n := now.Sub(p.windowStart) / p.hold; n > 0 {
			p.openSlot(p.windowStart.Add(n*p.hold), c)
		}
		if c.ErrorRequests > p.baseline {
			p.probes = max(p.probes, c.ErrorRequests-p.baseline)
		}
		// Probes answered, and the cell's window holds at least
		// ProbeRequests requests within the threshold.
		if evidence && p.probes > 0 && c.ErrorRequests >= cfg.ProbeRequests {
			p.phase, p.clearedAt, p.slotOpen, p.justCleared = phaseClear, now, false, true
			return false
		}
		if p.slotOpen && (p.probes >= cfg.ProbeRequests || now.Sub(p.windowStart) >= cfg.ProbeSlot) {
			p.slotOpen = false
		}
	case phaseClear:
		if p.trips > 0 && now.Sub(p.clearedAt) >= cfg.ClearAfter {
			p.trips = 0
		}
	}
	return false
}

// evidence reports whether c's window holds enough requests to judge its
// error rate: MinRequests for a clear cell, a single one on a penalised
// cell (a single failing probe is evidence).
func (p *penalty) evidence(cfg PenaltyConfig, c Cell) bool { return cfg.evidence(p.phase, c) }

// bad reports whether c's error rate, on enough evidence, is above the
// threshold.
func (p *penalty) bad(cfg PenaltyConfig, c Cell) bool { return cfg.bad(p.phase, c) }

// evidence and bad are penalty's for a cell in phase.
func (cfg PenaltyConfig) evidence(phase penaltyPhase, c Cell) bool {
	need := cfg.MinRequests
	if phase != phaseClear {
		need = min(need, 1)
	}
	return c.ErrorOK && c.ErrorRequests >= need && c.ErrorRequests > 0
}

func (cfg PenaltyConfig) bad(phase penaltyPhase, c Cell) bool {
	return cfg.evidence(phase, c) && c.ErrorRate > cfg.ErrorThreshold
}

// lift ends the penalty at now whatever the cell's error rate (its pool
// needs its capacity: PenaltyConfig.MaxLoadAfterHold). The trip count
// stays, so the next hold is as long as if it had cleared.
func (p *penalty) lift(now time.Time) {
	p.phase, p.clearedAt, p.slotOpen, p.justCleared = phaseClear, now, false, true
}

// openSlot starts a probation window at start with its probe slot open.
func (p *penalty) openSlot(start time.Time, c Cell) {
	p.windowStart, p.slotOpen, p.probes = start, true, 0
	p.baseline = max(0, c.ErrorRequests)
}
