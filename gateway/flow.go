package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/gateway/flowcontrol"
	"github.com/isobar-mesh/isobar/reqclass"
)

// Flow control. A request whose every eligible endpoint is at its
// in-flight cap (balancer.capOf) on its first pick, or whose class yields
// (Gateway.yields), waits in the gateway's
// one flowcontrol.Queue (bands by criticality, round-robin between tenant
// buckets, Config.Queue's bounds) instead of being answered 429 at once.
// Each time an attempt gives its endpoint slot back (attempt.close), the
// queue is offered the slot: Dispatch walks the waiters in dispatch order
// and picks, for each, as the proxy would (chooseEndpoint with its own
// query: cluster, residency, prompt); the first whose pick succeeds gets
// the endpoint, its slot already taken, and proceeds as if its first pick
// had found it. A table update offers the queue every new slot the same
// way. Picks that fail for a cluster (and residency set) are not tried
// again within one offer.
//
// A waiter that is evicted (a more important arrival while the queue is
// full), expires (Config.Queue.MaxAge of its class, less the time to first
// token for an Objective class: the queue noticing it, at the latest when
// the waiter's own timer at MaxAge on the gateway's clock makes the queue
// expire what is due), or finds its band or
// the queue full, is answered 429 with Retry-After and the shed header
// naming the cause (queue_evicted, queue_expired, queue_full); a client
// that leaves while waiting is withdrawn (499, nothing written).
//
// Concurrency: the queue is guarded by flowQueue.mu; a waiter's handler
// goroutine blocks on its own 1-buffered channel, written once by
// whichever goroutine takes the waiter out (a releasing handler, the
// configuration goroutine, an arriving request that evicts or expires it,
// another waiter's timer). The queue's estimates (slot hold, time to first
// token) are atomics, read under mu before each call (syncQueue).
// Picks run under mu and take the clusters' balancer mutexes inside it;
// nothing takes mu while holding those.

// Shed causes of the flow-control queue (the shed header and metric
// reason).
const (
	shedQueueFull    = "queue_full"
	shedQueueEvicted = "queue_evicted"
	shedQueueExpired = "queue_expired"
)

// waiter is one request waiting in the queue.
type waiter struct {
	cl   *clusterRT
	q    pickQuery
	done chan waitResult // 1-buffered, written once
}

// waitResult is how a waiter left the queue: dispatched with its pick's
// result (h holding a slot on pickOK), or the outcome that sheds it.
type waitResult struct {
	h       *hostRT
	res     pickResult
	outcome flowcontrol.Outcome
}

// flowQueue is the gateway's queue with its metrics.
type flowQueue struct {
	clock clockwork.Clock
	m     *flowMetrics

	mu sync.Mutex
	q  *flowcontrol.Queue[*waiter]
}

// flowMetrics are the queue's metrics.
type flowMetrics struct {
	length   *prometheus.GaugeVec     // criticality
	wait     *prometheus.HistogramVec // criticality
	outcomes *prometheus.CounterVec   // criticality, outcome
	yielded  *prometheus.CounterVec   // criticality
}

var queueOutcomes = []string{"dispatched", "evicted", "expired", "full", "removed"}

func newFlowMetrics() *flowMetrics {
	m := &flowMetrics{
		length: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_gateway_queue_requests",
			Help: "Requests waiting in the flow-control queue for an endpoint slot, by criticality.",
		}, []string{"criticality"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "isobar_gateway_queue_wait_seconds",
			Help:    "Time requests waited in the flow-control queue, by criticality, whatever their outcome.",
			Buckets: latencyBuckets,
		}, []string{"criticality"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_queue_outcomes_total",
			Help: "Requests that left the flow-control queue (or could not enter it), by criticality and outcome: dispatched, evicted (by a more important arrival), expired (past its class's max age), full (its band or the queue full on arrival), removed (the client left).",
		}, []string{"criticality", "outcome"}),
		yielded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_queue_yielded_total",
			Help: "Requests that arrived while their class yielded to a more important one that was short (flow control's yield) and so went to the queue whatever the free slots, by criticality.",
		}, []string{"criticality"}),
	}
	for _, c := range reqclass.All() {
		m.yielded.WithLabelValues(c.String())
		m.length.WithLabelValues(c.String())
		m.wait.WithLabelValues(c.String())
		for _, o := range queueOutcomes {
			m.outcomes.WithLabelValues(c.String(), o)
		}
	}
	return m
}

func (m *flowMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.length, m.wait, m.outcomes, m.yielded}
}

