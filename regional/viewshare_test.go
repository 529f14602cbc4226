package regional

import (
	"testing"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// A cycle builds views only for the cells that changed: a cell whose
// heartbeat, state and probe are as they were keeps the very view of the
// last View (shared, never modified), a cell with a new heartbeat gets a
// new one, and the old View still shows what it showed.
func TestCycleSharesUnchangedViews(t *testing.T) {
	cb := newCycleBench(t, 4)
	cb.clock.Advance(cb.cfg.Projection.MinInterval)
	cb.cycle(t, cb.clock.Now())
	first := cb.r.View()
	firstB := *first.Cells[1]

	cb.clock.Advance(cb.cfg.Projection.MinInterval)
	now := cb.clock.Now()
	hb := heartbeat(cb.hbs[1].CellId, cb.hbs[1].Endpoint, isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 2)
	hb.Signals.QueueDepth = f64(30)
	cb.r.applyHeartbeat(now, hb)
	cb.r.cycle(now)
	second := cb.r.View()
	for _, i := range []int{0, 2, 3} {
		if second.Cells[i] != first.Cells[i] {
			t.Errorf("cell %s did not change but its view was rebuilt", second.Cells[i].ID)
		}
	}
	if second.Cells[1] == first.Cells[1] {
		t.Fatal("the cell with a new heartbeat kept its old view")
	}
	if second.Cells[1].Sequence != 2 || *second.Cells[1].Signals.QueueDepth != 30 || second.Cells[1].Score.Pressure == firstB.Score.Pressure {
		t.Errorf("new view: sequence %d, queue %v, pressure %v (was %v): want the new heartbeat scored",
			second.Cells[1].Sequence, second.Cells[1].Signals.GetQueueDepth(), second.Cells[1].Score.Pressure, firstB.Score.Pressure)
	}
	if *first.Cells[1] != firstB {
		t.Error("the last View's view of the changed cell was modified")
	}

	// A cell whose own inputs are unchanged but whose weight changes (an
	// operator drain is an input; a suspect flag too) gets a new view;
	// the old one stays as it was.
	cb.clock.Advance(cb.cfg.Projection.MinInterval)
	cb.r.cells[cb.hbs[2].CellId].suspect = true
	cb.r.touch(cb.r.cells[cb.hbs[2].CellId])
	cb.r.cycle(cb.clock.Now())
	third := cb.r.View()
	if third.Cells[2] == second.Cells[2] || third.Cells[2].Weight.Published != 0 || second.Cells[2].Weight.Published == 0 {
		t.Errorf("suspect cell: view shared %v, weight now %d, before %d: want a new view with weight 0, the old one kept",
			third.Cells[2] == second.Cells[2], third.Cells[2].Weight.Published, second.Cells[2].Weight.Published)
	}
	if third.Cells[0] != first.Cells[0] {
		t.Error("an unchanged cell's view was rebuilt after another cell's change")
	}
}
