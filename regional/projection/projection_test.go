package projection

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/score"
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

func TestBandsAndRateLimit(t *testing.T) {
	p := newProjector(t)
	d := p.Project(t0, []Cell{ready("a", 0), ready("b", 0.9)})
	if !d.Push || !d.Urgent {
		t.Fatalf("first projection must push urgently: %+v", d)
	}
	for _, id := range []string{"a", "b"} {
		if w := weightOf(t, d, id); w.Published != 100 || w.Band != BandFull {
			t.Errorf("%s = %+v, want 100 in band full whatever its pressure", id, w)
		}
	}
	// A slower capacity class is a lower band: speed 0.5 → 1/2 → 50.
	slow := ready("b", 0)
	slow.Speed = 0.5
	d = p.Project(t0.Add(100*time.Millisecond), []Cell{ready("a", 0), slow})
	if d.Push {
		t.Fatalf("band change inside MinInterval pushed: %s", d.Reason)
	}
	if w := weightOf(t, d, "b"); w.Published != 100 || w.Target != 50 || w.Band != "1/2" || w.BandReason == "" {
		t.Errorf("b = %+v, want published 100 target 50 in band 1/2 with a reason", w)
	}
	d = p.Project(t0.Add(time.Second), []Cell{ready("a", 0), slow})
	if !d.Push || d.Urgent || weightOf(t, d, "b").Published != 50 {
		t.Fatalf("band change after MinInterval: %+v", d)
	}
}

// The weights of identical healthy cells are equal whatever noise their
// load signals carry: the signals go through the scorer as the registry
// feeds them, pressure and thermal score included.
func TestIdenticalCellsEqualWeightsUnderNoise(t *testing.T) {
	sc := score.DefaultConfig()
	rapid.Check(t, func(t *rapid.T) {
		p, _ := New(DefaultConfig())
		n := rapid.IntRange(2, 12).Draw(t, "n")
		now := t0
		pressures := map[float64]bool{}
		for step := 0; step < 20; step++ {
			cells := make([]Cell, n)
			for i := range cells {
				in := score.Input{
					QueueDepth:   score.Some(rapid.Float64Range(0, 64).Draw(t, "queue")),
					Running:      score.Some(rapid.Float64Range(0, 256).Draw(t, "running")),
					TTFTP95:      score.Some(rapid.Float64Range(0, 10).Draw(t, "ttft")),
					ErrorRate:    score.Some(0),
					KVCache:      score.Some(rapid.Float64Range(0, 1).Draw(t, "kv")),
					GPUUtil:      score.Some(rapid.Float64Range(0, 1).Draw(t, "util")),
					TemperatureC: score.Some(rapid.Float64Range(30, 80).Draw(t, "temp")),
					ThrottleOK:   true,
					RTT:          time.Duration(rapid.Int64Range(0, int64(80*time.Millisecond)).Draw(t, "rtt")),
					RTTOK:        true,
					Jitter:       time.Duration(rapid.Int64Range(0, int64(20*time.Millisecond)).Draw(t, "jitter")),
					JitterOK:     true,
				}
				res := sc.Score(in)
				pressures[res.Pressure] = true
				cells[i] = Cell{
					ID: string(rune('a' + i)), State: lifecycle.Ready, Pressure: res.Pressure,
					ErrorOK: true, ErrorRequests: rapid.Float64Range(0, 100).Draw(t, "requests"),
					Thermal: res.Normalized[score.Thermal], ThermalOK: res.Present[score.Thermal],
				}
			}
			now = now.Add(time.Duration(rapid.Int64Range(0, int64(2*time.Second)).Draw(t, "dt")))
			d := p.Project(now, cells)
			for _, w := range d.Weights {
				if w.Published != d.Weights[0].Published || w.Target != d.Weights[0].Target || w.Degraded || w.Band != BandFull {
					t.Fatalf("step %d: identical healthy cells differ: %+v vs %+v", step, w, d.Weights[0])
				}
			}
		}
		if len(pressures) < 2 {
			t.Fatalf("the noise did not move the pressure; the test proves nothing")
		}
	})
}

