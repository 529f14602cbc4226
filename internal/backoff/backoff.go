// Package backoff owns the one jittered exponential back-off every retry
// loop in the repository waits with: the election's campaigns and watches,
// the gossip join, the cell agent's heartbeat stream, the gateway's xDS,
// report and endpoint streams and its request retries, and a region's
// session with the global leader.
//
// The ceiling of attempt k (0 for the first retry) is min(Max, Min·2^k);
// the delay is drawn below it by the policy's Jitter: Full (uniform in
// [0, ceiling), the AWS "full jitter"), Equal (uniform in [ceiling/2,
// ceiling]) or None (the ceiling itself). Randomness comes from the
// policy's Source, so a test can make the draws deterministic; nil means
// math/rand/v2's global generator.
//
// Concurrency: a Policy is a value and Ceiling and Delay only read it, so
// it may be shared by any number of goroutines as long as its Source may
// be (the global generator may; a *rand.Rand may not). A Backoff holds one
// retry loop's attempt count and belongs to one goroutine. No package
// state.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Jitter is how a delay is drawn below its attempt's ceiling.
type Jitter uint8

// The jitter kinds.
const (
	// Full draws uniformly in [0, ceiling): retries of many clients
	// spread the most, and the mean wait is half the ceiling.
	Full Jitter = iota
	// Equal draws uniformly in [ceiling/2, ceiling]: spread, but never
	// much sooner than the schedule.
	Equal
	// None waits the ceiling itself: a plain exponential pace.
	None
)

// Source draws a uniform int64 in [0, n), n > 0. *math/rand/v2.Rand is
// one.
type Source interface {
	Int64N(n int64) int64
}

// Policy is a back-off schedule.
type Policy struct {
	// Min is the first attempt's ceiling; Max bounds every ceiling.
	Min, Max time.Duration
	// Jitter says how a delay is drawn below its ceiling. Default Full.
	Jitter Jitter
	// Rand draws the jitter; nil: math/rand/v2's global generator.
	Rand Source
}

// Ceiling returns attempt's ceiling, min(Max, Min·2^attempt) (attempt 0
// for the first retry); never above Max, and free of overflow however
// large attempt is. A Min <= 0 gives 0.
func (p Policy) Ceiling(attempt int) time.Duration {
	c := p.Min
	for i := 0; i < attempt && c > 0 && c < p.Max; i++ {
		if c > p.Max/2 {
			c = p.Max
			break
		}
		c *= 2
	}
	return max(0, min(c, p.Max))
}

// Delay draws the wait before attempt (0 for the first retry) from under
// its ceiling, as the policy's Jitter says.
func (p Policy) Delay(attempt int) time.Duration {
	c := p.Ceiling(attempt)
	switch {
	case c <= 0:
		return 0
	case p.Jitter == None:
		return c
	case p.Jitter == Equal:
		half := c / 2
		return half + p.draw(c-half+1)
	default:
		return p.draw(c)
	}
}

func (p Policy) draw(n time.Duration) time.Duration {
	if p.Rand == nil {
		return rand.N(n)
	}
	return time.Duration(p.Rand.Int64N(int64(n)))
}

// Backoff follows one retry loop through its Policy: Next draws the
// delay of the current attempt and moves to the next, Reset starts over
// after a success.
type Backoff struct {
	p       Policy
	attempt int
}

// New returns a Backoff at its first attempt.
func New(p Policy) *Backoff { return &Backoff{p: p} }

// Next returns the delay before the current attempt and moves on to the
// next one.
func (b *Backoff) Next() time.Duration {
	d := b.p.Delay(b.attempt)
	if b.p.Ceiling(b.attempt) < b.p.Max {
		b.attempt++ // the count stops once the ceiling has reached Max
	}
	return d
}

// Reset goes back to the first attempt.
func (b *Backoff) Reset() { b.attempt = 0 }

// Saturate moves to the first attempt whose ceiling is Max, for a failure
// that retrying soon will not cure; Reset undoes it.
func (b *Backoff) Saturate() {
	for b.p.Ceiling(b.attempt) < b.p.Max && b.p.Ceiling(b.attempt) > 0 {
		b.attempt++
	}
}
