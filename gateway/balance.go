package gateway

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/isobar-mesh/isobar/gateway/lb"
	"github.com/isobar-mesh/isobar/gateway/placement"
)

// Envoy's defaults for priority and locality health.
const (
	// overprovisioningPercent is the default overprovisioning_factor (140).
	overprovisioningPercent = 140
	// panicPercent is the default healthy_panic_threshold (50 %).
	panicPercent = 50
	// maxDrawRounds bounds the rounds of pick, each a choice and an
	// acquire: a host may reach its cap between the two.
	maxDrawRounds = 4
)

// hostRT is one endpoint of a cluster in a table.
type hostRT struct {
	ep     Endpoint
	st     *hostState
	label  string // metrics and report identity: the cell id, else the address
	remote bool   // in another region: requests carry the hop header
}

type localityRT struct {
	weight uint32
	hosts  []*hostRT
}

// priorityRT is one priority level: its hosts in EDS order (Envoy's host
// vector), each host's locality, and the localities in order.
type priorityRT struct {
	localities []*localityRT
	hosts      []*hostRT
	locOf      []int // locality index of hosts[i]
}

// clusterRT is a cluster of a table: its policy, its endpoints grouped by
// priority and locality, its shared runtime state and its load balancer.
type clusterRT struct {
	name       string
	policy     *ClusterPolicy
	st         *clusterState
	priorities []*priorityRT
	all        []*hostRT
	lb         *lbState
}

// ejectedCount counts the cluster's hosts other than h that are ejected.
func (c *clusterRT) ejectedCount(h *hostState, nowNanos int64) (ejected, total int) {
	for _, x := range c.all {
		if x.st != h && x.st.ejected(nowNanos) {
			ejected++
		}
	}
	return ejected, len(c.all)
}

// pickResult says why no host was picked.
type pickResult uint8

const (
	pickOK        pickResult = iota
	pickNoHost               // no healthy endpoint (503)
	pickSaturated            // every candidate at the in-flight cap (429)
)

// globalRand is math/rand/v2's goroutine-safe generator as an lb.Rand.
type globalRand struct{}

func (globalRand) Uint64() uint64 { return rand.Uint64() }

// picker chooses endpoints. Its own fields are read-only; the load
// balancers' state lives in each cluster's lbState, under its mutex.
type picker struct {
	mode  LBMode
	limit int64   // in-flight cap per endpoint
	rand  lb.Rand // safe for concurrent use
	place placement.Config
}

// pickQuery is one pick's input.
type pickQuery struct {
	// exclude lists the hosts already tried when the route has the
	// previous_hosts retry predicate.
	exclude []*hostRT
	now     int64 // Unix nanoseconds, for ejection deadlines
	// tokens is the request's prompt size (--lb isobar).
	tokens int64
	// redraws is the route's host_selection_retry_max_attempts: how often
	// a pick the predicate (or the in-flight cap) rejects is drawn again.
	redraws uint32
}

// pick chooses a host of c and takes one of its in-flight slots; the
// caller releases it. Hosts in q.exclude are avoided while another
// candidate is left.
func (p *picker) pick(c *clusterRT, q pickQuery) (*hostRT, pickResult) {
	if len(c.all) == 0 {
		return nil, pickNoHost
	}
	saturated := false
	for range maxDrawRounds {
		h, sat := p.choose(c, q)
		saturated = saturated || sat
		if h == nil {
			break
		}
		if h.st.acquire(p.limit) {
			return h, pickOK
		}
		saturated = true
	}
	if saturated {
		return nil, pickSaturated
	}
	return nil, pickNoHost
}

// accepts reports whether h may take the request: not excluded (the
// previous_hosts predicate), weight > 0 and below the in-flight cap.
func (p *picker) accepts(h *hostRT, exclude []*hostRT) bool {
	return h.ep.Weight > 0 && !slices.Contains(exclude, h) && h.st.inflight.Load() < p.limit
}

