package backoff

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// edge draws the lowest value, then the highest, alternately.
type edge struct{ high bool }

func (e *edge) Int64N(n int64) int64 {
	e.high = !e.high
	if e.high {
		return 0
	}
	return n - 1
}

func TestCeiling(t *testing.T) {
	p := Policy{Min: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for k, w := range want {
		if got := p.Ceiling(k); got != w*time.Millisecond {
			t.Errorf("Ceiling(%d) = %v, want %v", k, got, w*time.Millisecond)
		}
	}
	if got := p.Ceiling(1 << 40); got != time.Second {
		t.Errorf("huge attempt: %v", got)
	}
	big := Policy{Min: time.Nanosecond, Max: math.MaxInt64}
	if got := big.Ceiling(200); got != math.MaxInt64 {
		t.Errorf("overflow: %v", got)
	}
	if got := (Policy{Min: 5, Max: 3}).Ceiling(0); got != 3 {
		t.Errorf("Max below Min: %v, want Max", got)
	}
	if got := (Policy{Max: time.Second}).Ceiling(10); got != 0 {
		t.Errorf("zero Min: %v", got)
	}
}

func TestDelayJitter(t *testing.T) {
	for _, tc := range []struct {
		j       Jitter
		low, hi time.Duration // the extreme draws under a 400 ms ceiling
	}{
		{Full, 0, 400*time.Millisecond - 1},
		{Equal, 200 * time.Millisecond, 400 * time.Millisecond},
		{None, 400 * time.Millisecond, 400 * time.Millisecond},
	} {
		p := Policy{Min: 100 * time.Millisecond, Max: time.Second, Jitter: tc.j, Rand: &edge{}}
		if got := p.Delay(2); got != tc.low {
			t.Errorf("jitter %d: lowest draw %v, want %v", tc.j, got, tc.low)
		}
		if got := p.Delay(2); got != tc.hi {
			t.Errorf("jitter %d: highest draw %v, want %v", tc.j, got, tc.hi)
		}
	}
	if got := (Policy{Max: time.Second}).Delay(3); got != 0 {
		t.Errorf("zero ceiling: %v", got)
	}
}

// TestDelayRange draws from the global generator: every delay lies under
// its ceiling as the jitter says.
func TestDelayRange(t *testing.T) {
	lo, hi := 100*time.Millisecond, 5*time.Second
	for _, j := range []Jitter{Full, Equal, None} {
		p := Policy{Min: lo, Max: hi, Jitter: j}
		for k := range 12 {
			c := min(lo<<k, hi)
			for range 50 {
				d := p.Delay(k)
				ok := d >= 0 && d < c
				if j == Equal {
					ok = d >= c/2 && d <= c
				} else if j == None {
					ok = d == c
				}
				if !ok {
					t.Fatalf("jitter %d attempt %d: delay %v outside its range under %v", j, k, d, c)
				}
			}
		}
	}
}

func TestBackoff(t *testing.T) {
	b := New(Policy{Min: 100 * time.Millisecond, Max: time.Second, Jitter: None})
	for i, w := range []time.Duration{100, 200, 400, 800, 1000, 1000, 1000} {
		if d := b.Next(); d != w*time.Millisecond {
			t.Errorf("wait %d = %v, want %v", i, d, w*time.Millisecond)
		}
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Errorf("after Reset: %v", d)
	}
	b.Saturate()
	if d := b.Next(); d != time.Second {
		t.Errorf("after Saturate: %v", d)
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Errorf("Reset after Saturate: %v", d)
	}
	z := New(Policy{Max: time.Second})
	z.Saturate() // must return with a zero Min
	if d := z.Next(); d != 0 {
		t.Errorf("zero Min: %v", d)
	}
}

// TestSeededSource: the same seed draws the same delays.
func TestSeededSource(t *testing.T) {
	draws := func() []time.Duration {
		b := New(Policy{Min: time.Millisecond, Max: time.Second, Jitter: Equal, Rand: rand.New(rand.NewPCG(1, 2))})
		var out []time.Duration
		for range 16 {
			out = append(out, b.Next())
		}
		return out
	}
	a, b := draws(), draws()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("draw %d: %v then %v", i, a[i], b[i])
		}
	}
}
