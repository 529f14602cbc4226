package scale

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// maxVictimsPerRound bounds the cells killed in one round.
const maxVictimsPerRound = 10

// How a timed cell dies.
const (
	// deathBroken: the cell's TCP connection is closed under its stream
	// (a SIGKILLed agent, no Terminated heartbeat).
	deathBroken = "broken stream"
	// deathSilent: the cell stops sending while its stream stays open (a
	// hung agent): only the controller's TTL removes it.
	deathSilent = "silent cell"
)

// timeAllDeaths times Config.Deaths broken streams, then
// Config.SilentDeaths silent cells, into f.
func (p *point) timeAllDeaths(ctx context.Context, f *Figures) error {
	before, lossBefore := p.regions[0].tap.read(metricFailover), p.regions[0].tap.read(metricStreamLoss)
	deaths, err := p.timeDeaths(ctx, deathBroken, p.cfg.Deaths)
	if after := p.regions[0].tap.read(metricFailover); after.count > before.count {
		f.LiveFailoverMeanMs = ptr(1000 * (after.sum - before.sum) / (after.count - before.count))
	}
	if after := p.regions[0].tap.read(metricStreamLoss); after.count > lossBefore.count {
		f.LiveStreamLossMeanMs = ptr(1000 * (after.sum - lossBefore.sum) / (after.count - lossBefore.count))
	}
	removed := field(deaths, func(d deathTime) float64 { return d.removed })
	f.DeathToRemovedP50Ms, f.DeathToRemovedP99Ms, f.DeathsTimed = quantileNaN(removed, 0.5), quantileNaN(removed, 0.99), len(deaths)
	f.DeathToRemovedMaxMs = quantileNaN(removed, 1)
	f.DeathToRemovedMs = slices.Sorted(slices.Values(removed))
	f.breakDown(deaths)
	if err != nil {
		return err
	}
	silentTimes, err := p.timeDeaths(ctx, deathSilent, p.cfg.SilentDeaths)
	silent := field(silentTimes, func(d deathTime) float64 { return d.removed })
	if len(silent) > 0 {
		f.SilentToRemovedP50Ms, f.SilentToRemovedP99Ms = ptr(quantileNaN(silent, 0.5)), ptr(quantileNaN(silent, 0.99))
		f.SilentToRemovedMaxMs = ptr(quantileNaN(silent, 1))
	}
	f.SilentDeathsTimed = len(silent)
	return err
}

// deathTime is one timed death, in ms from the kill (or the silence): to
// the first assignment without the cell decoded at the xDS client
// (removed), and, traced back through the wire logs, to when the client
// read the response it came in (received) and when the controller wrote
// that response to the transport (sent); NaN where a log has no such
// response.
type deathTime struct{ removed, received, sent, lag float64 }

func field(ds []deathTime, f func(deathTime) float64) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = f(d)
	}
	return out
}

// breakDown sets the wire breakdown of the broken-stream deaths: kill →
// response written by the controller (sent), → read by the client
// (received), and the client's decode and apply (removed − received).
// All three are over the same deaths, those the logs traced in full
// (DeathsTraced), so that their quantiles keep the order sent ≤ received
// that each death has; each is left nil when none is. A death traced to
// the read only (its write logged after the client read it, or out of
// the log's room) is left out of all three: the fastest deaths are the
// likeliest so, and leaving them out of sent alone put sent's P50 above
// received's. The kill lag is over every death.
func (f *Figures) breakDown(ds []deathTime) {
	q := func(xs []float64) (p50, p99 *float64) {
		if len(xs) == 0 {
			return nil, nil
		}
		return ptr(quantileNaN(xs, 0.5)), ptr(quantileNaN(xs, 0.99))
	}
	traced := slices.DeleteFunc(slices.Clone(ds), func(d deathTime) bool { return math.IsNaN(d.received) || math.IsNaN(d.sent) })
	f.DeathsTraced = len(traced)
	sent := field(traced, func(d deathTime) float64 { return d.sent })
	f.DeathToSentP50Ms, f.DeathToSentP99Ms = q(sent)
	if len(sent) > 0 {
		var sum float64
		for _, x := range sent {
			sum += x
		}
		f.DeathToSentMeanMs = ptr(sum / float64(len(sent)))
	}
	f.DeathToReceivedP50Ms, f.DeathToReceivedP99Ms = q(field(traced, func(d deathTime) float64 { return d.received }))
	f.ClientApplyP50Ms, f.ClientApplyP99Ms = q(field(traced, func(d deathTime) float64 { return d.removed - d.received }))
	lags := slices.DeleteFunc(field(ds, func(d deathTime) float64 { return d.lag }), math.IsNaN)
	f.KillLagP50Ms, f.KillLagP99Ms = q(lags)
}

