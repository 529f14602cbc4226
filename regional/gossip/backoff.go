package gossip

import (
	"math/rand/v2"
	"time"
)

// backoff yields jittered exponential waits: each is drawn uniformly from
// [cur/2, cur], and cur doubles up to max.
type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(minWait, maxWait time.Duration) *backoff {
	return &backoff{min: minWait, max: maxWait, cur: minWait}
}

func (b *backoff) next() time.Duration {
	d := b.cur
	b.cur = min(2*b.cur, b.max)
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

func (b *backoff) reset() { b.cur = b.min }
