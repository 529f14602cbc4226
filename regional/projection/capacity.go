package projection

import (
	"math"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// The penalty's capacity bound (PenaltyConfig.MaxLoadAfterHold). A cell
// that fails a share of its requests fast is an outlier worth holding out
// only while the rest of its pool can carry its load: at 90 % load a pool
// of nine cells that holds three out runs the six left at 135 % of their
// capacity, and every request queues, where keeping the three would cost
// one retry for each of their failures. So a trip that would load the rest
// of the pool past the bound does not happen, and a cell already held or
// on probation comes back when the pool's load grows past it.

// poolLoad is one pool's Ready cells, how many of them are held or on
// probation, and its utilisation.
type poolLoad struct {
	ready, held int
	u           float64
}

// pools counts the Ready cells and the penalised ones, region-wide (the
// count cap MaxHeldPercent compares the two) and per pool, into p.pool.
// It runs after markSkips: a cell skipped is settled, so not penalised,
// and its state is not read.
func (p *Projector) pools(cells []Cell) (held, ready int) {
	clear(p.pool)
	var pl *poolLoad
	for i, c := range cells {
		if pl == nil || c.Pool != cells[i-1].Pool {
			if pl = p.pool[c.Pool]; pl == nil {
				pl = &poolLoad{}
				p.pool[c.Pool] = pl
			}
		}
		pl.u = max(pl.u, c.Utilisation)
		penalised := !p.skip[i] && p.states[i].pen.phase != phaseClear // a skipped cell is settled: clear
		if penalised {
			held++
		}
		if c.State == lifecycle.Ready {
			ready++
			pl.ready++
			if penalised {
				pl.held++
			}
		}
	}
	return held, ready
}

// overloads reports whether holding out held of pl's Ready cells would
// load the others past MaxLoadAfterHold. An unknown utilisation (0) or a
// cap of 0 never does.
func (c PenaltyConfig) overloads(pl *poolLoad, held int) bool {
	if c.MaxLoadAfterHold <= 0 || !(pl.u > 0) || held <= 0 {
		return false
	}
	left := pl.ready - held
	if left <= 0 || math.IsInf(pl.u, 1) {
		return true
	}
	return pl.u*float64(pl.ready)/float64(left) > c.MaxLoadAfterHold
}

// keepable reports whether c may serve enough of its requests to be kept
// in the load balancer when its pool needs its capacity: it is Ready and
// not proven to fail more than MaxKeptErrorRate (on KeptEvidenceRequests
// requests at least).
func (c PenaltyConfig) keepable(cell Cell) bool {
	proven := cell.ErrorOK && cell.ErrorRequests >= c.KeptEvidenceRequests && cell.ErrorRate > c.MaxKeptErrorRate
	return cell.State == lifecycle.Ready && !proven
}

// capacityGate applies the bound to cell c before its penalty updates: a
// penalised cell the pool needs is lifted (it returns to its band), and it
// reports whether a new trip may happen as far as capacity goes, and
// whether c is kept in spite of errors (lifted now, or a trip its evidence
// would cause refused). pl is c's pool.
func (p *Projector) capacityGate(now time.Time, st *cellState, c Cell, pl *poolLoad, held *int) (allow, kept bool) {
	cfg := p.cfg.Penalty
	if !cfg.keepable(c) {
		return true, false
	}
	if st.pen.phase != phaseClear && cfg.overloads(pl, pl.held) {
		st.pen.lift(now)
		pl.held--
		*held--
		return false, true
	}
	if st.pen.phase != phaseClear {
		return true, false
	}
	if cfg.overloads(pl, pl.held+1) {
		return false, st.pen.bad(cfg, c)
	}
	return true, false
}