func newFlowQueue(cfg flowcontrol.Config, clock clockwork.Clock, m *flowMetrics) (*flowQueue, error) {
	q, err := flowcontrol.New[*waiter](cfg)
	if err != nil {
		return nil, err
	}
	return &flowQueue{clock: clock, m: m, q: q}, nil
}

// settle answers the entries that left the queue other than by dispatch
// and counts them; call it without mu.
func (f *flowQueue) settle(out []flowcontrol.Entry[*waiter]) {
	now := f.clock.Now()
	for _, e := range out {
		f.count(e, now)
		e.Payload.done <- waitResult{outcome: e.Outcome}
	}
}

func (f *flowQueue) count(e flowcontrol.Entry[*waiter], now time.Time) {
	f.m.outcomes.WithLabelValues(e.Class.String(), e.Outcome.String()).Inc()
	f.m.wait.WithLabelValues(e.Class.String()).Observe(now.Sub(e.Enqueued).Seconds())
}

// gauges refreshes the length gauges; call it under mu.
func (f *flowQueue) gauges() {
	for c, s := range f.q.Stats() {
		f.m.length.WithLabelValues(reqclass.Criticality(c).String()).Set(float64(s.Len))
	}
}

// offerOne offers the queue one freed slot.
func (g *Gateway) offerOne() { g.offer(1) }

// offer dispatches waiters while one can be picked for (at most max; 0:
// until none can).
func (g *Gateway) offer(max int) {
	f := g.flow
	if f == nil {
		return
	}
	for n := 0; max == 0 || n < max; n++ {
		type key struct {
			cl  *clusterRT
			set string
		}
		failed := map[key]bool{}
		var got waitResult
		f.mu.Lock()
		if f.q.Len() == 0 {
			f.mu.Unlock()
			return
		}
		g.syncQueue()
		e, ok, expired := f.q.Dispatch(g.clock.Now(), func(e flowcontrol.Entry[*waiter]) bool {
			w := e.Payload
			// The cluster as the table now has it (its hosts may have
			// changed since the request was queued).
			cl := w.cl
			if t := g.tbl.Load(); t != nil {
				if cur := t.clusters[cl.name]; cur != nil {
					cl = cur
				}
			}
			k := key{cl, w.q.class.set}
			if failed[k] {
				return false
			}
			h, res := g.chooseEndpoint(cl, w.q)
			if res == pickSaturated {
				failed[k] = true
				return false
			}
			got = waitResult{h: h, res: res, outcome: flowcontrol.Dispatched}
			return true
		})
		f.gauges()
		f.mu.Unlock()
		f.settle(expired)
		if !ok {
			return
		}
		f.count(e, g.clock.Now())
		e.Payload.done <- got
	}
}

// wait queues a request whose first pick found every eligible endpoint
// saturated, or whose class yields (yields), and blocks until it is
// dispatched (h and res as from chooseEndpoint) or shed (reason: one of
// the shedQueue causes), or ctx ends (reason "canceled": the client left
// or the route timed out). While its class yields, a timer at the end of
// the yield offers the queue again (the bench's ingress schedules the
// same offer, bench/paper flow.go enqueue).
func (g *Gateway) wait(ctx context.Context, cl *clusterRT, q pickQuery, c *classOf) (h *hostRT, res pickResult, reason string) {
	f := g.flow
	w := &waiter{cl: cl, q: q, done: make(chan waitResult, 1)}
	f.mu.Lock()
	now := g.clock.Now()
	g.syncQueue()
	handle, out, err := f.q.Push(now, c.crit, c.bucket, w)
	var until time.Time
	yield := false
	if err == nil {
		until, yield = f.q.Yields(now, c.crit)
	}
	f.gauges()
	f.mu.Unlock()
	f.settle(out)
	if err != nil {
		f.m.outcomes.WithLabelValues(c.crit.String(), "full").Inc()
		if errors.Is(err, flowcontrol.ErrClass) {
			g.log.Error("flow control refused a request class", "err", err)
		}
		return nil, pickSaturated, shedQueueFull
	}
	// A slot may have freed between the saturated pick and the push.
	g.offer(1)
	timer := g.clock.NewTimer(f.q.Config().MaxAge[c.crit])
	defer timer.Stop()
	var again <-chan time.Time
	if yield {
		t := g.clock.NewTimer(max(until.Sub(now), 0))
		defer t.Stop()
		again = t.Chan()
	}
	var r waitResult
	for waiting := true; waiting; {
		waiting = false
		select {
		case r = <-w.done:
		case <-ctx.Done():
			r = g.withdraw(handle, w, flowcontrol.Removed)
		case <-timer.Chan():
			r = g.expireWait(handle, w)
		case <-again:
			// The more important band may no longer be short.
			again, waiting = nil, true
			g.offer(0)
		}
	}
	switch r.outcome {
	case flowcontrol.Dispatched:
		return r.h, r.res, ""
	case flowcontrol.Evicted:
		return nil, pickSaturated, shedQueueEvicted
	case flowcontrol.Expired:
		return nil, pickSaturated, shedQueueExpired
	}
	return nil, pickSaturated, "canceled"
}

