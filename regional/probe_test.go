package regional

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// A probe round probes at most max cells, those probed longest ago: ten
// live cells at four per round are each probed once in the first two and
// a half rounds, and a cell that left is forgotten.
func TestProbeRoundIsBounded(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	cells := make([]*CellView, 10)
	for i := range cells {
		cells[i] = &CellView{ID: fmt.Sprintf("c%d", i), Endpoint: fmt.Sprintf("10.0.0.%d:8000", i), State: lifecycle.Ready}
	}
	view := newView(time.Time{}, 1, cells, nil)
	var mu sync.Mutex
	var dialed []string
	var got []probeResult
	p := &prober{interval: time.Second, timeout: time.Second, max: 4, view: func() *View { return view },
		clock: clockwork.NewFakeClock(), log: slog.New(slog.DiscardHandler), metrics: m,
		est: map[string]*probeEstimate{},
		dial: func(_, addr string, _ time.Duration) (net.Conn, error) {
			mu.Lock() // dials run in the round's goroutines
			dialed = append(dialed, addr)
			mu.Unlock()
			a, b := net.Pipe()
			_ = b.Close()
			return a, nil
		},
		submit: func(_ context.Context, r []probeResult) error { got = r; return nil },
	}
	p.round(context.Background())
	first := map[string]bool{}
	for _, r := range got {
		first[r.id] = true
	}
	p.round(context.Background())
	second := map[string]bool{}
	for _, r := range got {
		if first[r.id] {
			t.Errorf("round 2 probed %s again while cells never probed were left", r.id)
		}
		second[r.id] = true
	}
	if len(first) != 4 || len(second) != 4 || len(dialed) != 8 {
		t.Fatalf("rounds probed %d and %d cells with %d dials, want 4, 4 and 8", len(first), len(second), len(dialed))
	}
	p.round(context.Background())
	third := map[string]bool{}
	for _, r := range got {
		third[r.id] = true
	}
	for _, c := range cells {
		if !first[c.ID] && !second[c.ID] && !third[c.ID] {
			t.Errorf("%s not probed in three rounds of 4 over 10 cells", c.ID)
		}
	}
	// c0 leaves: its estimate goes.
	view = newView(time.Time{}, 2, cells[1:], nil)
	p.round(context.Background())
	if _, ok := p.est["c0"]; ok || len(p.est) != 9 {
		t.Errorf("estimates %d (c0 kept: %v), want the 9 live cells'", len(p.est), ok)
	}
}

// TestProbeRoundIsPaced: with a spread, a round's dials start over it, not
// at once: at most the dials due by the clock's time have started.
func TestProbeRoundIsPaced(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	cells := make([]*CellView, n)
	for i := range cells {
		cells[i] = &CellView{ID: fmt.Sprintf("c%d", i), Endpoint: fmt.Sprintf("10.0.0.%d:8000", i), State: lifecycle.Ready}
	}
	view := newView(time.Time{}, 1, cells, nil)
	clock := clockwork.NewFakeClock()
	var mu sync.Mutex
	dialed := 0
	done := make(chan []probeResult, 1)
	p := &prober{interval: time.Second, spread: 500 * time.Millisecond, timeout: time.Second, view: func() *View { return view },
		clock: clock, log: slog.New(slog.DiscardHandler), metrics: m, est: map[string]*probeEstimate{},
		dial: func(_, _ string, _ time.Duration) (net.Conn, error) {
			mu.Lock()
			dialed++
			mu.Unlock()
			a, b := net.Pipe()
			_ = b.Close()
			return a, nil
		},
		submit: func(_ context.Context, r []probeResult) error { done <- r; return nil },
	}
	go p.round(t.Context())
	// Dial i is due at i × 50 ms: at each step the next one waits on the
	// clock, and no more than the due ones have started.
	// The bound only turns a round that never waits into a failure.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for step := 1; step < n; step++ {
		if err := clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatalf("dial %d: the round does not wait on the clock (%v): not paced", step, err)
		}
		mu.Lock()
		got := dialed
		mu.Unlock()
		if got > step {
			t.Fatalf("at %v: %d dials started, want at most the %d due", time.Duration(step-1)*50*time.Millisecond, got, step)
		}
		clock.Advance(50 * time.Millisecond)
	}
	if r := <-done; len(r) != n {
		t.Fatalf("the round probed %d cells, want %d", len(r), n)
	}
	if dialed != n {
		t.Fatalf("%d dials, want %d", dialed, n)
	}
}