// choose is Envoy's LoadBalancerBase::chooseHost (load_balancer_impl.cc):
// chooseHostOnce, drawn again up to q.redraws times while the retry host
// predicate rejects the host (here also while the host is at the
// gateway's in-flight cap, which Envoy does not have). When every draw is
// rejected, Envoy would send the request to the last host anyway; the
// gateway instead scans for any acceptable host (scan), so that a retry
// never returns to a tried endpoint while another is left and a full
// endpoint is never overfilled.
func (p *picker) choose(c *clusterRT, q pickQuery) (*hostRT, bool) {
	s := c.lb
	s.mu.Lock()
	var h *hostRT
	for range 1 + q.redraws {
		if h = s.chooseOnce(p, q); h == nil || p.accepts(h, q.exclude) {
			break
		}
	}
	s.mu.Unlock()
	if h != nil && p.accepts(h, q.exclude) {
		return h, false
	}
	return p.scan(c, q)
}

// scan is the fallback when the balancer's draws found no acceptable host:
// the acceptable host with the fewest requests in flight (the first in EDS
// order on ties), healthy ones first, then ejected ones, then, when only
// tried hosts are left, tried ones. saturated reports that some host was
// left out only for its cap.
func (p *picker) scan(c *clusterRT, q pickQuery) (best *hostRT, saturated bool) {
	for _, step := range []struct {
		exclude      []*hostRT
		allowEjected bool
	}{{q.exclude, false}, {q.exclude, true}, {nil, true}} {
		var bestN int64
		for _, h := range c.all {
			if h.ep.Weight == 0 || slices.Contains(step.exclude, h) || (!step.allowEjected && h.st.ejected(q.now)) {
				continue
			}
			n := h.st.inflight.Load()
			if n >= p.limit {
				saturated = true
				continue
			}
			if best == nil || n < bestN {
				best, bestN = h, n
			}
		}
		if best != nil {
			return best, saturated
		}
	}
	return nil, saturated
}

// lbState is a cluster's load balancer: what one Envoy worker thread holds
// for the cluster (EdfLoadBalancerBase and its LocalityWrr), kept across
// table rebuilds by cluster name. The gateway runs one such worker per
// cluster for all its request goroutines, serialised by mu: it behaves as
// an Envoy started with --concurrency 1. (A multi-worker Envoy is modelled
// by the benchmark's isobar-envoy policy with gateway/lb's Pool.) The
// active-request counts the balancers read are the gateway's real
// in-flight counts per address (hostState.inflight), which, as Envoy's
// rq_active, are incremented only after the pick.
type lbState struct {
	// key identifies the configuration the state was built for (mode and
	// the cluster's LB settings). When it changes the cluster gets a new
	// lbState, as Envoy builds a new load balancer, with a new seed, for a
	// changed cluster.
	key    string
	policy lb.Policy
	random bool // Envoy's RANDOM: one uniform draw over the source's hosts
	// localityWeighted: pick a locality first (Envoy's
	// locality_weighted_lb_config).
	localityWeighted bool
	// flat: the rr and lr baselines: one host set of all the cluster's
	// hosts, every positive weight counted as 1.
	flat bool
	// seed is EdfLoadBalancerBase::seed_: it seeds every host source's
	// schedule and round-robin index, and the locality schedules.
	seed uint64

	mu    sync.Mutex
	sig   string        // the host set installed (addresses, weights, localities)
	prios []*priorityRT // the host set in use, replaced on every install
	// per holds the refresh state of each priority. A nil mask means a
	// refresh is due.
	per  []prioLB
	bals map[srcKey]*lb.Balancer
	mask []bool // scratch for refresh
	// scratch for place
	placeHosts []*hostRT
	placeIn    []placement.Host
}

// prioLB is a priority's state as of its last refresh.
type prioLB struct {
	mask     []bool  // the healthy (not ejected) hosts at the last refresh
	panic    bool    // isHostSetInPanic: healthy below panicPercent
	health   uint32  // Envoy's per-priority health, 0..100
	locEDF   *lb.EDF // LocalityWrr's healthy locality scheduler; nil when no locality has weight
	locScale []float64
}

// srcKind is Envoy's HostsSource::SourceType.
type srcKind uint8

const (
	srcAll      srcKind = iota // AllHosts (panic)
	srcHealthy                 // HealthyHosts
	srcLocality                // LocalityHealthyHosts
)

// srcKey is Envoy's HostsSource: a priority, a source type and, for
// localities, the locality's index. Each has its own schedule and
// round-robin index (rr_indexes_), kept across refreshes.
type srcKey struct {
	prio, loc int
	kind      srcKind
}