// expireWait is a waiter's age timer: the queue takes out every entry
// past its age (so that each loss marks its band short, as the bench's
// expiry event does), the queue is offered what is free, and the
// waiter's own outcome is read; a waiter the queue did not find expired
// (the time to first token shortens an Objective band's age, never
// lengthens it, so only a clock step back does that) is withdrawn
// Expired.
func (g *Gateway) expireWait(handle flowcontrol.Handle, w *waiter) waitResult {
	f := g.flow
	f.mu.Lock()
	g.syncQueue()
	out := f.q.Expire(g.clock.Now())
	f.gauges()
	f.mu.Unlock()
	f.settle(out)
	g.offer(0)
	return g.withdraw(handle, w, flowcontrol.Expired)
}

// yields reports whether a fresh request of class c waits in the queue
// even while a slot is free: its class yields to a more important band
// that is short (flowcontrol Queue.Yields, Config.Queue.Yield). The proxy
// asks before a request's first pick, as the bench's ingress does.
func (g *Gateway) yields(c reqclass.Criticality) bool {
	f := g.flow
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	g.syncQueue()
	_, ok := f.q.Yields(g.clock.Now(), c)
	return ok
}

// syncQueue gives the queue the gateway's current estimates before a
// call, as the bench's ingress does (bench/paper flow.go, syncQueue): the
// mean slot hold over the table's endpoints that have one (SetSlotHold)
// and the time to first byte (SetTTFT). Call it under flowQueue.mu.
func (g *Gateway) syncQueue() {
	g.flow.q.SetSlotHold(g.meanSlotHold())
	g.flow.q.SetTTFT(time.Duration(g.ttft.Load()))
}

// meanSlotHold is the mean of hostState.slotHold over the current
// table's addresses that have one; 0 when none has.
func (g *Gateway) meanSlotHold() time.Duration {
	t := g.tbl.Load()
	if t == nil {
		return 0
	}
	var sum, n int64
	for _, h := range t.hosts {
		if d := h.slotHold.Load(); d > 0 {
			sum += d
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return time.Duration(sum / n)
}

// withdraw takes w out of the queue with outcome o, or, when another
// goroutine took it out first, returns what that one sent. A dispatched
// waiter whose client left gives its slot back.
func (g *Gateway) withdraw(handle flowcontrol.Handle, w *waiter, o flowcontrol.Outcome) waitResult {
	f := g.flow
	f.mu.Lock()
	e, ok := f.q.Remove(handle)
	f.gauges()
	f.mu.Unlock()
	if ok {
		e.Outcome = o
		f.count(e, g.clock.Now())
		return waitResult{outcome: o}
	}
	r := <-w.done
	if o == flowcontrol.Removed && r.h != nil {
		// Dispatched as the client left: the slot goes to the next waiter.
		r.h.st.release()
		g.offer(1)
		return waitResult{outcome: o}
	}
	return r
}

// QueueBand is one criticality's share of the queue (QueueState).
type QueueBand struct {
	Criticality string  `json:"criticality"`
	Waiting     int     `json:"waiting"`
	Tenants     int     `json:"tenants"`
	OldestSecs  float64 `json:"oldest_seconds"`
	MaxLen      int     `json:"max_len"`
	MaxAgeSecs  float64 `json:"max_age_seconds"`
}

// QueueState is the flow-control queue now, most important band first
// (nil when flow control is off): the live view's and /debug/queue's.
func (g *Gateway) QueueState() []QueueBand {
	f := g.flow
	if f == nil {
		return nil
	}
	now := g.clock.Now()
	f.mu.Lock()
	st, cfg := f.q.Stats(), f.q.Config()
	f.mu.Unlock()
	out := make([]QueueBand, 0, reqclass.Count)
	for _, c := range reqclass.All() {
		b := QueueBand{Criticality: c.String(), Waiting: st[c].Len, Tenants: st[c].Tenants, MaxLen: cfg.MaxLen[c], MaxAgeSecs: cfg.MaxAge[c].Seconds()}
		if st[c].Len > 0 {
			b.OldestSecs = now.Sub(st[c].Oldest).Seconds()
		}
		out = append(out, b)
	}
	return out
}

// handleQueue serves QueueState as JSON (GET /debug/queue).
func (g *Gateway) handleQueue(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"bands": g.QueueState()})
}