// A signal oscillating around a band edge, by less than the hysteresis
// margin, changes the band at most once.
func TestBandHysteresisDoesNotFlap(t *testing.T) {
	cfg := DefaultConfig()
	for k := 1; k < cfg.Bands; k++ {
		edge := bandEdge(k)
		for _, start := range []float64{1, edge * 0.5} {
			rapid.Check(t, func(t *rapid.T) {
				p, _ := New(cfg)
				now := t0
				c := ready("a", 0)
				c.Speed = start
				p.Project(now, []Cell{c})
				changes, last := 0, ""
				for i := 0; i < 200; i++ {
					noise := rapid.Float64Range(-0.95, 0.95).Draw(t, "noise") * cfg.BandHysteresis
					c.Speed = edge * (1 + noise)
					now = now.Add(time.Second)
					d := p.Project(now, []Cell{c})
					w := weightOf2(d, "a")
					if last != "" && w.Band != last {
						changes++
					}
					last = w.Band
				}
				if changes > 1 {
					t.Fatalf("edge %d (%.3f), start %.2f: band changed %d times", k, edge, start, changes)
				}
			})
		}
	}
	// Without hysteresis the same drive does flap: the test can fail.
	cfg.BandHysteresis = 0
	p, _ := New(cfg)
	c := ready("a", 0)
	changes, last := 0, ""
	for i := 0; i < 20; i++ {
		c.Speed = bandEdge(1) * (1 + 0.05*float64(1-2*(i%2)))
		d := p.Project(t0.Add(time.Duration(i)*time.Second), []Cell{c})
		if w := weightOf2(d, "a"); last != "" && w.Band != last {
			changes++
		}
		last = weightOf2(d, "a").Band
	}
	if changes < 10 {
		t.Fatalf("without hysteresis the band changed only %d times; the drive is not at the edge", changes)
	}
}

func weightOf2(d Decision, id string) Weight {
	for _, w := range d.Weights {
		if w.ID == id {
			return w
		}
	}
	return Weight{}
}