// lbKey is the configuration an lbState is built for.
func lbKey(mode LBMode, p *ClusterPolicy) string {
	switch mode {
	case LBRoundRobin, LBLeastRequest:
		return string(mode)
	case LBIsobar:
		return string(mode) + "|" + strconv.FormatBool(p.LocalityWeighted)
	}
	return strings.Join([]string{string(mode), p.LBPolicy, strconv.FormatUint(uint64(p.ChoiceCount), 10),
		strconv.FormatBool(p.FullScan), strconv.FormatFloat(p.ActiveRequestBias, 'g', -1, 64),
		strconv.FormatBool(p.LocalityWeighted)}, "|")
}

// newLBState builds the load balancer of a cluster for mode. The policy
// is the cluster's in LBXDS mode (ROUND_ROBIN, LEAST_REQUEST with its
// choice_count, selection method and active_request_bias, or RANDOM), and
// Envoy's defaults for the baselines: ROUND_ROBIN for rr, LEAST_REQUEST
// with two choices for lr.
func newLBState(mode LBMode, p *ClusterPolicy, seed uint64) *lbState {
	s := &lbState{key: lbKey(mode, p), seed: seed, bals: make(map[srcKey]*lb.Balancer)}
	switch mode {
	case LBRoundRobin:
		s.policy, s.flat = lb.DefaultPolicy(lb.RoundRobin), true
	case LBLeastRequest:
		s.policy, s.flat = lb.DefaultPolicy(lb.LeastRequest), true
	case LBIsobar:
		s.policy = lb.DefaultPolicy(lb.RoundRobin) // unused: placement picks
		s.localityWeighted = p.LocalityWeighted
	default:
		s.localityWeighted = p.LocalityWeighted
		switch p.LBPolicy {
		case lbLeastRequest:
			s.policy = lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: p.ChoiceCount, FullScan: p.FullScan,
				ActiveRequestBias: p.ActiveRequestBias}
			if s.policy.Validate() != nil { // decodeCluster refuses these; belt and braces
				s.policy = lb.DefaultPolicy(lb.LeastRequest)
			}
		case lbRandom:
			s.policy, s.random = lb.DefaultPolicy(lb.RoundRobin), true
		default:
			s.policy = lb.DefaultPolicy(lb.RoundRobin)
		}
	}
	return s
}

