package wan

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"
)

// TestDueTimesProperty: for any delay, jitter and read times, due times
// never decrease (no reordering), never precede read time + max(0,
// delay-jitter), and a chunk not held back by its predecessor is due
// within delay ± jitter of its read.
func TestDueTimesProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		delay := time.Duration(rapid.Int64Range(0, int64(200*time.Millisecond)).Draw(t, "delay"))
		jitter := time.Duration(rapid.Int64Range(0, int64(200*time.Millisecond)).Draw(t, "jitter"))
		gaps := rapid.SliceOfN(rapid.Int64Range(0, int64(50*time.Millisecond)), 1, 200).Draw(t, "gaps")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 0))
		now := time.Unix(1000, 0)
		var last time.Time
		for i, g := range gaps {
			now = now.Add(time.Duration(g))
			d := sampleDelay(rng, delay, jitter)
			if d < 0 || d < delay-jitter || d > delay+jitter {
				t.Fatalf("sample %v outside max(0, %v ± %v)", d, delay, jitter)
			}
			due := nextDue(now, last, d)
			if due.Before(last) {
				t.Fatalf("chunk %d due %v before its predecessor %v", i, due, last)
			}
			if lo := now.Add(max(0, delay-jitter)); due.Before(lo) {
				t.Fatalf("chunk %d due %v before %v", i, due, lo)
			}
			if due.After(last) && due.After(now.Add(delay+jitter)) {
				t.Fatalf("chunk %d due %v after read + delay + jitter", i, due)
			}
			last = due
		}
	})
}

// TestSampleDelayUniform: the samples cover [delay-jitter, delay+jitter]
// evenly, mean delay.
func TestSampleDelayUniform(t *testing.T) {
	const delay, jitter, n = 20 * time.Millisecond, 10 * time.Millisecond, 20000
	rng := rand.New(rand.NewPCG(1, 2))
	var bins [4]int
	var sum time.Duration
	for range n {
		d := sampleDelay(rng, delay, jitter)
		sum += d
		bins[min(int((d-(delay-jitter))*4/(2*jitter)), 3)]++
	}
	if mean := sum / n; mean < delay-200*time.Microsecond || mean > delay+200*time.Microsecond {
		t.Errorf("mean sample %v, want %v", mean, delay)
	}
	for i, b := range bins {
		if b < n/4*9/10 || b > n/4*11/10 {
			t.Errorf("quarter %d holds %d of %d samples, want about %d", i, b, n, n/4)
		}
	}
	if d := sampleDelay(rng, 0, 0); d != 0 {
		t.Errorf("no delay, no jitter: %v", d)
	}
	for range 1000 {
		if d := sampleDelay(rng, time.Millisecond, 5*time.Millisecond); d < 0 {
			t.Fatalf("negative delay %v", d)
		}
	}
}

// TestWaitDue: waitDue returns at the due time, holds while cut when asked
// to, and returns on cancellation.
func TestWaitDue(t *testing.T) {
	m, _ := newMetrics(nil)
	s := newShaper(0, 0, m.forPath("a-b", protoTCP))
	clk := clockwork.NewFakeClock()
	due := clk.Now().Add(10 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- s.waitDue(context.Background(), clk, due, true) }()
	blockUntil(t, clk, 1)
	s.setPartition(true)
	clk.Advance(time.Second) // past due, but cut
	select {
	case err := <-done:
		t.Fatalf("waitDue returned %v while the path is cut", err)
	default:
	}
	s.setPartition(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Not holding (UDP): returns at the due time even while cut.
	s.setPartition(true)
	due = clk.Now().Add(5 * time.Millisecond)
	go func() { done <- s.waitDue(context.Background(), clk, due, false) }()
	blockUntil(t, clk, 1)
	clk.Advance(5 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- s.waitDue(ctx, clk, clk.Now().Add(time.Hour), false) }()
	blockUntil(t, clk, 1)
	cancel()
	if err := <-done; err == nil {
		t.Fatal("waitDue ignored cancellation")
	}
}
