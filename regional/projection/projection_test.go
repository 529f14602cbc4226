package projection

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func weightOf(t *testing.T, d Decision, id string) Weight {
	t.Helper()
	for _, w := range d.Weights {
		if w.ID == id {
			return w
		}
	}
	t.Fatalf("no weight for %s in %+v", id, d.Weights)
	return Weight{}
}

func ready(id string, pressure float64) Cell {
	return Cell{ID: id, State: lifecycle.Ready, Pressure: pressure}
}

func newProjector(t *testing.T) *Projector {
	t.Helper()
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHysteresisAndRateLimit(t *testing.T) {
	p := newProjector(t)
	d := p.Project(t0, []Cell{ready("a", 0), ready("b", 0.5)})
	if !d.Push || !d.Urgent {
		t.Fatalf("first projection must push urgently: %+v", d)
	}
	if got := weightOf(t, d, "a").Published; got != 100 {
		t.Errorf("idle cell weight = %d, want 100", got)
	}
	if got := weightOf(t, d, "b").Published; got != 25 { // 100·0.5²
		t.Errorf("half-loaded cell weight = %d, want 25", got)
	}

	// A small move (25 → 23) is below the hysteresis threshold.
	d = p.Project(t0.Add(2*time.Second), []Cell{ready("a", 0), ready("b", 0.52)})
	if d.Push {
		t.Fatalf("small move pushed: %s", d.Reason)
	}
	if w := weightOf(t, d, "b"); w.Published != 25 || w.Target != 23 {
		t.Errorf("b = %+v, want published 25 target 23", w)
	}

	// A large move inside MinInterval of the last push waits...
	p2 := newProjector(t)
	p2.Project(t0, []Cell{ready("a", 0)})
	if d := p2.Project(t0.Add(500*time.Millisecond), []Cell{ready("a", 0.5)}); d.Push {
		t.Fatalf("drift pushed inside MinInterval: %s", d.Reason)
	}
	// ...and goes out once the interval has passed.
	d = p2.Project(t0.Add(time.Second), []Cell{ready("a", 0.5)})
	if !d.Push || d.Urgent || weightOf(t, d, "a").Published != 25 {
		t.Fatalf("drift after MinInterval: %+v", d)
	}
}

func TestMembershipChangesAreUrgent(t *testing.T) {
	p := newProjector(t)
	p.Project(t0, []Cell{ready("a", 0), ready("b", 0)})
	d := p.Project(t0.Add(10*time.Millisecond), []Cell{ready("a", 0), {ID: "b", State: lifecycle.Failed}})
	if !d.Push || !d.Urgent {
		t.Fatalf("a failure must push at once: %+v", d)
	}
	if w := weightOf(t, d, "b"); w.Published != 0 {
		t.Errorf("failed cell published weight %d, want 0", w.Published)
	}
	// A cell vanishing from the input is a removal too.
	d = p.Project(t0.Add(20*time.Millisecond), []Cell{ready("b", 0)})
	if !d.Push || !d.Urgent {
		t.Fatalf("removal and re-admission must push at once: %+v", d)
	}
	// Loading and Terminated cells never get weight.
	d = p.Project(t0.Add(30*time.Millisecond), []Cell{{ID: "c", State: lifecycle.Loading}, {ID: "d", State: lifecycle.Terminated}})
	for _, w := range d.Weights {
		if w.Published != 0 || w.Target != 0 {
			t.Errorf("%s has weight %+v", w.ID, w)
		}
	}
}

func TestDrainRamp(t *testing.T) {
	p := newProjector(t) // DrainRamp 5 s, MinInterval 1 s
	p.Project(t0, []Cell{ready("a", 0)})
	draining := []Cell{{ID: "a", State: lifecycle.Draining}}
	p.Project(t0, draining) // the ramp starts when the drain is first seen
	var last uint32 = 100
	for i := 1; i <= 3; i++ {
		d := p.Project(t0.Add(time.Duration(i)*1250*time.Millisecond), draining)
		w := weightOf(t, d, "a")
		if w.Published == 0 || w.Published >= last {
			t.Fatalf("step %d: weight %d, want in (0, %d)", i, w.Published, last)
		}
		last = w.Published
	}
	d := p.Project(t0.Add(5*time.Second), draining)
	if w := weightOf(t, d, "a"); w.Published != 0 || !d.Urgent {
		t.Fatalf("after the ramp: %+v urgent=%v", w, d.Urgent)
	}
}

func TestPenaltyTripDecayAndProbation(t *testing.T) {
	cfg := DefaultConfig()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bad := Cell{ID: "a", State: lifecycle.Ready, ErrorOK: true, ErrorRate: 0.5, ErrorRequests: 20}
	good := Cell{ID: "a", State: lifecycle.Ready, ErrorOK: true, ErrorRate: 0, ErrorRequests: 20}
	other := ready("b", 0)

	p.Project(t0, []Cell{good, other})
	d := p.Project(t0.Add(100*time.Millisecond), []Cell{bad, other})
	if !d.Urgent || len(d.NewTrips) != 1 || d.NewTrips[0] != "a" {
		t.Fatalf("trip must be urgent and reported: %+v", d)
	}
	if w := weightOf(t, d, "a"); w.Published != 2 || w.Trips != 1 {
		t.Fatalf("penalised weight = %+v, want 2 (floor 0.02 of 100)", w)
	}
	// Little evidence does not trip anything.
	p3 := newProjector(t)
	thin := bad
	thin.ErrorRequests = 1
	if d := p3.Project(t0, []Cell{thin}); len(d.NewTrips) != 0 {
		t.Fatalf("tripped on one request: %+v", d)
	}

	// Fixed: during the hold (5 s) the weight stays down...
	d = p.Project(t0.Add(4*time.Second), []Cell{good, other})
	if w := weightOf(t, d, "a"); w.Penalty != 1 {
		t.Fatalf("penalty decayed during hold: %+v", w)
	}
	// ...then decays (half-life 5 s): on probation, weight climbing.
	d = p.Project(t0.Add(20*time.Second), []Cell{good, other})
	w := weightOf(t, d, "a")
	if !w.Probation || w.Penalty >= 0.5 || w.Published <= 2 {
		t.Fatalf("after decay: %+v", w)
	}
	// Errors again on probation: a second trip holds twice as long.
	p.Project(t0.Add(21*time.Second), []Cell{bad, other})
	d = p.Project(t0.Add(30*time.Second), []Cell{good, other})
	if w := weightOf(t, d, "a"); w.Penalty != 1 || w.Trips != 2 {
		t.Fatalf("second trip must hold 10 s: %+v", w)
	}
	// Long clean period: fully re-admitted, trip count reset.
	d = p.Project(t0.Add(120*time.Second), []Cell{good, other})
	if w := weightOf(t, d, "a"); w.Penalty != 0 || w.Trips != 0 || w.Published != 100 {
		t.Fatalf("after a long clean period: %+v", w)
	}
}

func TestValidate(t *testing.T) {
	c := DefaultConfig()
	c.Penalty.BaseHold = 2 * c.Penalty.MaxHold
	if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New = %v, want ErrInvalidConfig", err)
	}
}