func TestHardwareDerateIsDegradedHealth(t *testing.T) {
	p := newProjector(t) // Derate On 1, Off 0.6, MinHold 10 s
	hot := func(th float64) Cell {
		c := ready("a", 0)
		c.Thermal, c.ThermalOK = th, true
		return c
	}
	p.Project(t0, []Cell{hot(0.2), ready("b", 0)})
	d := p.Project(t0.Add(100*time.Millisecond), []Cell{hot(1), ready("b", 0)})
	w := weightOf(t, d, "a")
	if !d.Urgent || !w.Degraded || w.Published != 100 || !strings.Contains(w.BandReason, "DEGRADED") {
		t.Fatalf("throttling: urgent=%v %+v, want DEGRADED at weight 100, pushed at once", d.Urgent, w)
	}
	// Between Off and On it stays derated; below Off it lifts after MinHold.
	if w := weightOf(t, p.Project(t0.Add(20*time.Second), []Cell{hot(0.8), ready("b", 0)}), "a"); !w.Degraded {
		t.Fatalf("lifted above Off: %+v", w)
	}
	if w := weightOf(t, p.Project(t0.Add(21*time.Second), []Cell{hot(0.5), ready("b", 0)}), "a"); w.Degraded {
		t.Fatalf("still derated below Off after MinHold: %+v", w)
	}
	// Throttle bits toggling every second never lift it within MinHold.
	for i := 0; i < 8; i++ {
		th := 1.0
		if i%2 == 1 {
			th = 0.3
		}
		w := weightOf(t, p.Project(t0.Add(time.Duration(30+i)*time.Second), []Cell{hot(th), ready("b", 0)}), "a")
		if !w.Degraded {
			t.Fatalf("step %d: derate flapped off", i)
		}
	}
	// A reported hardware fault derates too; missing telemetry alone does not.
	f := ready("c", 0)
	f.HardwareFault = true
	if w := weightOf(t, p.Project(t0.Add(50*time.Second), []Cell{f}), "c"); !w.Degraded {
		t.Fatalf("hardware fault not derated: %+v", w)
	}
	if w := weightOf(t, p.Project(t0.Add(50*time.Second), []Cell{ready("d", 0)}), "d"); w.Degraded {
		t.Fatalf("no telemetry derated: %+v", w)
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
	cfg := DefaultConfig() // DrainRamp 5 s
	cfg.MinInterval = 0
	p, _ := New(cfg)
	p.Project(t0, []Cell{ready("a", 0)})
	draining := []Cell{{ID: "a", State: lifecycle.Draining}}
	p.Project(t0, draining) // the ramp starts when the drain is first seen
	var seen []uint32
	last := uint32(100)
	for ms := 250; ms < 5000; ms += 250 {
		d := p.Project(t0.Add(time.Duration(ms)*time.Millisecond), draining)
		w := weightOf(t, d, "a")
		if w.Published == 0 || w.Published > last {
			t.Fatalf("at %d ms: weight %d, want in (0, %d]", ms, w.Published, last)
		}
		if w.Published != last {
			seen = append(seen, w.Published)
		}
		last = w.Published
	}
	if want := []uint32{50, 25}; !slices.Equal(seen, want) {
		t.Errorf("drain steps %v, want the bands %v", seen, want)
	}
	d := p.Project(t0.Add(5*time.Second), draining)
	if w := weightOf(t, d, "a"); w.Published != 0 || !d.Urgent {
		t.Fatalf("after the ramp: %+v urgent=%v", w, d.Urgent)
	}
}

// A tripped cell is out (no share floor); after the hold it gets one probe
// slot per hold window, closed after ProbeRequests reported requests or
// ProbeSlot; a failing probe trips it again with a doubled hold; probes
// within the threshold clear it.
func TestPenaltyHoldAndCountBoundedProbation(t *testing.T) {
	p := newProjector(t) // hold 5 s, 3 probes, slot 1 s
	errs := func(rate, n float64) Cell {
		return Cell{ID: "a", State: lifecycle.Ready, ErrorOK: n > 0, ErrorRate: rate, ErrorRequests: n}
	}
	other := ready("b", 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	step := func(ms int, c Cell) Weight {
		t.Helper()
		return weightOf(t, p.Project(at(ms), []Cell{c, other}), "a")
	}

	p.Project(at(0), []Cell{errs(0, 20), other})
	d := p.Project(at(100), []Cell{errs(0.5, 20), other})
	if !d.Urgent || len(d.NewTrips) != 1 || d.NewTrips[0] != "a" {
		t.Fatalf("trip must be urgent and reported: %+v", d)
	}
	if w := weightOf(t, d, "a"); w.Published != 0 || w.Band != BandOut || w.Trips != 1 || w.Penalty != 1 {
		t.Fatalf("tripped cell = %+v, want out of the load balancer", w)
	}
	// Little evidence does not trip a clear cell.
	p3 := newProjector(t)
	if d := p3.Project(t0, []Cell{errs(0.5, 1)}); len(d.NewTrips) != 0 {
		t.Fatalf("tripped on one request: %+v", d)
	}
	// Errors still in the window extend the hold; the window empties.
	if w := step(3000, errs(0.5, 20)); w.Published != 0 {
		t.Fatalf("held cell published: %+v", w)
	}
	if w := step(6000, errs(0, 0)); w.Published != 0 || w.Probation {
		t.Fatalf("hold extended to 8 s by the errors at 3 s, got %+v", w)
	}
	// Hold over: a probe slot at the lowest band's weight.
	w := step(8000, errs(0, 0))
	if !w.Probation || w.Band != BandProbe || w.Published != 25 || w.ProbeBudget != 3 {
		t.Fatalf("probe slot: %+v", w)
	}
	// Two clean probes reported: not enough to clear, the slot stays open.
	if w := step(8300, errs(0, 2)); w.Published != 25 || !w.Probation {
		t.Fatalf("after 2 probes: %+v", w)
	}
	// No more within ProbeSlot: closed until the next hold window (13 s).
	if w := step(9000, errs(0, 2)); w.Published != 0 || !w.Probation || w.Band != BandOut || w.ProbeBudget != 0 {
		t.Fatalf("slot open past ProbeSlot: %+v", w)
	}
	if w := step(12900, errs(0, 2)); w.Published != 0 {
		t.Fatalf("slot reopened inside the window: %+v", w)
	}
	if w := step(13000, errs(0, 2)); w.Published != 25 {
		t.Fatalf("no slot in the next window: %+v", w)
	}
	// A failing probe trips it again, holding twice as long (10 s).
	d = p.Project(at(13200), []Cell{errs(1.0/3, 3), other})
	if w := weightOf(t, d, "a"); len(d.NewTrips) != 1 || w.Published != 0 || w.Trips != 2 {
		t.Fatalf("failing probe: %+v trips %v", w, d.NewTrips)
	}
	if w := step(23100, errs(0, 0)); w.Published != 0 {
		t.Fatalf("second hold shorter than 10 s: %+v", w)
	}
	if w := step(23200, errs(0, 0)); w.Band != BandProbe {
		t.Fatalf("no probe slot after the second hold: %+v", w)
	}
	// Three clean probes: cleared, back in its band.
	w = step(23600, errs(0, 3))
	if w.Probation || w.Penalty != 0 || w.Published != 100 || w.Band != BandFull || w.ProbeBudget != 0 {
		t.Fatalf("after 3 clean probes: %+v", w)
	}
	// Clean for ClearAfter: the trip count resets.
	if w := step(60000, errs(0, 20)); w.Trips != 0 || w.Published != 100 {
		t.Fatalf("after a long clean period: %+v", w)
	}
}

// However fast requests arrive, a probation window exposes the cell for at
// most one slot: the count of windows with the cell published is bounded.
func TestProbationNeverExceedsOneSlotPerWindow(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, _ := New(DefaultConfig())
		bad := Cell{ID: "a", State: lifecycle.Ready, ErrorOK: true, ErrorRate: 1, ErrorRequests: 10}
		p.Project(t0, []Cell{bad})
		now := t0
		var open time.Duration
		var prevOpen bool
		prevAt := now
		for i := 0; i < 400; i++ {
			now = now.Add(time.Duration(rapid.Int64Range(int64(10*time.Millisecond), int64(300*time.Millisecond)).Draw(t, "dt")))
			// No verdict ever comes back: the slot must close on time.
			c := Cell{ID: "a", State: lifecycle.Ready}
			w := weightOf2(p.Project(now, []Cell{c}), "a")
			if prevOpen {
				open += now.Sub(prevAt)
			}
			prevOpen, prevAt = w.Published > 0, now
		}
		// Hold 5 s from t0, then windows of 5 s: at most one 1 s slot (plus
		// one projection step of lag) per window.
		windows := int(now.Sub(t0.Add(5*time.Second))/(5*time.Second)) + 1
		if limit := time.Duration(windows) * (time.Second + 300*time.Millisecond); open > limit {
			t.Fatalf("published %v over %d windows, limit %v", open, windows, limit)
		}
	})
}

