package gateway

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/isobar-mesh/isobar/gateway/placement"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// failureKind classifies how an upstream attempt failed.
type failureKind uint8

const (
	failNone     failureKind = iota
	failConnect              // the TCP connect failed or timed out
	failReset                // the connection broke before or during the response
	failTimeout              // the route or per-try timeout expired
	fail5xx                  // the endpoint answered 5xx
	failCanceled             // the client went away: nobody's fault upstream
)

func (k failureKind) String() string {
	switch k {
	case failConnect:
		return "connect"
	case failReset:
		return "reset"
	case failTimeout:
		return "timeout"
	case fail5xx:
		return "5xx"
	case failCanceled:
		return "canceled"
	}
	return "none"
}

// hostState is the runtime state of one upstream address, shared by every
// cluster that lists it (a cell is in its model's main, local and class
// clusters): in-flight requests, which least-request and the saturation cap
// read, and passive outlier state.
type hostState struct {
	addr     string
	inflight atomic.Int64
	// pending counts the prompt tokens of attempts sent to the address
	// that have not yet produced a first response byte (--lb isobar).
	pending atomic.Int64
	// ejectedUntil is the Unix nanosecond time the current ejection ends;
	// 0 or past: not ejected.
	ejectedUntil atomic.Int64

	// ctx is the address's rejection memory (--lb isobar), kept by the
	// registry across the address's absence from EDS.
	ctx *contextMemory
	// probeArmed is set while the endpoint carries a probe budget
	// (probation after an error-rate penalty); probeLeft is what is left of
	// it. --lb isobar sends the endpoint no request once it is spent.
	probeArmed atomic.Bool
	probeLeft  atomic.Int64
	// headMu guards pendingQ and lastFirst: the attempts whose prompt
	// tokens count in pending, oldest first, and when the last of them
	// left it (see headProgress).
	headMu    sync.Mutex
	pendingQ  []*attempt
	lastFirst time.Time
	// slotHold is an EWMA (weight slotHoldAlpha) of how long a successful
	// request held its batch slot on the address, in nanoseconds; 0 until
	// the first (--lb isobar's slot-wait term).
	slotHold atomic.Int64

	mu          sync.Mutex
	consecutive uint32    // consecutive failures (upstream 5xx, and local origin unless split)
	localFails  uint32    // consecutive local-origin failures, when split
	ejections   uint32    // ejection multiplier
	lastChange  time.Time // last ejection end (for the multiplier's decay)
}

func (h *hostState) ejected(nowNanos int64) bool { return nowNanos < h.ejectedUntil.Load() }

