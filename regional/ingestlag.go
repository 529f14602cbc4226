package regional

import (
	"math/rand/v2"
	"slices"
	"time"
)

// The controller's own read lag. A cell is failed when no heartbeat of it
// was applied for the TTL, on this controller's receive time. A controller
// that falls behind reading its streams (its process starved of CPU, or
// more streams than it can read) applies heartbeats that were sent on time
// late, and by uneven amounts: one stream read 1.2 s late after the one
// before it was read 0.3 s late looks like a cell silent for 1.4 s against
// a 1 s TTL. Cells expire a few at a time, so the mass expiry hold
// (massexpiry.go) does not see it. Failing them takes them out of the load
// balancer, pushes the change, and re-probes them when they return: work
// that a controller already behind cannot afford, and that put it further
// behind. In bench scale, with the cells' senders on the same two cores,
// 8,000 of the controllers' 10,000 sockets held unread bytes, a third of
// the heartbeats were read a second or more after their sent_at, and the
// controllers failed hundreds to thousands of cells a second (docs/bench.md).
//
// So each heartbeat's delay (receive time minus its sent_at) is compared
// with its cell's least recent delay (baselineDelay: the transit and the
// clock offset of the two hosts, which cancel out), and the excess says
// how late this controller read it. Over each HeartbeatInterval, the first
// excess of each cell counts (a stream's backlog read in one burst is one
// cell's word); the sweep takes the ingestLagQuantile of them, over the
// last whole interval and the current one so far, as the controller's
// read lag and widens the TTL by it, at most by the mass expiry hold
// (ingestLagCap): the same bound on how long this controller takes the
// blame for its cells' silence, whether it reads nothing at all (the
// hold) or reads late (this).
//
// sent_at is the cell's word. A tenth of a region's cells cannot move the
// quantile; more can widen the TTL of the others by at most the cap.
// Fewer than massExpiryMinCells cells reporting in an interval widen
// nothing. Liveness still runs on the receive time: a cell must have sent
// for its heartbeat to be read, and a dead one sends nothing.
const (
	// ingestLagQuantile of the excesses is the read lag: the lag that
	// nearly every heartbeat was read within, with a tenth of them (and
	// of the cells) unable to move it.
	ingestLagQuantile = 0.9
	// ingestLagSamples bounds the excesses kept per interval (a uniform
	// sample of them beyond it).
	ingestLagSamples = 1024
	// baselineCreep is how far a cell's baseline delay rises per
	// heartbeat towards its current delay, so that a step of its clock
	// (or a route grown longer) stops counting as lag: a second's step
	// within 1,000 heartbeats. A lag of this controller's that lasts is
	// forgotten at the same pace, and a lag that lasts does not fail
	// cells: every heartbeat is then late by the same amount.
	baselineCreep = time.Millisecond
)

// ingestLag is the controller's read lag: the excess delays of the
// heartbeats applied since since, and the last whole interval's quantile
// of them (registry goroutine only).
type ingestLag struct {
	samples []time.Duration
	seen    int // cells that offered an excess since since (samples keeps at most ingestLagSamples)
	// interval counts the intervals closed; a cell's lagInterval is
	// interval+1 once it offered its excess in the current one.
	interval uint64
	since    time.Time
	lag      time.Duration // the last whole interval's quantile
	warned   bool
}

// noteDelay folds the delay of the heartbeat just applied to c (receive
// time minus its sent_at, -c.skew) into c's baseline and the interval's
// excesses. fresh: c's first heartbeat, or its first of a new
// incarnation, which restarts the baseline (another host's clock).
func (r *Registry) noteDelay(c *cell, fresh bool) {
	if !c.skewKnown {
		return
	}
	d := -c.skew
	if fresh || !c.delayKnown || d < c.baselineDelay {
		c.baselineDelay, c.delayKnown = d, true
		return
	}
	excess := d - c.baselineDelay
	c.baselineDelay = min(d, c.baselineDelay+baselineCreep)
	l := &r.lag
	if c.lagInterval == l.interval+1 {
		return // a cell speaks once an interval: a burst of one stream's backlog is one cell's word
	}
	c.lagInterval = l.interval + 1
	l.seen++
	switch {
	case len(l.samples) < ingestLagSamples:
		l.samples = append(l.samples, excess)
	default: // reservoir sampling (Vitter's algorithm R)
		if k := rand.IntN(l.seen); k < ingestLagSamples {
			l.samples[k] = excess
		}
	}
}

// ingestLagCap is the most the read lag widens the TTL: the mass expiry's
// hold, the longest this controller takes the blame for its cells'
// silence (none when holds are off).
func (r *Registry) ingestLagCap() time.Duration { return max(r.cfg.MassExpiry.Hold, 0) }

// lagAllowance is what the sweep at now adds to the TTL: the greater of
// the last whole HeartbeatInterval's read lag and the current interval's
// so far (a lag that grows widens the TTL within a sweep, not an interval
// later), capped. It closes the interval when one has passed, sets the
// gauge and logs when the lag rises past the TTL grace's half and when it
// falls back.
func (r *Registry) lagAllowance(now time.Time) time.Duration {
	l := &r.lag
	if l.since.IsZero() {
		l.since = now
	}
	cur := time.Duration(0)
	if len(l.samples) >= massExpiryMinCells {
		slices.Sort(l.samples) // in place: the reservoir's order is immaterial
		cur = l.samples[int(ingestLagQuantile*float64(len(l.samples)-1))]
	}
	if now.Sub(l.since) < r.cfg.HeartbeatInterval {
		return min(max(l.lag, cur), r.ingestLagCap())
	}
	l.lag = cur
	l.samples, l.seen, l.since = l.samples[:0], 0, now
	l.interval++
	r.metrics.ingestLag.Set(l.lag.Seconds())
	high := l.lag > r.cfg.TTLGrace/2
	switch {
	case high && !l.warned:
		r.log.Warn("this controller reads heartbeats late (process short of CPU, or more streams than it can read); the TTL is widened by its read lag so that cells sending on time are not failed",
			"read_lag", l.lag.Round(time.Millisecond), "ttl", r.cfg.TTL(), "widened_by", min(l.lag, r.ingestLagCap()).Round(time.Millisecond))
	case !high && l.warned:
		r.log.Info("heartbeats read on time again", "read_lag", l.lag.Round(time.Millisecond))
	}
	l.warned = high
	return min(l.lag, r.ingestLagCap())
}