// Ready cells always have a weight in [1, MaxWeight]; others have none; a
// more loaded cell never gets more weight than a less loaded one.
func TestWeightInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, _ := New(DefaultConfig())
		n := rapid.IntRange(1, 20).Draw(t, "n")
		states := []lifecycle.State{lifecycle.Loading, lifecycle.Ready, lifecycle.Draining, lifecycle.Failed, lifecycle.Terminated}
		now := t0
		for step := 0; step < 5; step++ {
			cells := make([]Cell, n)
			for i := range cells {
				cells[i] = Cell{
					ID:       string(rune('a' + i)),
					State:    rapid.SampledFrom(states).Draw(t, "state"),
					Pressure: rapid.Float64Range(0, 1).Draw(t, "pressure"),
				}
			}
			now = now.Add(time.Duration(rapid.Int64Range(0, int64(3*time.Second)).Draw(t, "dt")))
			d := p.Project(now, cells)
			for i, w := range d.Weights {
				c := cells[i]
				if c.ID != w.ID {
					t.Fatalf("weights not in input order for sorted ids")
				}
				if c.State == lifecycle.Ready && (w.Target < 1 || w.Target > 100) {
					t.Fatalf("ready cell %s target %d", c.ID, w.Target)
				}
				if c.State != lifecycle.Ready && c.State != lifecycle.Draining && w.Target != 0 {
					t.Fatalf("%s cell %s has target %d", c.State, c.ID, w.Target)
				}
				for j, o := range d.Weights {
					if c.State == lifecycle.Ready && cells[j].State == lifecycle.Ready &&
						c.Pressure > cells[j].Pressure && w.Target > o.Target {
						t.Fatalf("%s (p=%v) got %d > %s (p=%v) %d", c.ID, c.Pressure, w.Target, o.ID, cells[j].Pressure, o.Target)
					}
				}
			}
		}
	})
}

func BenchmarkProject1000(b *testing.B) {
	p, _ := New(DefaultConfig())
	cells := make([]Cell, 1000)
	for i := range cells {
		cells[i] = Cell{ID: string(rune(0x4e00 + i)), State: lifecycle.Ready, Pressure: float64(i%100) / 100}
	}
	now := t0
	for b.Loop() {
		now = now.Add(100 * time.Millisecond)
		p.Project(now, cells)
	}
}