func TestValidate(t *testing.T) {
	c := DefaultConfig()
	c.Penalty.BaseHold = 2 * c.Penalty.MaxHold
	if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New = %v, want ErrInvalidConfig", err)
	}
}

// Ready cells always have a band weight; others than Ready and Draining
// have none; pressure never moves a weight.
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
				if c.State == lifecycle.Ready && w.Target != 100 {
					t.Fatalf("ready cell %s (p=%v) target %d, want 100", c.ID, c.Pressure, w.Target)
				}
				if c.State == lifecycle.Draining && w.Target != 0 && w.Target != 100 && w.Target != 50 && w.Target != 25 {
					t.Fatalf("draining cell %s target %d is not a band weight", c.ID, w.Target)
				}
				if c.State != lifecycle.Ready && c.State != lifecycle.Draining && w.Target != 0 {
					t.Fatalf("%s cell %s has target %d", c.State, c.ID, w.Target)
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

// TestPenaltyCap: an error burst across a whole region (an overload, a bad
// client) holds at most MaxHeldPercent of the Ready cells (one at least),
// so it cannot empty the load balancer; the others keep their weight.
func TestPenaltyCap(t *testing.T) {
	for _, tc := range []struct {
		cells, wantHeld int
	}{{1, 1}, {3, 1}, {4, 2}, {9, 4}} {
		p, err := New(DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		var cells []Cell
		for i := range tc.cells {
			cells = append(cells, Cell{ID: fmt.Sprintf("c%d", i), State: lifecycle.Ready, ErrorOK: true, ErrorRate: 1, ErrorRequests: 20})
		}
		d := p.Project(t0, cells)
		held := 0
		for _, w := range d.Weights {
			if w.Published == 0 {
				held++
			}
		}
		if held != tc.wantHeld || len(d.NewTrips) != tc.wantHeld {
			t.Errorf("%d failing cells: %d held (%d trips), want %d", tc.cells, held, len(d.NewTrips), tc.wantHeld)
		}
	}
}

// A cell whose declared context is below its model's longest publishes 1
// (the main cluster, requests of unknown size) and carries its band weight
// as ClassWeight; identical full cells are unaffected. Out of the load
// balancer it has neither.
func TestConstrainedCellWeight(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(100, 0)
	cells := []Cell{
		{ID: "full", State: lifecycle.Ready, ContextShare: 1},
		{ID: "unknown", State: lifecycle.Ready},
		{ID: "short", State: lifecycle.Ready, ContextShare: 1024.0 / 131072},
	}
	d := p.Project(now, cells)
	for i, want := range []struct{ pub, class uint32 }{{100, 0}, {100, 0}, {1, 100}} {
		if w := d.Weights[i]; w.Published != want.pub || w.ClassWeight != want.class {
			t.Errorf("%s: published %d class %d, want %d and %d (%s)", w.ID, w.Published, w.ClassWeight, want.pub, want.class, w.BandReason)
		}
	}
	if r := d.Weights[2].BandReason; !strings.Contains(r, "max_model_len") {
		t.Errorf("the constrained cell's reason %q does not say why", r)
	}
	cells[2].State = lifecycle.Draining
	for range 20 {
		now = now.Add(time.Second)
		d = p.Project(now, cells)
	}
	if w := d.Weights[2]; w.Published != 0 || w.ClassWeight != 0 {
		t.Errorf("drained constrained cell: published %d class %d, want 0 and 0", w.Published, w.ClassWeight)
	}
}

// A cell's state follows its ID, not its position: cells that come, go
// and shift between projections keep their own state (the projector finds
// a cell at its last position without a map lookup, and must not take
// another cell's state there). A held penalty (5 s) is the sticky state
// here.
func TestStateFollowsTheCellWhenPositionsShift(t *testing.T) {
	p := newProjector(t)
	failing := func(id string) Cell {
		return Cell{ID: id, State: lifecycle.Ready, ErrorOK: true, ErrorRate: 0.5, ErrorRequests: 20}
	}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	p.Project(at(0), []Cell{ready("a", 0), ready("c", 0), ready("e", 0), ready("f", 0)})
	d := p.Project(at(100), []Cell{ready("a", 0), failing("c"), ready("e", 0), ready("f", 0)})
	if w := weightOf(t, d, "c"); w.Published != 0 || w.Band != BandOut {
		t.Fatalf("c = %+v, want held out", w)
	}
	// b arrives before c, e leaves, d arrives at e's old position.
	d = p.Project(at(200), []Cell{ready("a", 0), ready("b", 0), ready("c", 0), ready("d", 0), ready("f", 0)})
	for id, want := range map[string]uint32{"a": 100, "b": 100, "c": 0, "d": 100, "f": 100} {
		if w := weightOf(t, d, id); w.Published != want {
			t.Errorf("after the shift %s = %+v, want %d", id, w, want)
		}
	}
	// e comes back where c was: it starts afresh, not held.
	d = p.Project(at(300), []Cell{ready("a", 0), ready("b", 0), ready("e", 0), ready("c", 0), ready("f", 0)})
	if w := weightOf(t, d, "e"); w.Published != 100 {
		t.Errorf("e back = %+v, want 100", w)
	}
	if w := weightOf(t, d, "c"); w.Published != 0 || w.Trips != 1 {
		t.Errorf("c moved = %+v, want still held, one trip", w)
	}
	if len(p.cells) != 5 {
		t.Errorf("%d cell states, want 5 (d, absent, forgotten)", len(p.cells))
	}
}
