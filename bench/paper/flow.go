package paper

import (
	"time"

	"github.com/isobar-mesh/isobar/gateway/flowcontrol"
)

// flowQueue is the gateway's flow-control queue (gateway/flowcontrol,
// with its default bounds and ages) over request indices: the same code
// isobar gateway runs, driven here in virtual time.
type flowQueue = flowcontrol.Queue[int]

// enqueue queues saturated request i in the flow-control queue (isobar
// with spec.flowControl) and answers 429 the entries its arrival
// displaced or found expired. false: not queued (no flow control, the
// request already left the queue once, or its band or the queue is full)
// and the caller answers it 429.
func (f *fleet) enqueue(i int) bool {
	r := &f.reqs[i]
	if !f.spec.flowControl || r.dequeued {
		return false
	}
	if f.queue == nil {
		q, err := flowcontrol.New[int](flowcontrol.DefaultConfig())
		if err != nil {
			return false // DefaultConfig is valid
		}
		f.queue = q
	}
	f.syncQueue()
	_, out, err := f.queue.Push(f.wall(), r.crit, tenantNames[r.tenant], i)
	f.shedQueued(out)
	if err != nil {
		return false
	}
	r.queued = true
	f.push(f.now+f.queue.Config().MaxAge[r.crit], evQueueExpire, 0, 0, 0)
	if until, ok := f.queue.Yields(f.wall(), r.crit); ok {
		f.push(until.Sub(f.base), evQueueExpire, 0, 0, 0) // offer it again then
	}
	return true
}

// syncQueue gives the queue the ingress's current estimates, as the
// gateway does before it calls the queue: the mean slot hold and the time
// to first token.
func (f *fleet) syncQueue() {
	f.queue.SetSlotHold(f.meanSlotHold())
	f.queue.SetTTFT(f.ttft)
}

// meanSlotHold is the mean of the ingress's slot-hold estimates over the
// cells that have one (0: none yet): what the gateway tells its queue.
func (f *fleet) meanSlotHold() time.Duration {
	var sum time.Duration
	n := 0
	for _, e := range f.cells {
		if e.slotHold > 0 {
			sum += e.slotHold
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

// yields reports whether request i, arriving, must wait in the queue
// even if a slot is free: its class yields to a more important one that
// is short (flowcontrol's Yields), as the gateway checks before its pick.
func (f *fleet) yields(i int) bool {
	r := &f.reqs[i]
	if !f.spec.flowControl || f.queue == nil || r.dequeued {
		return false
	}
	f.syncQueue()
	_, ok := f.queue.Yields(f.wall(), r.crit)
	return ok
}

// wall is the virtual instant now as the queue's time.
func (f *fleet) wall() time.Time { return f.base.Add(f.now) }

// shedQueued answers 429 the entries that left the queue other than by
// dispatch (evicted by a more important arrival, or expired).
func (f *fleet) shedQueued(out []flowcontrol.Entry[int]) {
	for _, e := range out {
		r := &f.reqs[e.Payload]
		r.status, r.end = statusShed, f.now
		f.ended++
	}
}

// dispatchQueued routes queued requests, most important band first and
// round-robin between tenants (the queue's Pop), while some endpoint is
// below the in-flight cap: what the gateway does when an attempt gives
// its slot back or a table update opens one (gateway/flow.go, offer).
// Every queued request may use every endpoint here, so Pop is the
// gateway's Dispatch with every entry eligible.
func (f *fleet) dispatchQueued() {
	for f.queue != nil && f.queue.Len() > 0 && f.belowCapAnywhere() {
		f.syncQueue()
		e, ok, expired := f.queue.Pop(f.wall())
		f.shedQueued(expired)
		if !ok {
			return
		}
		f.reqs[e.Payload].dequeued = true
		f.reqs[e.Payload].wait = f.now - f.reqs[e.Payload].arrive
		f.route(e.Payload)
	}
}

// expireQueued answers 429 the queued requests past their band's age.
func (f *fleet) expireQueued() {
	if f.queue != nil {
		f.syncQueue()
		f.shedQueued(f.queue.Expire(f.wall()))
	}
}

// belowCapAnywhere reports whether an endpoint with a weight is below
// its in-flight cap.
func (f *fleet) belowCapAnywhere() bool {
	for c, e := range f.cells {
		if e.weight > 0 && f.active[c] < f.capOf(c) {
			return true
		}
	}
	return false
}

// capOf is cell c's in-flight cap (spec.inflightCap > 0): the configured
// cap, or with spec.batchCap the cap isobar gateway derives per endpoint
// from its declared max_num_seqs, the round trip the controller pushed
// and the slot hold the ingress measured (flowcontrol.EndpointCap, the
// call the gateway makes).
func (f *fleet) capOf(c int) uint64 {
	if !f.spec.batchCap {
		return uint64(f.spec.inflightCap)
	}
	e := f.cells[c]
	var rtt time.Duration
	if f.siteRTT != nil { // none before the first tick
		rtt = f.siteRTT[e.site].rtt
	}
	return uint64(flowcontrol.EndpointCap(int64(e.prof.MaxNumSeqs), rtt, e.slotHold, f.spec.inflightCap))
}
