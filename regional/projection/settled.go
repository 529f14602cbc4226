package projection

import (
	"github.com/isobar-mesh/isobar/internal/keepwrite"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// Settled cells. Most cells, most cycles, are Ready at full speed with no
// penalty and no derate, and a new heartbeat moves only their load
// (Pressure, the pool's Utilisation), which never moves a weight. Such a
// cell's next evaluation changes nothing: its penalty stays clear with no
// trips to forget, its derate stays off, its band is where the hysteresis
// left it (bands.next is idempotent for one capacity fraction), and the
// weight it has published is its target. So a projection keeps the target
// and weight of a cell that was settled after the last projection, at the
// same position, when none of what can unsettle it changed: its lifecycle
// state, speed and context share, an error rate on enough requests above
// the threshold (which could trip it) or a derate call. The others are
// evaluated in order, as ever; the count of held cells and the pools'
// loads, which a settled cell's evaluation does not read to any effect
// (capacityGate only refuses or keeps trips), are made from every cell.
// TestSkippingChangesNothing projects random sequences both ways.

// markSkips sets p.skip[i] for each of cells that keeps its target and
// weight (skippable). The target and weight buffers are resized keeping
// their elements (keepwrite.Resize), so each position the last
// projection wrote still holds what it wrote there.
func (p *Projector) markSkips(cells []Cell) {
	n := len(cells)
	p.skip = keepwrite.Resize(p.skip, n)
	p.settled = keepwrite.Resize(p.settled, n)
	for i := range cells {
		p.skip[i] = !p.noSkip && p.skippable(&p.settled[i], &cells[i])
	}
}

// skippable reports whether c, at the position of s, was settled after
// the last projection and comes with the same inputs that count.
func (p *Projector) skippable(s *settled, c *Cell) bool {
	return s.gen != 0 && s.gen == p.gen-1 && s.id == c.ID && s.state == c.State &&
		s.speed == c.Speed && s.share == c.ContextShare &&
		!p.cfg.Penalty.bad(phaseClear, *c) && !p.cfg.Derate.calls(*c)
}

// settledAfter is the entry for c, evaluated into st with target t and
// its weight published or not: settled (gen set) when nothing in st moves
// with time alone and the weight published is the target.
func (p *Projector) settledAfter(st *cellState, c Cell, t target) settled {
	// A penalty just cleared or lifted has trips (trips > 0).
	quiet := st.pen.phase == phaseClear && st.pen.trips == 0 &&
		!st.der.active && !st.kept && !st.draining && c.State != lifecycle.Draining &&
		st.published == t.weight && !st.degraded && !t.degraded
	if !quiet {
		return settled{}
	}
	return settled{id: c.ID, gen: p.gen, state: c.State, speed: c.Speed, share: c.ContextShare}
}
