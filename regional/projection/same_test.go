package projection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// Decision.Same says, for each cell, whether its weight is the one the
// previous projection gave the same cell at the same position: through
// random speeds, states, error rates, cells joining and leaving and the
// order changing, it equals that comparison made on copies of the
// decisions.
func TestDecisionSame(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	p := newProjector(t)
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%02d", i)
	}
	var prevIDs []string
	var prevW []Weight
	sames := 0
	for step := range 400 {
		switch rng.IntN(10) {
		case 0:
			ids = append(ids, fmt.Sprintf("n%03d", step))
		case 1:
			if len(ids) > 2 {
				i := rng.IntN(len(ids))
				ids = slices.Delete(ids, i, i+1)
			}
		case 2:
			rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		}
		cells := make([]Cell, len(ids))
		for i, id := range ids {
			cells[i] = Cell{ID: id, State: lifecycle.Ready, Speed: []float64{1, 0.6, 0.3}[rng.IntN(3)], Pool: "m"}
			if rng.IntN(8) == 0 {
				cells[i].State = lifecycle.Draining
			}
			if rng.IntN(10) == 0 {
				cells[i].ErrorRate, cells[i].ErrorRequests, cells[i].ErrorOK = 0.5, 1000, true
			}
		}
		d := p.Project(t0.Add(time.Duration(step)*time.Second), cells)
		if len(d.Same) != len(d.Weights) {
			t.Fatalf("step %d: %d Same for %d weights", step, len(d.Same), len(d.Weights))
		}
		for i, w := range d.Weights {
			want := i < len(prevIDs) && prevIDs[i] == ids[i] && prevW[i] == w
			if d.Same[i] != want {
				t.Fatalf("step %d: cell %s: Same %v, want %v (was %+v, now %+v)", step, ids[i], d.Same[i], want, prevW[min(i, len(prevW)-1)], w)
			}
			if want {
				sames++
			}
		}
		prevIDs, prevW = slices.Clone(ids), slices.Clone(d.Weights)
	}
	if sames < 1000 {
		t.Errorf("%d weights the same as last time: the test saw too few", sames)
	}
}