// victimsPerRound is how many of a region's n cells one round of deaths
// takes: fewer than half (at most maxVictimsPerRound, at least one). Half
// or more of a region's cells silent at once is a mass expiry, which the
// controller holds rather than fails (regional/massexpiry.go): with 10
// cells, 5 silent ones stayed at the xDS client for the hold's 10 s.
func victimsPerRound(n int) int {
	return min(maxVictimsPerRound, max(1, (n-1)/2))
}

// timeDeaths makes n of region 0's cells die (kind) in rounds and times
// each death: from the kill or the silence to the first assignment the xDS
// client received without the cell. A round takes fewer than half the
// region's cells (victimsPerRound), each at its own random offset within
// one heartbeat interval of the round's start, so a death falls at a
// uniform phase of the cell's heartbeats (revived cells share the phase of
// their revival; killing them at once would always kill just after a
// heartbeat). Between rounds the victims come back (a silent one is killed
// first) and the next round waits until the xDS client has them again.
//
// A removal is timed at the receipt (Assignment.At) of the first
// assignment without the cell, watched from before the round's first
// death; when two assignments arrive closer together than the harness
// wakes, the later one's time is taken, which can only overstate. (Before,
// the watch began after the round's last death, so a round's earlier
// victims were timed at a later push: up to an interval too late where
// pushes are frequent.) A broken stream's death is timed from when the
// cell closed its sockets (the cell's clock; a child's wall clock is this
// machine's), not from the ask: on a saturated machine the control
// request and the cell's goroutine waited tens of milliseconds for the
// CPU, which the report gives apart (kill lag). A silent cell is timed
// from the ask, which can only overstate.
func (p *point) timeDeaths(ctx context.Context, kind string, n int) ([]deathTime, error) {
	cells := p.regions[0].cells
	per := victimsPerRound(len(cells))
	seed := uint64(p.spec.cells)<<16 | uint64(p.spec.regions)
	if kind == deathSilent {
		seed ^= 1 << 63
	}
	rng := rand.New(rand.NewPCG(p.cfg.Seed, seed))
	var out []deathTime
	next := 0
	for len(out) < n {
		k := min(per, n-len(out))
		victims := make([]string, 0, k)
		for range k {
			victims = append(victims, cells[next%len(cells)])
			next++
		}
		// Ready in the registry is not yet acked at the cell: on a loaded
		// machine the ack can lag.
		if err := p.waitUp(ctx, victims); err != nil {
			return out, err
		}
		times, err := p.deathRound(ctx, kind, victims, rng)
		out = append(out, times...)
		if err != nil {
			return out, err
		}
		for _, v := range victims {
			if kind == deathSilent {
				if _, err := p.fleet.kill(ctx, v); err != nil {
					return out, err
				}
			}
			if err := p.fleet.revive(ctx, v); err != nil {
				return out, err
			}
		}
		if err := p.waitBack(ctx, victims); err != nil {
			return out, err
		}
	}
	return out, nil
}

// deathRound makes victims die (kind), each at a random offset within one
// heartbeat interval, and returns each one's times (deathTime). The
// assignments are watched from before the first death, so a victim
// removed while later ones are still dying is timed at its own removal.
func (p *point) deathRound(ctx context.Context, kind string, victims []string, rng *rand.Rand) ([]deathTime, error) {
	offsets := make([]time.Duration, len(victims))
	for i := range offsets {
		offsets[i] = time.Duration(rng.Int64N(int64(p.cfg.HeartbeatInterval)))
	}
	slices.Sort(offsets)
	die := p.fleet.kill
	if kind == deathSilent {
		die = func(ctx context.Context, id string) (time.Time, error) {
			// The cell's goroutine stops at its next select; the ask's
			// time stands for it (a silent cell's removal takes a TTL).
			at := p.clock.Now()
			return at, p.fleet.silence(ctx, id)
		}
	}
	rm := newRemovals(len(victims))
	octx, cancel := context.WithTimeout(ctx, p.cfg.HeartbeatInterval+p.cfg.DeathTimeout)
	defer cancel()
	observed := make(chan error, 1)
	go func() { observed <- rm.observe(octx, p.watcher) }()
	round := p.clock.Now()
	for i, v := range victims {
		err := sleepCtx(ctx, p.clock, round.Add(offsets[i]).Sub(p.clock.Now()))
		if err == nil {
			rm.asked(v, p.clock.Now())
			var at time.Time
			if at, err = die(ctx, v); err == nil {
				rm.died(v, at)
			} else {
				err = fmt.Errorf("scale: %s: %w", kind, err)
			}
		}
		if err != nil {
			cancel()
			<-observed
			return nil, err
		}
	}
	// A removal seen before its death's time came back is settled by
	// died: observe may wait for an assignment that is not coming.
	var err error
	if rm.done() {
		cancel()
		<-observed
	} else if err = <-observed; err != nil && rm.done() {
		err = nil
	}
	if err != nil {
		n, total := rm.count()
		return nil, fmt.Errorf("scale: %s: %d of %d cells still at the xDS client after %v: %w",
			kind, total-n, total, p.cfg.DeathTimeout, err)
	}
	return rm.times(p.received, p.sent), nil
}

