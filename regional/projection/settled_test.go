package projection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// skipWalk is one cell of TestSkippingChangesNothing's fleet: inputs that
// hold for a while and then move, as a cell's slow facts do.
type skipWalk struct {
	c   Cell
	bad int // steps left of an error burst
}

// step moves w's inputs at random: its load every step, the rest now and
// then (a state change, an error burst, throttling, a speed or context
// change).
func (w *skipWalk) step(rng *rand.Rand) {
	c := &w.c
	c.Pressure = rng.Float64()
	if rng.IntN(40) == 0 {
		c.State = []lifecycle.State{lifecycle.Ready, lifecycle.Ready, lifecycle.Draining, lifecycle.Failed, lifecycle.Loading}[rng.IntN(5)]
	}
	if rng.IntN(30) == 0 {
		w.bad = 1 + rng.IntN(6)
	}
	switch {
	case w.bad > 0:
		w.bad--
		c.ErrorRate, c.ErrorRequests, c.ErrorOK = 0.2+0.6*rng.Float64(), float64(1+rng.IntN(40)), true
	case rng.IntN(4) == 0:
		c.ErrorRate, c.ErrorRequests, c.ErrorOK = 0, float64(rng.IntN(50)), rng.IntN(5) > 0
	}
	if rng.IntN(50) == 0 {
		c.Thermal, c.ThermalOK = rng.Float64()*1.2, rng.IntN(4) > 0
	}
	if rng.IntN(200) == 0 {
		c.HardwareFault = !c.HardwareFault
	}
	if rng.IntN(40) == 0 {
		c.Speed = []float64{0, 1, 1, 0.7, 0.5, 0.3, 0.2}[rng.IntN(7)]
	}
	if rng.IntN(60) == 0 {
		c.ContextShare = []float64{0, 1, 0.5}[rng.IntN(3)]
	}
}

// A projection that keeps the target and weight of settled cells
// (settled.go) decides exactly what one that evaluates every cell does:
// through random sequences of loads, states, error bursts, derates,
// speeds, context shares, pools near their capacity, cells joining,
// leaving and reordering, and the buffers growing, every decision of the
// two is the same. And it does skip: a fifth to a quarter of the cell
// projections here, where every cell's slow facts move far more often
// than a fleet's do.
func TestSkippingChangesNothing(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 77))
			all, some := newProjector(t), newProjector(t)
			all.noSkip = true
			var walks []*skipWalk
			add := func(name string) {
				walks = append(walks, &skipWalk{c: Cell{ID: name, State: lifecycle.Ready, Speed: 1,
					Pool: []string{"a", "b", "c"}[rng.IntN(3)], ErrorOK: true, ErrorRequests: 30}})
			}
			for i := range 40 {
				add(fmt.Sprintf("c%02d", i))
			}
			now, skipped, total := t0, 0, 0
			var gone *skipWalk // the cell last removed
			for step := range 600 {
				switch rng.IntN(25) {
				case 0:
					for k := range 1 + rng.IntN(30) { // enough, now and then, to grow the buffers
						add(fmt.Sprintf("s%03d-%d", step, k))
					}
				case 1, 2:
					if len(walks) > 3 {
						i := rng.IntN(len(walks))
						if rng.IntN(2) == 0 {
							i = len(walks) - 1 // and back next step, where it was
						}
						gone = walks[i]
						walks = slices.Delete(walks, i, i+1)
					}
				case 3:
					i, j := rng.IntN(len(walks)), rng.IntN(len(walks))
					walks[i], walks[j] = walks[j], walks[i]
				case 4:
					// The buffers regrow apart: the weights' or the
					// targets' capacity ends at this length.
					if rng.IntN(2) == 0 {
						some.weights = slices.Clip(some.weights)
					} else {
						some.targets = slices.Clip(some.targets)
					}
					some.settled = slices.Grow(some.settled, 64)
				}
				if gone != nil && rng.IntN(2) == 0 {
					walks, gone = append(walks, gone), nil
				}
				util := map[string]float64{"a": rng.Float64() * 1.1, "b": 0.5, "c": 0.95}
				cells := make([]Cell, len(walks))
				for i, w := range walks {
					w.step(rng)
					cells[i] = w.c
					cells[i].Utilisation = util[w.c.Pool]
				}
				now = now.Add(time.Duration(50+rng.IntN(3000)) * time.Millisecond)
				want := all.Project(now, slices.Clone(cells))
				got := some.Project(now, cells)
				for i := range cells {
					if some.skip[i] {
						skipped++
					}
				}
				total += len(cells)
				if !sameDecision(want, got) {
					t.Fatalf("step %d: skipping settled cells decided\n%+v\nwhere evaluating every cell decided\n%+v", step, got, want)
				}
			}
			if skipped*10 < total {
				t.Errorf("%d of %d cell projections skipped: the test hardly exercises skipping", skipped, total)
			}
		})
	}
}

func sameDecision(a, b Decision) bool {
	return slices.Equal(a.Weights, b.Weights) && slices.Equal(a.Same, b.Same) && a.Push == b.Push &&
		a.Urgent == b.Urgent && a.Reason == b.Reason && slices.Equal(a.NewTrips, b.NewTrips) && slices.Equal(a.Kept, b.Kept)
}
