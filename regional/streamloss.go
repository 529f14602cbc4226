package regional

import (
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// Stream losses have a lane of their own (Registry.losses) beside the
// inbox, and the registry loop takes them before the heartbeats queued
// ahead of them: a broken stream takes a cell out of the load balancer,
// and at 10,000 cells a controller's inbox can hold thousands of
// heartbeats (up to 3,880 seen, 112 ms of them, at one controller of
// 10,000 cells in bench scale). The heartbeat stream hands its last
// heartbeat to the inbox and, when it breaks, its loss to this lane, so a
// loss can overtake the very heartbeat it names. Such a loss is held
// (heldLosses) until that heartbeat is applied, then applied as if it had
// come after it; a later heartbeat (the agent reconnected) or the TTL
// drops it. Everything here runs on the registry loop.

// heldLoss is a stream loss waiting for the heartbeat it names.
type heldLoss struct {
	streamLoss
	at time.Time
}

// takeLosses applies the stream losses queued, without waiting (at most
// the lane's capacity, so a steady arrival cannot hold the loop), and
// reports whether one must be projected at once.
func (r *Registry) takeLosses() bool {
	urgent := false
	for range cap(r.losses) {
		select {
		case m := <-r.losses:
			urgent = r.apply(m) || urgent
		default:
			return urgent
		}
	}
	return urgent
}

// applyStreamLoss makes a live cell suspect when the lost stream carried
// its latest heartbeat, and reports whether that changed anything. A loss
// whose heartbeat the cell does not have yet (no such cell, another
// incarnation, an earlier sequence) is held for it (holdLoss); one for an
// older heartbeat is stale and ignored.
func (r *Registry) applyStreamLoss(now time.Time, l *streamLoss) bool {
	c := r.cells[l.id]
	if c == nil || c.hb.GetIncarnation() != l.incarnation || c.hb.GetSequence() < l.sequence {
		r.holdLoss(now, l)
		return false
	}
	if c.suspect || !c.state.Live() || c.hb.GetSequence() != l.sequence {
		return false
	}
	c.suspect = true
	r.touch(c)
	if c.state.Serving() || c.state == lifecycle.Draining {
		c.leftLBAt = now
	}
	r.metrics.suspects.Inc()
	if !l.reported.IsZero() {
		r.metrics.streamLoss.Observe(now.Sub(l.reported).Seconds())
	}
	r.log.Warn("heartbeat stream broke without a Terminated report; cell suspect until it reconnects or the TTL passes",
		"cell", c.id, "state", c.state.String())
	return true
}

// holdLoss keeps l until its cell's next heartbeat is applied. The held
// losses are bounded by the cells known plus the inbox (a loss comes from
// a stream that handed over a heartbeat); one past that is dropped, and
// the TTL fails its cell as before the lane.
func (r *Registry) holdLoss(now time.Time, l *streamLoss) {
	if _, ok := r.heldLosses[l.id]; !ok && len(r.heldLosses) >= len(r.cells)+cap(r.inbox) {
		r.log.Warn("stream loss dropped: too many waiting for their heartbeats; the TTL will fail the cell", "cell", l.id)
		return
	}
	r.heldLosses[l.id] = heldLoss{streamLoss: *l, at: now}
}

// settleHeldLoss applies the loss held for hb's cell once hb is the
// heartbeat it names, keeps it while hb is an earlier one of the same
// incarnation (the named one is still queued), and drops it otherwise.
func (r *Registry) settleHeldLoss(now time.Time, hb *isobarpb.CellHeartbeat) bool {
	l, ok := r.heldLosses[hb.GetCellId()]
	if !ok {
		return false
	}
	sameInc := l.incarnation == hb.GetIncarnation()
	if sameInc && hb.GetSequence() < l.sequence {
		return false
	}
	delete(r.heldLosses, hb.GetCellId())
	if !sameInc || hb.GetSequence() != l.sequence {
		return false
	}
	return r.applyStreamLoss(now, &l.streamLoss)
}

// sweepHeldLosses drops the losses held longer than ttl: a heartbeat that
// had not arrived by then never will (its stream is gone), and the TTL
// fails the cell.
func (r *Registry) sweepHeldLosses(now time.Time, ttl time.Duration) {
	for id, l := range r.heldLosses {
		if now.Sub(l.at) >= ttl {
			delete(r.heldLosses, id)
		}
	}
}
