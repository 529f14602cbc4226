package wan

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
)

// shaper is a path's run-time state shared by all its connections: the
// delay, the jitter and whether the path is cut. Every field is guarded by
// mu; changed is closed (and replaced) whenever partitioned flips, which
// wakes every writer waiting on the path.
type shaper struct {
	mu          sync.Mutex
	delay       time.Duration
	jitter      time.Duration
	partitioned bool
	changed     chan struct{}
	pm          *pathMetrics
}

func newShaper(delay, jitter time.Duration, pm *pathMetrics) *shaper {
	s := &shaper{delay: delay, jitter: jitter, changed: make(chan struct{}), pm: pm}
	pm.delay.Set(delay.Seconds())
	pm.jit.Set(jitter.Seconds())
	pm.partitioned.Set(0)
	return s
}

func (s *shaper) setDelay(delay, jitter time.Duration) error {
	if err := validDelay(delay, jitter); err != nil {
		return err
	}
	s.mu.Lock()
	s.delay, s.jitter = delay, jitter
	s.mu.Unlock()
	s.pm.delay.Set(delay.Seconds())
	s.pm.jit.Set(jitter.Seconds())
	return nil
}

func (s *shaper) get() (delay, jitter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delay, s.jitter
}

// setPartition cuts (on) or heals the path and reports whether it changed.
func (s *shaper) setPartition(on bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.partitioned == on {
		return false
	}
	s.partitioned = on
	close(s.changed)
	s.changed = make(chan struct{})
	if on {
		s.pm.partitioned.Set(1)
	} else {
		s.pm.partitioned.Set(0)
	}
	return true
}

// gate returns whether the path is cut and a channel closed at the next
// change.
func (s *shaper) gate() (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.partitioned, s.changed
}

// waitOpen blocks until the path is not cut.
func (s *shaper) waitOpen(ctx context.Context) error {
	for {
		cut, changed := s.gate()
		if !cut {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitDue blocks until due has passed on clk and, when hold is set, the
// path is not cut: held bytes go out at max(due, heal time).
func (s *shaper) waitDue(ctx context.Context, clk clockwork.Clock, due time.Time, hold bool) error {
	for {
		cut, changed := s.gate()
		if cut && hold {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		d := due.Sub(clk.Now())
		if d <= 0 {
			return nil
		}
		t := clk.NewTimer(d)
		select {
		case <-t.Chan():
		case <-changed:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// sampleDelay draws one chunk's delay: delay plus a uniform sample of
// [-jitter, +jitter], clipped at 0.
func sampleDelay(rng *rand.Rand, delay, jitter time.Duration) time.Duration {
	d := delay
	if jitter > 0 {
		d += time.Duration(rng.Int64N(2*int64(jitter)+1)) - jitter
	}
	return max(d, 0)
}

// nextDue is when a chunk read at now with the sampled delay d goes out:
// now+d, but never before the chunk read before it (last), so jitter
// never reorders a direction.
func nextDue(now, last time.Time, d time.Duration) time.Time {
	due := now.Add(d)
	if due.Before(last) {
		return last
	}
	return due
}

// item is one chunk (or datagram) in a delay line, or the end of a TCP
// direction (end set; err set when the reader failed other than by EOF).
type item struct {
	data []byte
	due  time.Time
	end  bool
	err  error
}

// line is one direction's delay line: the reader stamps and queues, the
// writer waits for each item's due time and delivers. rng and last are
// used by the reader only.
type line struct {
	ch     chan item
	rng    *rand.Rand
	last   time.Time
	queued atomic.Int64 // bytes queued, not yet delivered or discarded
	m      dirMetrics
}

func newLine(seed, stream uint64, queueLen int, m dirMetrics) *line {
	return &line{
		ch:  make(chan item, queueLen),
		rng: rand.New(rand.NewPCG(seed, stream)),
		m:   m,
	}
}

// stamp returns the due time of an item read now.
func (l *line) stamp(s *shaper, now time.Time) time.Time {
	delay, jitter := s.get()
	l.last = nextDue(now, l.last, sampleDelay(l.rng, delay, jitter))
	return l.last
}

// hold accounts n bytes as queued.
func (l *line) hold(n int) {
	l.queued.Add(int64(n))
	l.m.buffered.Add(float64(n))
}

// release accounts n queued bytes as delivered or discarded.
func (l *line) release(n int) {
	l.queued.Add(-int64(n))
	l.m.buffered.Sub(float64(n))
}

// discard drops whatever is still queued; called once nobody reads or
// writes the line any more. It returns the number of items dropped.
func (l *line) discard() int {
	n := 0
	for {
		select {
		case it := <-l.ch:
			l.release(len(it.data))
			if !it.end {
				n++
			}
		default:
			return n
		}
	}
}