// hostSetSig identifies a host set: what, if it changes, makes Envoy
// refresh its load balancer (membership, weights, localities, priorities).
func hostSetSig(prios []*priorityRT) string {
	var b strings.Builder
	for i, pr := range prios {
		for j, h := range pr.hosts {
			l := pr.localities[pr.locOf[j]]
			e := &h.ep
			b.WriteString(strconv.Itoa(i))
			for _, s := range []string{e.Region, e.Zone, e.SubZone, strconv.FormatUint(uint64(l.weight), 10), e.Address,
				strconv.FormatUint(uint64(e.Weight), 10)} {
				b.WriteByte(0)
				b.WriteString(s)
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// install gives the balancer the host set of a new table. An unchanged set
// (another resource type was updated) keeps every schedule as it is; a
// changed one makes every priority refresh at its next pick. Schedules and
// round-robin indexes are kept by host source, as Envoy keeps its load
// balancer across EDS updates.
func (s *lbState) install(prios []*priorityRT) {
	sig := hostSetSig(prios)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prios = prios
	if sig == s.sig && len(s.per) == len(prios) {
		return
	}
	s.sig = sig
	s.per = make([]prioLB, len(prios))
}

// weight is host j's weight for the balancers: the endpoint weight, or 1
// for the baselines (0 stays 0: never picked).
func (s *lbState) weight(h *hostRT) uint32 {
	if s.flat {
		return min(h.ep.Weight, 1)
	}
	return h.ep.Weight
}

// hostActive is the Active of a priority's balancers: the in-flight count
// of each host of the priority.
type hostActive []*hostRT

func (a hostActive) Active(i int) uint64 { return uint64(max(a[i].st.inflight.Load(), 0)) }

// refresh re-derives each priority's health from the ejection deadlines
// and, where the healthy set changed (or the host set did), refreshes it:
// EdfLoadBalancerBase::refresh rebuilds every host source of the priority
// (all hosts, healthy hosts, each locality's healthy hosts) from the same
// seed, and LocalityWrr rebuilds the locality schedule. Envoy does this
// when outlier detection ejects or re-admits a host; the gateway's
// ejections end at a deadline, so the change is noticed at the next pick.
func (s *lbState) refresh(now int64, placeMode bool) {
	for i, pr := range s.prios {
		n := len(pr.hosts)
		s.mask = s.mask[:0]
		healthy := 0
		for _, h := range pr.hosts {
			ok := !h.st.ejected(now)
			s.mask = append(s.mask, ok)
			if ok {
				healthy++
			}
		}
		st := &s.per[i]
		if st.mask != nil && slices.Equal(st.mask, s.mask) {
			continue
		}
		st.mask = append(st.mask[:0], s.mask...)
		// recalculatePerPriorityState: health = min(100,
		// overprovisioning_factor × healthy / total), integer arithmetic.
		st.health = uint32(min(100, overprovisioningPercent*healthy/n))
		// isHostSetInPanic: healthy percentage below the panic threshold.
		st.panic = 100*float64(healthy)/float64(n) < panicPercent
		if placeMode {
			continue
		}
		s.refreshSources(i, pr, st)
	}
}

// refreshSources is EdfLoadBalancerBase::refresh(priority) and
// LocalityWrr::rebuildLocalityScheduler for priority i.
func (s *lbState) refreshSources(i int, pr *priorityRT, st *prioLB) {
	active := hostActive(pr.hosts)
	w := make([]uint32, len(pr.hosts))
	update := func(k srcKey, include func(j int) bool) {
		for j, h := range pr.hosts {
			w[j] = 0
			if include(j) {
				w[j] = s.weight(h)
			}
		}
		b := s.bals[k]
		if b == nil {
			var err error
			if b, err = lb.NewBalancer(s.policy, s.seed); err != nil {
				b, _ = lb.NewBalancer(lb.DefaultPolicy(lb.RoundRobin), s.seed)
			}
			s.bals[k] = b
		}
		b.Update(w, active)
	}
	update(srcKey{prio: i, kind: srcAll}, func(int) bool { return true })
	update(srcKey{prio: i, kind: srcHealthy}, func(j int) bool { return st.mask[j] })
	st.locEDF = nil
	if !s.localityWeighted {
		return
	}
	for l := range pr.localities {
		update(srcKey{prio: i, loc: l, kind: srcLocality}, func(j int) bool { return st.mask[j] && pr.locOf[j] == l })
	}
	// locality_wrr.cc effectiveLocalityWeight: weight × min(1,
	// overprovisioning_factor/100 × healthy/total); localities of
	// effective weight 0 are left out, and no scheduler is built when
	// none is left.
	st.locScale = st.locScale[:0]
	var entries []int
	for l, loc := range pr.localities {
		healthy := 0
		for j := range pr.hosts {
			if pr.locOf[j] == l && st.mask[j] {
				healthy++
			}
		}
		eff := float64(loc.weight) * min(1, overprovisioningPercent/100.0*float64(healthy)/float64(len(loc.hosts)))
		st.locScale = append(st.locScale, eff)
		if eff > 0 {
			entries = append(entries, l)
		}
	}
	if len(entries) > 0 {
		scale := st.locScale
		st.locEDF = lb.NewEDFWithPicks(entries, func(l int) float64 { return scale[l] }, uint32(s.seed))
	}
}

// choosePriority is LoadBalancerBase::choosePriority over the per-priority
// load of recalculatePerPriorityState/distributeLoad
// (load_balancer_impl.cc): each priority takes min(what is left of 100,
// health × 100 / normalised total health), the rest going to the first
// priority with any health; hash%100+1 falls into the cumulative loads.
// With no health anywhere, priority 0 takes everything (and is in panic).
func (s *lbState) choosePriority(hash uint64) int {
	var total uint32
	for i := range s.per {
		total += s.per[i].health
	}
	total = min(total, 100)
	if total == 0 {
		return 0
	}
	x := uint32(hash%100) + 1
	left, agg, first := uint32(100), uint32(0), -1
	loads := make([]uint32, len(s.per))
	for i := range s.per {
		if first < 0 && s.per[i].health > 0 {
			first = i
		}
		loads[i] = min(left, s.per[i].health*100/total)
		left -= loads[i]
	}
	if first >= 0 {
		loads[first] += left
	}
	for i, l := range loads {
		if agg += l; x <= agg {
			return i
		}
	}
	return len(loads) - 1
}

// replay is an lb.Rand whose first value is one already drawn: the value
// chooseHostOnce draws for hostSourceToUse serves both the priority choice
// and lb.Balancer.Pick's first draw, as in Envoy.
type replay struct {
	first uint64
	used  bool
	r     lb.Rand
}

func (r *replay) Uint64() uint64 {
	if !r.used {
		r.used = true
		return r.first
	}
	return r.r.Uint64()
}

// chooseOnce is EdfLoadBalancerBase::chooseHostOnce with
// ZoneAwareLoadBalancerBase::hostSourceToUse (load_balancer_impl.cc): one
// random value chooses the priority; a priority in panic balances over all
// its hosts; otherwise, with locality weighting, LocalityWrr's schedule
// chooses the locality and its healthy hosts are balanced; otherwise the
// priority's healthy hosts. Within the source, gateway/lb's Balancer is
// Envoy's pick: round_robin_lb.h, least_request_lb.cc (N_CHOICES or
// FULL_SCAN on live counts when the weights are equal, EDF over
// weight/(active+1)^bias when they differ), or, for RANDOM, random_lb.cc's
// hosts[random() % n]. In --lb isobar the source's acceptable hosts go to
// placement.Pick instead. Nil when the source is empty. Called under s.mu.
func (s *lbState) chooseOnce(p *picker, q pickQuery) *hostRT {
	if len(s.prios) == 0 {
		return nil // a newer table emptied the cluster under this request
	}
	placeMode := p.mode == LBIsobar
	s.refresh(q.now, placeMode)
	r := &replay{first: p.rand.Uint64(), r: p.rand}
	pi := s.choosePriority(r.first)
	pr, st := s.prios[pi], &s.per[pi]
	if placeMode {
		return s.place(p, q, pr, st, p.rand) // ties: fresh draws
	}
	k := srcKey{prio: pi, kind: srcHealthy}
	switch {
	case st.panic:
		k.kind = srcAll
	case s.localityWeighted && st.locEDF != nil:
		l, _ := st.locEDF.PickAndAdd(func(l int) float64 { return st.locScale[l] })
		k.kind, k.loc = srcLocality, l
	}
	b := s.bals[k]
	if b == nil {
		return nil
	}
	if s.random {
		// random_lb.cc peekOrChoose: hosts_to_use[random() % size], on the
		// value hostSourceToUse drew.
		var hosts []int
		for j, h := range pr.hosts {
			if s.weight(h) > 0 && (k.kind == srcAll || st.mask[j] && (k.kind == srcHealthy || pr.locOf[j] == k.loc)) {
				hosts = append(hosts, j)
			}
		}
		if len(hosts) == 0 {
			return nil
		}
		return pr.hosts[hosts[r.first%uint64(len(hosts))]]
	}
	j, ok := b.Pick(r, hostActive(pr.hosts))
	if !ok {
		return nil
	}
	return pr.hosts[j]
}

// place is --lb isobar within the chosen priority: least expected TTFT
// (package placement) over its acceptable hosts — healthy ones (all in
// panic), in localities of positive weight when the cluster is
// locality-weighted — with the request's prompt tokens and each host's
// pending prompt tokens, in-flight count, prefill rate, RTT and jitter.
func (s *lbState) place(p *picker, q pickQuery, pr *priorityRT, st *prioLB, r lb.Rand) *hostRT {
	hosts, inputs := s.placeHosts[:0], s.placeIn[:0]
	defer func() { s.placeHosts, s.placeIn = hosts[:0], inputs[:0] }() // reused: s.mu is held
	for j, h := range pr.hosts {
		if !st.panic && !st.mask[j] || s.localityWeighted && !st.panic && pr.localities[pr.locOf[j]].weight == 0 ||
			!p.accepts(h, q.exclude) {
			continue
		}
		hosts = append(hosts, h)
		inputs = append(inputs, placement.Host{
			Weight:                 h.ep.Weight,
			RTT:                    h.ep.RTT,
			Jitter:                 h.ep.Jitter,
			PendingPromptTokens:    h.st.pending.Load(),
			PrefillTokensPerSecond: h.ep.PrefillTokensPerSecond,
			InFlight:               h.st.inflight.Load(),
		})
	}
	i, ok := placement.Pick(p.place, inputs, q.tokens, r)
	if !ok {
		return nil
	}
	return hosts[i]
}