// acquire takes one in-flight slot if fewer than limit are taken.
func (h *hostState) acquire(limit int64) bool {
	for {
		n := h.inflight.Load()
		if n >= limit {
			return false
		}
		if h.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (h *hostState) release() { h.inflight.Add(-1) }

// addPending counts a's prompt tokens in the host's pending tokens.
func (h *hostState) addPending(a *attempt) {
	h.pending.Add(a.tokens)
	h.headMu.Lock()
	h.pendingQ = append(h.pendingQ, a)
	h.headMu.Unlock()
}

// removePending takes a's prompt tokens out of the host's pending tokens
// at now (its first byte, or its end).
func (h *hostState) removePending(a *attempt, now time.Time) {
	h.pending.Add(-a.tokens)
	h.headMu.Lock()
	if k := slices.Index(h.pendingQ, a); k >= 0 {
		h.pendingQ = slices.Delete(h.pendingQ, k, k+1)
	}
	h.lastFirst = now
	h.headMu.Unlock()
}

// pendingWork is the host's pending prompt tokens less the progress of the
// oldest (placement.HeadProgress at rate tokens/s): it has been prefilling
// since the later of its send and the host's last first byte.
func (h *hostState) pendingWork(now time.Time, rate float64) int64 {
	h.headMu.Lock()
	defer h.headMu.Unlock()
	n := h.pending.Load()
	if len(h.pendingQ) == 0 {
		return n
	}
	head := h.pendingQ[0]
	from := head.sent
	if h.lastFirst.After(from) {
		from = h.lastFirst
	}
	return max(n-placement.HeadProgress(head.tokens, rate, now.Sub(from)), 0)
}

// slotHoldAlpha is the weight of the newest sample in slotHold: about the
// last ten completions (the bench's ingress uses the same).
const slotHoldAlpha = 0.1

// observeSlotHold folds one successful request's slot hold into slotHold.
func (h *hostState) observeSlotHold(d time.Duration) { observeEWMA(&h.slotHold, d) }

// observeEWMA folds the sample d into the EWMA v (nanoseconds, weight
// slotHoldAlpha for d; the first sample is taken as it is), lock-free.
// A sample <= 0 is not a measurement and is left out.
func observeEWMA(v *atomic.Int64, d time.Duration) {
	if d <= 0 {
		return
	}
	for {
		old := v.Load()
		next := int64(d)
		if old > 0 {
			next = old + int64(slotHoldAlpha*float64(int64(d)-old))
		}
		if v.CompareAndSwap(old, next) {
			return
		}
	}
}

// setProbeBudget applies the endpoint's published probe budget: a budget
// arms the count once (a repeated push of the same probe slot does not
// refill it); 0 disarms it.
func (h *hostState) setProbeBudget(budget uint32) {
	if budget == 0 {
		h.probeArmed.Store(false)
		return
	}
	if !h.probeArmed.Load() {
		h.probeLeft.Store(int64(budget))
		h.probeArmed.Store(true)
	}
}

// probeSpent reports an armed probe budget with nothing left.
func (h *hostState) probeSpent() bool { return h.probeArmed.Load() && h.probeLeft.Load() <= 0 }

// spendProbe takes one request from an armed probe budget.
func (h *hostState) spendProbe() {
	if !h.probeArmed.Load() {
		return
	}
	for {
		n := h.probeLeft.Load()
		if n <= 0 || h.probeLeft.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// recordSuccess resets the consecutive-failure count.
func (h *hostState) recordSuccess() {
	h.mu.Lock()
	h.consecutive, h.localFails = 0, 0
	h.mu.Unlock()
}

// recordFailure counts a failure and, when the cluster's outlier policy
// says so, ejects the host. ejectedInCluster counts the other hosts of the
// cluster currently ejected and total its size; it is called only when an
// ejection is due. It returns the ejection's length, or 0.
// local says the failure is of local origin (connect failure, reset,
// timeout) rather than an upstream 5xx.
func (h *hostState) recordFailure(now time.Time, p *xdsclient.OutlierPolicy, local bool, ejectedInCluster func() (ejected, total int)) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p == nil || h.ejected(now.UnixNano()) {
		return 0
	}
	count, limit, enforcing := &h.consecutive, p.Consecutive5xx, p.Enforcing5xx
	if local && p.SplitLocalOrigin {
		count, limit, enforcing = &h.localFails, p.ConsecutiveLocalOrigin, p.EnforcingLocalOrigin
	}
	*count++
	if limit == 0 || *count < limit {
		return 0
	}
	if enforcing < 100 && rand.Uint32N(100) >= enforcing {
		return 0
	}
	// Envoy ejects at most max_ejection_percent of a cluster, but always
	// at least one host.
	ej, total := ejectedInCluster()
	if ej > 0 && uint64(ej+1)*100 > uint64(p.MaxEjectionPercent)*uint64(total) {
		return 0
	}
	// The multiplier decays by one per interval spent un-ejected.
	if h.ejections > 0 && !h.lastChange.IsZero() && p.Interval > 0 {
		decay := uint32(min(now.Sub(h.lastChange)/p.Interval, 1<<20))
		h.ejections -= min(h.ejections, decay)
	}
	h.ejections++
	d := time.Duration(h.ejections) * p.BaseEjectionTime
	d = min(d, max(p.MaxEjectionTime, p.BaseEjectionTime))
	h.consecutive, h.localFails = 0, 0
	h.ejectedUntil.Store(now.Add(d).UnixNano())
	h.lastChange = now.Add(d)
	return d
}

// clusterState is the runtime state of one cluster, kept across
// configuration updates by name.
type clusterState struct {
	active  atomic.Int64 // upstream attempts in flight, retries included
	retries atomic.Int64 // retry attempts in flight (admitted, not finished)
	// lb is the cluster's load balancer, replaced by configuration
	// rebuilds (under the gateway's configuration mutex) when the
	// cluster's LB settings change; requests reach it through their
	// table's clusterRT.
	lb *lbState
}

// tryRetry admits a retry when the cluster's retry budget (or, without one,
// its max_retries circuit breaker) allows another concurrent retry: at most
// max(Percent % of active requests, MinConcurrency).
func (c *clusterState) tryRetry(p *xdsclient.ClusterPolicy) bool {
	var limit int64
	if b := p.RetryBudget; b != nil {
		limit = max(int64(b.Percent/100*float64(c.active.Load())), int64(b.MinConcurrency))
	} else {
		limit = int64(p.MaxRetries)
	}
	for {
		n := c.retries.Load()
		if n >= limit {
			return false
		}
		if c.retries.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// hostRegistry hands out the shared runtime state by address and cluster
// name. Configuration rebuilds hold it; requests never touch it.
type hostRegistry struct {
	mu       sync.Mutex
	hosts    map[string]*hostState
	clusters map[string]*clusterState
	// memories are the rejection memories by address, kept while the
	// address is listed or its memory has not expired.
	memories map[string]*contextMemory
}

func newHostRegistry() *hostRegistry {
	return &hostRegistry{hosts: make(map[string]*hostState), clusters: make(map[string]*clusterState),
		memories: make(map[string]*contextMemory)}
}

// sync returns the state of each address and cluster name, creating what is
// new and forgetting what is no longer listed (requests still holding a
// forgotten state finish with it).
func (r *hostRegistry) sync(addrs map[string]struct{}, clusters map[string]struct{}, now time.Time) (map[string]*hostState, map[string]*clusterState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for a := range r.hosts {
		if _, ok := addrs[a]; !ok {
			delete(r.hosts, a)
		}
	}
	for a, m := range r.memories {
		if _, ok := addrs[a]; !ok && m.expired(now) {
			delete(r.memories, a)
		}
	}
	for a := range addrs {
		if r.hosts[a] == nil {
			m := r.memories[a]
			if m == nil {
				m = &contextMemory{}
				r.memories[a] = m
			}
			r.hosts[a] = &hostState{addr: a, ctx: m}
		}
	}
	for c := range r.clusters {
		if _, ok := clusters[c]; !ok {
			delete(r.clusters, c)
		}
	}
	for c := range clusters {
		if r.clusters[c] == nil {
			r.clusters[c] = &clusterState{}
		}
	}
	hs := make(map[string]*hostState, len(r.hosts))
	for a, h := range r.hosts {
		hs[a] = h
	}
	cs := make(map[string]*clusterState, len(r.clusters))
	for c, s := range r.clusters {
		cs[c] = s
	}
	return hs, cs
}
