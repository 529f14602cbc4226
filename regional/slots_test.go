package regional

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// The registry keeps each cell's cycle.Slot between cycles and remakes
// only those of the views a cycle replaced; the state is built from the
// slots. Through random churn (new heartbeats, suspects, moved and new
// addresses, new cells, probes, terminations), after every cycle: the
// slots are in address order, each is SlotOf the cell's published view,
// each view carries the weight the projection gives its cell, the
// offered state holds exactly the cells whose view has a published
// weight, with that weight, and each cell's offered flag says whether the
// last offer held it.
func TestCycleSlotsFollowTheViews(t *testing.T) {
	const n = 40
	cb := newCycleBenchFleet(t, n, xds.Config{Region: "r1", Zone: "r1"}, true)
	rng := rand.New(rand.NewPCG(7, 11))
	ids := make([]string, 0, n+100)
	eps := map[string]string{}
	for _, hb := range cb.hbs {
		ids = append(ids, hb.CellId)
		eps[hb.CellId] = hb.Endpoint
	}
	seq, nextAddr := uint64(1), 0
	freshAddr := func() string {
		nextAddr++
		return fmt.Sprintf("10.9.%d.%d:8000", nextAddr/250, nextAddr%250)
	}
	var offered xds.State
	offers := 0
	// A second projector fed the same cells at the same times gives the
	// weights every view must carry (the cycle skips a cell whose weight
	// the projection says did not change).
	shadow, err := projection.New(cb.cfg.Projection)
	if err != nil {
		t.Fatal(err)
	}
	for step := range 300 {
		cb.clock.Advance(cb.cfg.Projection.MinInterval)
		now := cb.clock.Now()
		seq++
		for range 1 + rng.IntN(6) {
			id := ids[rng.IntN(len(ids))]
			state := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
			switch k := rng.IntN(20); {
			case k == 0: // a new address
				eps[id] = freshAddr()
			case k == 1 && len(ids) < n+100: // a new cell
				id = fmt.Sprintf("cell-x%03d", len(ids))
				ids = append(ids, id)
				eps[id] = freshAddr()
			case k == 2:
				state = isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED
			case k == 3: // the weight then ramps down, cycle after cycle, with no new view
				state = isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING
			case k < 7:
				if c := cb.r.cells[id]; c != nil {
					c.suspect = !c.suspect
					cb.r.touch(c)
				}
				continue
			case k < 10:
				cb.r.apply(message{probes: []probeResult{{id: id, ok: true,
					rtt: time.Duration(200+rng.IntN(3)*5000) * time.Microsecond, jitter: 20 * time.Microsecond}}})
				continue
			}
			hb := heartbeat(id, eps[id], state, seq)
			hb.Signals.QueueDepth = f64(float64(rng.IntN(20)))
			cb.r.applyHeartbeat(now, hb)
		}
		cb.r.cycle(now)
		d := shadow.Project(now, cb.r.mapped)
		for i, c := range cb.r.order {
			if c.pub.Weight != d.Weights[i] {
				t.Fatalf("step %d: cell %s: its view's weight %+v, the projection's %+v", step, c.id, c.pub.Weight, d.Weights[i])
			}
		}
		cb.r.pub.mu.Lock()
		st := cb.r.pub.pending
		cb.r.pub.pending = nil
		cb.r.pub.mu.Unlock()
		if st != nil {
			offered = cloneState(*st)
			offers++
			if _, err := cb.xs.Push(*st); err != nil {
				t.Fatalf("step %d: push: %v", step, err)
			}
			cb.r.pub.spend(st)
		}

		r := cb.r
		if !slices.IsSortedFunc(r.slots, func(a, b cycle.Slot) int { return cycle.AddrOrder(&a, &b) }) {
			t.Fatalf("step %d: slots out of address order", step)
		}
		want := map[string]uint32{}
		for i, c := range r.order {
			if got, want := r.slots[r.slotOf[i]], cycle.SlotOf(c.pub); got != want {
				t.Fatalf("step %d: cell %s: slot\n%+v\nwant SlotOf its view\n%+v", step, c.id, got, want)
			}
			if w := c.pub.Weight.Published; w > 0 {
				want[c.id] = w
			}
		}
		got := map[string]uint32{}
		for _, m := range offered.Models {
			for _, l := range m.Localities {
				if l.Region != "r1" {
					continue
				}
				for _, e := range l.Endpoints {
					got[e.CellID] = e.Weight
				}
			}
		}
		if st != nil && !maps.Equal(got, want) {
			t.Fatalf("step %d: the offered state's local cells %v, want those of the views %v", step, got, want)
		}
		for _, c := range r.order {
			if _, in := got[c.id]; c.offered != in {
				t.Fatalf("step %d: cell %s: offered %v, but in the last offer: %v", step, c.id, c.offered, in)
			}
		}
	}
	if offers < 100 {
		t.Errorf("%d offers in 300 cycles: the churn did not exercise the offer", offers)
	}
}
