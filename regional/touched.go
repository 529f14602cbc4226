package regional

import "time"

// A cycle reads only the cells it has to. Everything a cell's view is made
// of (viewIn) changes on an event the registry loop applies: a heartbeat,
// a probe's result, a drain, a stream loss, a transition (the TTL's among
// them). Each of those touches the cell (touch), and so does a data-plane
// report that counts it. The next cycle reads the touched cells, and the
// cells whose data-plane errors move with time alone (a sample leaves the
// window: dpWatch), and keeps every other cell's view, mapping input and
// score as they were (Registry.cellViews). At 10,000 cells a typical
// cycle touches some 2,100 (a heartbeat every 5 cycles, a probe round's
// results every 10); comparing all 10,000, a cache miss or three each in
// a live controller, was about a sixth of its cycle's CPU.
//
// A write that forgets to touch would leave a cell's view stale. Two nets
// catch one: each cycle also compares the viewIn of 1/auditEvery of the
// untouched cells, in turn, with what their views were made of, so every
// cell is compared at least every auditEvery cycles and a stale one is
// read then (and logged as the bug it is); and the registry's tests
// compare every untouched cell every cycle and panic on a miss
// (Registry.auditAll). A cycle whose cells came or went reads every cell.
// Everything here runs on the registry loop.

// auditEvery is how many cycles the rolling comparison of the untouched
// cells takes to go round them all (5 s at the default CycleInterval).
const auditEvery = 50

// dpWatch is a cell (at pos in Registry.order) whose data-plane errors
// were not empty when last read: they change when a report comes (which
// touches the cell) or when the oldest sample leaves the window, after
// until.
type dpWatch struct {
	pos   int
	until time.Time
}

// touch records that c's viewIn may have changed since the last cycle.
func (r *Registry) touch(c *cell) {
	if !c.touched {
		c.touched = true
		r.touched = append(r.touched, c)
	}
}

// keepWatches carries last's watches over to this cycle, but for the
// cells touched (read this cycle, which watches them again if need be)
// and those whose window has moved since, which it touches.
func (r *Registry) keepWatches(now time.Time, last []dpWatch) {
	for _, w := range last {
		switch c := r.order[w.pos]; {
		case c.touched:
		case now.After(w.until):
			r.touch(c)
		default:
			r.dpAt = append(r.dpAt, w)
		}
	}
}

// compareUntouched compares the viewIn of this cycle's share of the
// untouched cells (all of them with auditAll) with what their published
// views were made of, and touches any that differ.
func (r *Registry) compareUntouched() {
	n := len(r.order)
	if n == 0 {
		return
	}
	k := (n + auditEvery - 1) / auditEvery
	if r.auditAll {
		k = n
	}
	at := r.auditNext % n
	for range k {
		if c := r.order[at]; !c.touched && (c.pub == nil || c.viewIn != c.pubIn) {
			if r.auditAll {
				panic("regional: cell " + c.id + "'s view input changed without a touch (touched.go)")
			}
			r.log.Error("a cell's view input changed without a touch; read now (a registry bug: touched.go)", "cell", c.id)
			r.touch(c)
		}
		if at++; at == n {
			at = 0
		}
	}
	r.auditNext = at
}
