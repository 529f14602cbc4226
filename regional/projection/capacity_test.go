package projection

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// brownout returns nine Ready cells of one pool at utilisation u, the
// first three failing rate of their requests.
func brownout(u, rate float64) []Cell {
	var cells []Cell
	for i := range 9 {
		c := Cell{ID: fmt.Sprintf("c%d", i), State: lifecycle.Ready, Pool: "m", Utilisation: u, ErrorOK: true, ErrorRequests: 40}
		if i < 3 {
			c.ErrorRate = rate
		}
		cells = append(cells, c)
	}
	return cells
}

func published(d Decision) (in []string) {
	for _, w := range d.Weights {
		if w.Published > 0 {
			in = append(in, w.ID)
		}
	}
	return in
}

// TestPenaltyKeepsCapacityThePoolNeeds: three of nine cells fail 30 % of
// their requests. At 50 % load the six others carry the pool at 75 %, so
// the three are held; at 90 % they would run at 135 %, so the three stay
// in (Decision.Kept, the band reason says why), and a cell held while the
// load was low comes back when the load grows. A cell failing more than
// MaxKeptErrorRate is held whatever the load; with the bound off
// (MaxLoadAfterHold 0) the count cap alone applies.
func TestPenaltyKeepsCapacityThePoolNeeds(t *testing.T) {
	cfg := DefaultConfig()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(100, 0)
	d := p.Project(now, brownout(0.5, 0.3))
	if got := len(published(d)); got != 6 || len(d.NewTrips) != 3 {
		t.Fatalf("at 50 %% load: %d cells in, trips %v; want 6 in, 3 trips", got, d.NewTrips)
	}
	now = now.Add(time.Second)
	d = p.Project(now, brownout(0.9, 0.3))
	if got := len(published(d)); got != 9 || !d.Push || !d.Urgent {
		t.Fatalf("at 90 %% load: %d cells in (push %v urgent %v); want the 3 held cells back at once", got, d.Push, d.Urgent)
	}
	if !slices.Equal(d.Kept, []string{"c0", "c1", "c2"}) {
		t.Errorf("kept %v, want c0..c2", d.Kept)
	}
	// Still failing at 90 %: kept, not tripped again.
	now = now.Add(time.Second)
	d = p.Project(now, brownout(0.9, 0.3))
	if got := len(published(d)); got != 9 || len(d.NewTrips) != 0 || len(d.Kept) != 3 {
		t.Fatalf("still at 90 %%: %d in, trips %v, kept %v", got, d.NewTrips, d.Kept)
	}
	if r := d.Weights[0].BandReason; r != reasonFull+reasonKept {
		t.Errorf("band reason %q", r)
	}
	// The load falls: the three trip again.
	now = now.Add(time.Second)
	if d = p.Project(now, brownout(0.5, 0.3)); len(d.NewTrips) != 3 {
		t.Errorf("back at 50 %%: trips %v, want 3", d.NewTrips)
	}

	// A cell failing most of its requests is held whatever the load.
	p, _ = New(cfg)
	if d = p.Project(now, brownout(0.9, 0.8)); len(published(d)) != 6 || len(d.Kept) != 0 {
		t.Errorf("failing 80 %% at 90 %% load: %d in, kept %v; want the 3 held", len(published(d)), d.Kept)
	}
	// Bound off, or utilisation unknown: the count cap alone.
	off := cfg
	off.Penalty.MaxLoadAfterHold = 0
	p, _ = New(off)
	if d = p.Project(now, brownout(0.9, 0.3)); len(published(d)) != 6 {
		t.Errorf("bound off: %d in, want 6", len(published(d)))
	}
	p, _ = New(cfg)
	if d = p.Project(now, brownout(0, 0.3)); len(published(d)) != 6 {
		t.Errorf("utilisation unknown: %d in, want 6", len(published(d)))
	}
}

// TestPenaltyHoldsWhatThePoolCanSpare: at 80 % load the pool can spare
// one cell of nine (80 × 9/8 = 90 %) but not two; pools are apart, so
// another model's load does not keep these cells in.
func TestPenaltyHoldsWhatThePoolCanSpare(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cells := brownout(0.8, 0.3)
	for i := range 4 {
		cells = append(cells, Cell{ID: fmt.Sprintf("o%d", i), State: lifecycle.Ready, Pool: "other", Utilisation: 0.1, ErrorOK: true, ErrorRequests: 40})
	}
	d := p.Project(time.Unix(100, 0), cells)
	if !slices.Equal(d.NewTrips, []string{"c0"}) || !slices.Equal(d.Kept, []string{"c1", "c2"}) {
		t.Errorf("trips %v kept %v; want c0 held, c1 c2 kept", d.NewTrips, d.Kept)
	}
}