// removals are one round's deaths and the removals seen so far; observe
// and the round share them under mu. A death is asked of the cell first
// (asked), and its time, when the cell closed its sockets, comes back
// after (died): on a busy machine, after the removal's assignment. Until
// then the assignments without the cell received since the ask are kept
// (absent), and died takes the first at or after the death.
type removals struct {
	want int

	mu              sync.Mutex
	askedAt, diedAt map[string]time.Time
	removedAt       map[string]time.Time
	absent          map[string][]time.Time
}

func newRemovals(want int) *removals {
	return &removals{want: want, askedAt: map[string]time.Time{}, diedAt: map[string]time.Time{},
		removedAt: map[string]time.Time{}, absent: map[string][]time.Time{}}
}

// asked notes that the cell is asked to die at at.
func (r *removals) asked(id string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.askedAt[id] = at
}

// died sets the cell's time of death; the first assignment without it
// received since is its removal.
func (r *removals) died(id string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.diedAt[id] = at
	for _, t := range r.absent[id] {
		if !t.Before(at) {
			r.removedAt[id] = t
			break
		}
	}
	delete(r.absent, id)
}

func (r *removals) count() (removed, died int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.removedAt), len(r.askedAt)
}

func (r *removals) done() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.removedAt) == r.want
}

// observe reads every assignment the watcher publishes (when two arrive
// closer together than it wakes, it sees the later, which can only
// overstate) until each of want victims is out of one received at or
// after its death, or ctx ends.
func (r *removals) observe(ctx context.Context, w *xdsclient.Watcher) error {
	var seq uint64
	for {
		a, err := w.WaitFor(ctx, func(a xdsclient.Assignment) bool { return a.Seq > seq })
		if err != nil {
			return err
		}
		seq = a.Seq
		if r.see(a.At, a.Weights()) {
			return nil
		}
	}
}

// see takes an assignment received at at with weights ws; true once every
// victim is removed.
func (r *removals) see(at time.Time, ws map[string]uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, asked := range r.askedAt {
		if _, done := r.removedAt[id]; done || ws[id] != 0 {
			continue
		}
		// An assignment from before the death does not count (on a
		// loaded machine a cell can be out already, failed by its TTL).
		if died, ok := r.diedAt[id]; ok {
			if !at.Before(died) {
				r.removedAt[id] = at
			}
		} else if !at.Before(asked) {
			r.absent[id] = append(r.absent[id], at)
		}
	}
	return len(r.removedAt) == r.want
}

// times are the deaths' times; received and sent (either may be nil) are
// the client's and the controller's wire logs. The response an assignment
// came in is the last one the client read before it was applied (the
// client reads the next only after applying one), and that response is
// the last one the controller wrote before the client read it (a
// state-of-the-world server sends the next only after the client's ACK).
func (r *removals) times(received, sent *wireLog) []deathTime {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]deathTime, 0, len(r.diedAt))
	for id, at := range r.diedAt {
		d := deathTime{removed: ms(r.removedAt[id].Sub(at)), received: math.NaN(), sent: math.NaN(),
			lag: ms(at.Sub(r.askedAt[id]))}
		// A read or write before the death cannot have carried its
		// removal: the logs missed the one that did (a log reads only
		// its own connection, and keeps what it has room for), and the
		// death stays untraced rather than traced to the wrong response.
		if received != nil {
			if rcv, ok := received.lastBefore(r.removedAt[id]); ok && !rcv.Before(at) {
				d.received = ms(rcv.Sub(at))
				if sent != nil {
					if snt, ok := sent.lastBefore(rcv); ok && !snt.Before(at) {
						d.sent = ms(snt.Sub(at))
					}
				}
			}
		}
		out = append(out, d)
	}
	return out
}

// waitBack waits until every victim is up again and has a weight at the xDS
// client.
func (p *point) waitBack(ctx context.Context, victims []string) error {
	wctx, cancel := context.WithTimeout(ctx, p.cfg.DeathTimeout)
	defer cancel()
	if _, err := p.watcher.WaitFor(wctx, func(a xdsclient.Assignment) bool {
		ws := a.Weights()
		for _, v := range victims {
			if ws[v] == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("scale: revived cells not back at the xDS client within %v: %w", p.cfg.DeathTimeout, err)
	}
	return p.waitUp(ctx, victims)
}

// waitUp waits until every victim's stream is acked.
func (p *point) waitUp(ctx context.Context, victims []string) error {
	var upErr error
	err := waitUntil(ctx, p.clock, p.cfg.DeathTimeout, "victims' streams acked", func() bool {
		up, err := p.fleet.up(ctx, victims)
		upErr = err
		return up || err != nil
	})
	if upErr != nil {
		return upErr
	}
	return err
}
