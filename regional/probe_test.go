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
	"github.com/isobar-mesh/isobar/regional/score"
)

// A probe round probes at most max cells, those probed longest ago: ten
// live cells at four per round are each probed once in the first two and
// a half rounds, and a cell that left is forgotten.
func TestProbeRoundIsBounded(t *testing.T) {
	m, cells := probeTestCells(t, 10)
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
	const n = 10
	m, cells := probeTestCells(t, n)
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

// TestProbeCadence: a cell stays on the fast cadence until its estimate
// holds four samples and a new sample agrees with it within
// max(1 ms, 4 × jitter); then it is due every steady rounds.
func TestProbeCadence(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	p := &prober{steady: 10}
	cases := []struct {
		name        string
		n           int
		rtt, jitter time.Duration
		sample      time.Duration
		want        uint64
	}{
		{"settling: the fourth sample decides", 3, ms(1), ms(0.1), ms(1.5), 10},
		{"settling: three samples are too few", 2, ms(1), ms(0.1), ms(1), 1},
		{"steady within the 1 ms floor", 8, ms(0.2), 0, ms(1.1), 10},
		{"moved beyond the floor", 8, ms(0.2), 0, ms(1.3), 1},
		{"moved down beyond the floor", 8, ms(5), ms(0.2), ms(3), 1},
		{"within four times the jitter", 8, ms(10), ms(2), ms(17.9), 10},
		{"beyond four times the jitter", 8, ms(10), ms(2), ms(18.1), 1},
		{"below, beyond four times the jitter", 8, ms(10), ms(1), ms(5.9), 1},
	}
	for _, c := range cases {
		e := score.RTTEstimate{RTT: c.rtt, Jitter: c.jitter, N: c.n}
		if got := p.cadence(e, c.sample); got != c.want {
			t.Errorf("%s: cadence %d, want %d", c.name, got, c.want)
		}
	}
	p.steady = 1
	if got := p.cadence(score.RTTEstimate{RTT: ms(1), N: 9}, ms(1)); got != 1 {
		t.Errorf("steady cadence 1: %d, want every round", got)
	}
}

// TestSteadyCellsAreProbedLess: cells whose connects agree are probed in
// each of their first four rounds, then every tenth; a cell whose probe
// fails is due again in the next round.
func TestSteadyCellsAreProbedLess(t *testing.T) {
	m, cells := probeTestCells(t, 3)
	view := newView(time.Time{}, 1, cells, nil)
	var mu sync.Mutex
	failing := ""
	var got []probeResult
	p := &prober{interval: time.Second, timeout: time.Second, max: 100, steady: 10, view: func() *View { return view },
		clock: clockwork.NewFakeClock(), log: slog.New(slog.DiscardHandler), metrics: m,
		est: map[string]*probeEstimate{},
		dial: func(_, addr string, _ time.Duration) (net.Conn, error) {
			mu.Lock()
			defer mu.Unlock()
			if addr == failing {
				return nil, fmt.Errorf("refused")
			}
			a, b := net.Pipe()
			_ = b.Close()
			return a, nil
		},
		submit: func(_ context.Context, r []probeResult) error { got = r; return nil },
	}
	probed := func() map[string]bool {
		got = nil
		p.round(context.Background())
		out := map[string]bool{}
		for _, r := range got {
			out[r.id] = true
		}
		return out
	}
	for round := 1; round <= 14; round++ {
		n := len(probed())
		want := 0
		if round <= 4 || round == 14 {
			want = 3
		}
		if n != want {
			t.Fatalf("round %d probed %d cells, want %d", round, n, want)
		}
	}
	mu.Lock()
	failing = cells[1].Endpoint
	mu.Unlock()
	for round := 24; round <= 25; round++ {
		for p.rounds < uint64(round-1) {
			probed()
		}
		if got := probed(); len(got) != map[int]int{24: 3, 25: 1}[round] || (round == 25 && !got["c1"]) {
			t.Errorf("round %d probed %v, want all three at their cadence, then c1 again after its failure", round, got)
		}
	}
}

// probeTestCells returns the metrics for a test prober and n Ready cells,
// c0 to c(n-1), at 10.0.0.i:8000.
func probeTestCells(t *testing.T, n int) (*metrics, []*CellView) {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	cells := make([]*CellView, n)
	for i := range cells {
		cells[i] = &CellView{ID: fmt.Sprintf("c%d", i), Endpoint: fmt.Sprintf("10.0.0.%d:8000", i), State: lifecycle.Ready}
	}
	return m, cells
}
