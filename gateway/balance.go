package gateway

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/isobar-mesh/isobar/gateway/flowcontrol"
	"github.com/isobar-mesh/isobar/gateway/lb"
	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/gateway/prefix"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
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
	ep     xdsclient.Endpoint
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
	policy     *xdsclient.ClusterPolicy
	st         *clusterState
	priorities []*priorityRT
	all        []*hostRT
	lb         *lbState
}

// allowedRegions is the regions a pinned cluster's metadata allows
// (xdscontract.MetadataAllowedRegions, decoded by xdsclient: sorted, empty
// but not nil for a set that allows no region), nil for any other cluster.
func (c *clusterRT) allowedRegions() []string { return c.policy.AllowedRegions }

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
	pickOverflow             // the cluster's circuit breaker is open (503)
)

// globalRand is math/rand/v2's goroutine-safe generator as an lb.Rand.
type globalRand struct{}

func (globalRand) Uint64() uint64 { return rand.Uint64() }

// balancer is the load balancer: it chooses endpoints. Its own fields are read-only; the load
// balancers' state lives in each cluster's lbState, under its mutex.
type balancer struct {
	mode  LBMode
	limit int64 // Config.MaxInflightPerEndpoint: the upper bound of capOf
	// batchCap: cap each endpoint at flowcontrol.EndpointCap (flow control
	// on); false: at limit (Config.NoQueue, or Config.HealthOnly: only
	// Gateway.Pick picks, and it answers 429 rather than queue).
	batchCap bool
	rand     lb.Rand // safe for concurrent use
	place    placement.Config
	// prefix is --lb isobar's view of what each address's prefix cache
	// holds (nil: no affinity).
	prefix *prefix.Index[string]
}

// pickQuery is one pick's input.
type pickQuery struct {
	// exclude lists the hosts already tried when the route has the
	// previous_hosts retry predicate.
	exclude []*hostRT
	now     int64 // Unix nanoseconds, for ejection deadlines
	// tokens is the request's prompt size (--lb isobar).
	tokens int64
	// chain is the prompt's block hash chain (--lb isobar with prefix
	// affinity; nil: none).
	chain []uint64
	// redraws is the route's host_selection_retry_max_attempts: how often
	// a pick the predicate (or the in-flight cap) rejects is drawn again.
	redraws uint32
	// strict makes exclude a hard limit (the ext_proc subset hint): scan
	// never falls back to an excluded host.
	strict bool
	// class, when pinned to a residency set, is a hard limit in every mode
	// and every fallback: only hosts of its regions (local: this
	// gateway's region, for hosts without one) are ever picked.
	class *classOf
	local string
	// regions, when not nil, are the cluster's own allowed regions (a
	// pinned cluster's xdscontract.MetadataAllowedRegions): a hard limit
	// too; empty (not nil) allows no region.
	regions []string
}

// allowed reports whether q's residency (the request's set and the
// cluster's allowed regions) lets h serve it.
func (q *pickQuery) allowed(h *hostRT) bool {
	if !q.class.allows(h, q.local) {
		return false
	}
	if q.regions == nil {
		return true
	}
	r := h.ep.Region
	if r == "" {
		r = q.local
	}
	return slices.Contains(q.regions, r)
}

// pick chooses a host of c and takes one of its in-flight slots; the
// caller releases it. Hosts in q.exclude are avoided while another
// candidate is left.
func (p *balancer) pick(c *clusterRT, q pickQuery) (*hostRT, pickResult) {
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
		if h.st.acquire(p.capOf(h)) {
			if p.mode == LBIsobar {
				h.st.spendProbe()
			}
			return h, pickOK
		}
		saturated = true
	}
	if saturated {
		return nil, pickSaturated
	}
	return nil, pickNoHost
}

// capOf is h's in-flight cap, at which it counts as saturated. With flow
// control (requests queue at the gateway: not NoQueue, not HealthOnly),
// flowcontrol.EndpointCap of the batch the endpoint declares
// (max_num_seqs from its xDS metadata), its round trip (xDS metadata) and
// the slot hold the gateway measures on it (hostState.slotHold), bounded
// by Config.MaxInflightPerEndpoint, which is also the cap of an endpoint
// that declares no batch: what the engine cannot start at once waits at
// the gateway, ordered by criticality. Without flow control (NoQueue) a
// request beyond the batch would be refused rather than queued, so the
// cap stays MaxInflightPerEndpoint and the engine's own queue holds it.
// The bench's ingress caps an endpoint the same way (bench/paper,
// fleet.capOf: the batch cap with flow control, the configured cap for
// isobar-nocrit).
func (p *balancer) capOf(h *hostRT) int64 {
	if !p.batchCap {
		return p.limit
	}
	return int64(flowcontrol.EndpointCap(h.ep.MaxNumSeqs, h.ep.RTT, time.Duration(h.st.slotHold.Load()), int(p.limit)))
}

// accepts reports whether h may take the request: not excluded (the
// previous_hosts predicate), weight > 0 and below the in-flight cap.
func (p *balancer) accepts(h *hostRT, q *pickQuery) bool {
	return h.ep.Weight > 0 && q.allowed(h) && !slices.Contains(q.exclude, h) && h.st.inflight.Load() < p.capOf(h)
}

// choose is Envoy's LoadBalancerBase::chooseHost (load_balancer_impl.cc):
// chooseHostOnce, drawn again up to q.redraws times while the retry host
// predicate rejects the host (here also while the host is at the
// gateway's in-flight cap, capOf, which Envoy does not have). When every draw is
// rejected, Envoy would send the request to the last host anyway; the
// gateway instead scans for any acceptable host (scan), so that a retry
// never returns to a tried endpoint while another is left and a full
// endpoint is never overfilled.
func (p *balancer) choose(c *clusterRT, q pickQuery) (*hostRT, bool) {
	s := c.lb
	s.mu.Lock()
	var h *hostRT
	for range 1 + q.redraws {
		if h = s.chooseOnce(p, q); h == nil || p.accepts(h, &q) {
			break
		}
	}
	s.mu.Unlock()
	if h != nil && p.accepts(h, &q) {
		return h, false
	}
	return p.scan(c, q)
}

// scan is the fallback when the balancer's draws found no acceptable host:
// the acceptable host with the fewest requests in flight (the first in EDS
// order on ties), healthy ones first, then ejected ones, then, when only
// tried hosts are left, tried ones (not when q.strict). saturated reports
// that some host was left out only for its cap.
func (p *balancer) scan(c *clusterRT, q pickQuery) (best *hostRT, saturated bool) {
	steps := []struct {
		exclude      []*hostRT
		allowEjected bool
	}{{q.exclude, false}, {q.exclude, true}, {nil, true}}
	if q.strict {
		steps = steps[:2]
	}
	for _, step := range steps {
		var bestN int64
		for _, h := range c.all {
			if h.ep.Weight == 0 || !q.allowed(h) || slices.Contains(step.exclude, h) || (!step.allowEjected && h.st.ejected(q.now)) {
				continue
			}
			n := h.st.inflight.Load()
			if n >= p.capOf(h) {
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
// for the cluster (EdfLoadBalancerBase with its per-priority loads, panic
// flags and LocalityWrr schedules), kept across table rebuilds by cluster
// name. The gateway runs one such worker per cluster for all its request
// goroutines, serialised by mu: it behaves as an Envoy started with
// --concurrency 1. (A multi-worker Envoy is modelled by the benchmark's
// isobar-envoy policy with gateway/lb's Pool.) The active-request counts
// the balancers read are the gateway's real in-flight counts per address
// (hostState.inflight), which, as Envoy's rq_active, are incremented only
// after the pick.
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
	// schedule and round-robin index.
	seed uint64

	mu    sync.Mutex
	sig   string        // the host set installed (addresses, weights, health, localities)
	prios []*priorityRT // the host set in use, replaced on every install
	// per holds the refresh state of each priority. A nil mask means a
	// refresh is due.
	per []prioLB
	// healthyLoad and degradedLoad are Envoy's per_priority_load_ in
	// percent (they sum to 100), recomputed when any priority refreshes.
	healthyLoad, degradedLoad []uint32
	bals                      map[srcKey]*lb.Balancer
	mask                      []hostHealth // scratch for refresh
	// scratch for place
	placeHosts []*hostRT
	placeIn    []placement.Host
}

// hostHealth is a host's state for the load balancer: Envoy's healthy,
// degraded (EDS DEGRADED) or unhealthy (here: ejected by outlier
// detection; EDS UNHEALTHY, DRAINING and TIMEOUT endpoints are not in the
// table at all).
type hostHealth uint8

const (
	hostUnhealthy hostHealth = iota
	hostHealthy
	hostDegraded
)

// prioLB is a priority's state as of its last refresh.
type prioLB struct {
	mask               []hostHealth // each host's health at the last refresh
	healthy, degraded  int
	health, degradedAv uint32 // Envoy's per_priority_health_ and per_priority_degraded_, 0..100
	panic              bool   // per_priority_panic_
	// LocalityWrr's healthy and degraded locality schedules and their
	// effective locality weights; a nil schedule: no locality with weight.
	locEDF, locEDFDegraded     *lb.EDF
	locScale, locScaleDegraded []float64
}

// srcKind is Envoy's HostsSource::SourceType.
type srcKind uint8

const (
	srcAll              srcKind = iota // AllHosts (panic)
	srcHealthy                         // HealthyHosts
	srcDegraded                        // DegradedHosts
	srcLocality                        // LocalityHealthyHosts
	srcLocalityDegraded                // LocalityDegradedHosts
)

// srcKey is Envoy's HostsSource: a priority, a source type and, for
// localities, the locality's index. Each has its own schedule and
// round-robin index (rr_indexes_), kept across refreshes.
type srcKey struct {
	prio, loc int
	kind      srcKind
}

// lbKey is the configuration an lbState is built for.
func lbKey(mode LBMode, p *xdsclient.ClusterPolicy) string {
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
func newLBState(mode LBMode, p *xdsclient.ClusterPolicy, seed uint64) *lbState {
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
		case xdsclient.LBLeastRequest:
			s.policy = lb.Policy{Algorithm: lb.LeastRequest, ChoiceCount: p.ChoiceCount, FullScan: p.FullScan,
				ActiveRequestBias: p.ActiveRequestBias}
			if s.policy.Validate() != nil { // decodeCluster refuses these; belt and braces
				s.policy = lb.DefaultPolicy(lb.LeastRequest)
			}
		case xdsclient.LBRandom:
			s.policy, s.random = lb.DefaultPolicy(lb.RoundRobin), true
		default:
			s.policy = lb.DefaultPolicy(lb.RoundRobin)
		}
	}
	return s
}

// hostSetSig identifies a host set: what, if it changes, makes Envoy
// refresh its load balancer (membership, weights, EDS health, localities,
// priorities).
func hostSetSig(prios []*priorityRT) string {
	var b strings.Builder
	for i, pr := range prios {
		for j, h := range pr.hosts {
			l := pr.localities[pr.locOf[j]]
			e := &h.ep
			b.WriteString(strconv.Itoa(i))
			for _, s := range []string{e.Region, e.Zone, e.SubZone, strconv.FormatUint(uint64(l.weight), 10), e.Address,
				strconv.FormatUint(uint64(e.Weight), 10), strconv.FormatBool(e.Degraded)} {
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

// refresh re-derives each host's health (EDS DEGRADED, ejection deadlines)
// and, for each priority whose health changed (or whose host set did),
// does what Envoy's priority update callbacks do: LocalityWrr is rebuilt
// with a fresh random seed (rebuildLocalityWrrForPriority, when locality
// weighting is on), EdfLoadBalancerBase::refresh rebuilds every host
// source of the priority from seed_, and LoadBalancerBase recomputes the
// priority loads and panic flags. Envoy runs these when outlier detection
// ejects or re-admits a host; the gateway's ejections end at a deadline,
// so the change is noticed at the next pick.
func (s *lbState) refresh(r lb.Rand, now int64, placeMode bool) {
	changed := false
	for i, pr := range s.prios {
		s.mask = s.mask[:0]
		healthy, degraded := 0, 0
		for _, h := range pr.hosts {
			hh := hostHealthy
			switch {
			case h.st.ejected(now):
				hh = hostUnhealthy
			case h.ep.Degraded:
				hh = hostDegraded
				degraded++
			default:
				healthy++
			}
			s.mask = append(s.mask, hh)
		}
		st := &s.per[i]
		if st.mask != nil && slices.Equal(st.mask, s.mask) {
			continue
		}
		changed = true
		st.mask = append(st.mask[:0], s.mask...)
		st.healthy, st.degraded = healthy, degraded
		// recalculatePerPriorityState: health = min(100,
		// overprovisioning_factor × healthy / total), the same for
		// degraded, integer arithmetic.
		n := len(pr.hosts)
		st.health = uint32(min(100, overprovisioningPercent*healthy/n))
		st.degradedAv = uint32(min(100, overprovisioningPercent*degraded/n))
		if !placeMode {
			s.refreshSources(r, i, pr, st)
		}
	}
	if changed {
		s.recalculateLoads()
	}
}

// recalculateLoads is recalculatePerPriorityState's load distribution and
// recalculatePerPriorityPanic (load_balancer_impl.cc): healthy load first,
// then degraded, each priority taking min(what is left, availability × 100
// / normalised total availability), the rounding remainder to the first
// priority with healthy (else degraded) availability. A priority is in
// panic when the normalised total availability is below 100 and its
// healthy plus degraded share is below the panic threshold; when every
// priority is in panic (recalculateLoadInTotalPanic) the load follows the
// host counts.
func (s *lbState) recalculateLoads() {
	n := len(s.per)
	s.healthyLoad = slices.Grow(s.healthyLoad[:0], n)[:n]
	s.degradedLoad = slices.Grow(s.degradedLoad[:0], n)[:n]
	clear(s.healthyLoad)
	clear(s.degradedLoad)
	var total uint32
	for i := range s.per {
		total += s.per[i].health + s.per[i].degradedAv
	}
	normalized := min(total, 100)
	distribute := func(load []uint32, av func(i int) uint32, left uint32) (first int, rest uint32) {
		first = -1
		for i := range s.per {
			if first < 0 && av(i) > 0 {
				first = i
			}
			load[i] = min(left, av(i)*100/normalized)
			left -= load[i]
		}
		return first, left
	}
	if normalized > 0 {
		firstH, left := distribute(s.healthyLoad, func(i int) uint32 { return s.per[i].health }, 100)
		firstD, left := distribute(s.degradedLoad, func(i int) uint32 { return s.per[i].degradedAv }, left)
		if left != 0 {
			if firstH >= 0 {
				s.healthyLoad[firstH] += left
			} else {
				s.degradedLoad[firstD] += left
			}
		}
	}
	totalPanic := true
	for i, pr := range s.prios {
		st := &s.per[i]
		// isHostSetInPanic: (healthy% + degraded%) < panic threshold.
		st.panic = normalized < 100 && 100*float64(st.healthy+st.degraded)/float64(len(pr.hosts)) < panicPercent
		totalPanic = totalPanic && st.panic
	}
	if !totalPanic {
		return
	}
	hosts := 0
	for _, pr := range s.prios {
		hosts += len(pr.hosts)
	}
	left := uint32(100)
	for i, pr := range s.prios {
		s.healthyLoad[i] = uint32(100 * len(pr.hosts) / hosts)
		s.degradedLoad[i] = 0
		left -= s.healthyLoad[i]
	}
	s.healthyLoad[0] += left // every priority has hosts
}

// refreshSources is LocalityWrr's rebuild and EdfLoadBalancerBase::refresh
// (priority) for priority i.
func (s *lbState) refreshSources(r lb.Rand, i int, pr *priorityRT, st *prioLB) {
	if s.localityWeighted {
		// rebuildLocalityWrrForPriority: LocalityWrr(host_set,
		// random_.random()), both schedules from that seed
		// (locality_wrr.cc rebuildLocalityScheduler).
		seed := uint32(r.Uint64())
		st.locEDF, st.locScale = s.localitySchedule(pr, st, hostHealthy, seed, st.locScale)
		st.locEDFDegraded, st.locScaleDegraded = s.localitySchedule(pr, st, hostDegraded, seed, st.locScaleDegraded)
	} else {
		st.locEDF, st.locEDFDegraded = nil, nil
	}
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
	// add_hosts_source for AllHosts, HealthyHosts, DegradedHosts, then
	// each locality's healthy and degraded hosts.
	update(srcKey{prio: i, kind: srcAll}, func(int) bool { return true })
	update(srcKey{prio: i, kind: srcHealthy}, func(j int) bool { return st.mask[j] == hostHealthy })
	update(srcKey{prio: i, kind: srcDegraded}, func(j int) bool { return st.mask[j] == hostDegraded })
	if !s.localityWeighted {
		return
	}
	for l := range pr.localities {
		update(srcKey{prio: i, loc: l, kind: srcLocality}, func(j int) bool { return st.mask[j] == hostHealthy && pr.locOf[j] == l })
		update(srcKey{prio: i, loc: l, kind: srcLocalityDegraded}, func(j int) bool { return st.mask[j] == hostDegraded && pr.locOf[j] == l })
	}
}

// localitySchedule is locality_wrr.cc rebuildLocalityScheduler for the
// hosts of health want: each locality's effective weight is weight ×
// min(1, overprovisioning_factor/100 × eligible/total)
// (effectiveLocalityWeight); localities of effective weight 0 are left out
// and no schedule is built when none is left; otherwise createWithPicks
// from seed.
func (s *lbState) localitySchedule(pr *priorityRT, st *prioLB, want hostHealth, seed uint32, scale []float64) (*lb.EDF, []float64) {
	scale = scale[:0]
	var entries []int
	for l, loc := range pr.localities {
		eligible := 0
		for j := range pr.hosts {
			if pr.locOf[j] == l && st.mask[j] == want {
				eligible++
			}
		}
		eff := float64(loc.weight) * min(1, overprovisioningPercent/100.0*float64(eligible)/float64(len(loc.hosts)))
		scale = append(scale, eff)
		if eff > 0 {
			entries = append(entries, l)
		}
	}
	if len(entries) == 0 {
		return nil, scale
	}
	return lb.NewEDFWithPicks(entries, func(l int) float64 { return scale[l] }, seed), scale
}

// choosePriority is LoadBalancerBase::choosePriority: hash % 100 + 1 falls
// into the cumulative healthy loads, then the degraded ones. It returns
// the priority and whether its degraded hosts were chosen.
func (s *lbState) choosePriority(hash uint64) (int, bool) {
	x := uint32(hash%100) + 1
	var agg uint32
	for i, l := range s.healthyLoad {
		if agg += l; x <= agg {
			return i, false
		}
	}
	for i, l := range s.degradedLoad {
		if agg += l; x <= agg {
			return i, true
		}
	}
	return 0, false // the loads sum to 100: not reached
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
// random value chooses the priority and whether its healthy or degraded
// hosts serve; a priority in panic balances over all its hosts; otherwise,
// with locality weighting, LocalityWrr's healthy (or degraded) schedule
// chooses the locality and its healthy (degraded) hosts are balanced;
// otherwise the priority's healthy (degraded) hosts. Within the source,
// gateway/lb's Balancer is Envoy's pick: round_robin_lb.h,
// least_request_lb.cc (N_CHOICES or FULL_SCAN on live counts when the
// weights are equal, EDF over weight/(active+1)^bias when they differ),
// or, for RANDOM, random_lb.cc's hosts[random() % n] on the same value. In
// --lb isobar the source's acceptable hosts go to placement.Pick instead.
// Nil when the source is empty. Called under s.mu.
func (s *lbState) chooseOnce(p *balancer, q pickQuery) *hostRT {
	if len(s.prios) == 0 {
		return nil // a newer table emptied the cluster under this request
	}
	placeMode := p.mode == LBIsobar
	s.refresh(p.rand, q.now, placeMode)
	r := &replay{first: p.rand.Uint64(), r: p.rand}
	pi, degraded := s.choosePriority(r.first)
	pr, st := s.prios[pi], &s.per[pi]
	k := srcKey{prio: pi, kind: srcHealthy}
	want := hostHealthy
	if degraded {
		k.kind, want = srcDegraded, hostDegraded
	}
	switch {
	case st.panic:
		k.kind = srcAll
	case s.localityWeighted:
		edf, scale, kind := st.locEDF, st.locScale, srcLocality
		if degraded {
			edf, scale, kind = st.locEDFDegraded, st.locScaleDegraded, srcLocalityDegraded
		}
		if placeMode {
			break // placement weighs every eligible locality itself
		}
		if edf != nil {
			l, _ := edf.PickAndAdd(func(l int) float64 { return scale[l] })
			k.kind, k.loc = kind, l
		}
	}
	// in reports whether host j belongs to the source k.
	in := func(j int) bool {
		switch k.kind {
		case srcAll:
			return true
		case srcLocality, srcLocalityDegraded:
			return st.mask[j] == want && pr.locOf[j] == k.loc
		}
		return st.mask[j] == want
	}
	if placeMode {
		return s.place(p, q, pr, in, k.kind != srcAll, p.rand) // ties: fresh draws
	}
	if s.random {
		// random_lb.cc peekOrChoose: hosts_to_use[random() % size], on the
		// value hostSourceToUse drew.
		var hosts []int
		for j, h := range pr.hosts {
			if s.weight(h) > 0 && in(j) {
				hosts = append(hosts, j)
			}
		}
		if len(hosts) == 0 {
			return nil
		}
		return pr.hosts[hosts[r.first%uint64(len(hosts))]]
	}
	b := s.bals[k]
	if b == nil {
		return nil
	}
	j, ok := b.Pick(r, hostActive(pr.hosts))
	if !ok {
		return nil
	}
	return pr.hosts[j]
}

// cachedTokens is how many tokens of a prompt with the block hash chain
// the address is expected to hold in its prefix cache (package prefix's
// index; 0 without one).
func (p *balancer) cachedTokens(addr string, chain []uint64) int64 {
	if p.prefix == nil || len(chain) == 0 {
		return 0
	}
	return int64(p.prefix.Match(addr, chain)) * tokensPerBlock
}

// tokensPerBlock is the prompt tokens of one prefix block:
// prefix.BlockBytes at xdscontract.BytesPerToken.
const tokensPerBlock = prefix.BlockBytes / xdscontract.BytesPerToken

// rate is the prefill rate the pick uses for a host whose metadata gives
// r: r, else the configured default.
func rate(c placement.Config, r float64) float64 {
	if r > 0 {
		return r
	}
	return c.DefaultPrefillTokensPerSecond
}

// placeable: --lb isobar's own limits on a host, beyond what Envoy
// checks. A host whose probe budget is spent takes nothing more until the
// controller publishes it again (count-bounded probation), and a host is
// sent no prompt above its declared max_model_len (the endpoint metadata)
// nor above what its rejection memory allows (contextMemory). The
// controller's context-class routes keep long prompts off short engines
// too, but a data plane may hold the new endpoints before the new routes
// (EDS and RDS arrive apart), and then the main cluster still takes them.
// When the limits leave no host, the pick falls back to scan, which
// ignores them: a request is never refused for a guess.
func placeable(h *hostRT, q pickQuery) bool {
	if ml := h.ep.MaxModelLen; ml > 0 && q.tokens > int64(ml) {
		return false
	}
	return !h.st.probeSpent() && (h.st.ctx == nil || h.st.ctx.fits(q.tokens, time.Unix(0, q.now)))
}

// place is --lb isobar within the chosen priority: least expected TTFT
// (package placement) over the acceptable hosts of the source Envoy would
// use — the priority's healthy hosts (its degraded ones when the priority
// load chose those; all in panic), in every locality of positive weight
// when the cluster is locality-weighted, so that distance is an added
// latency rather than a share — with the request's prompt tokens and each
// host's pending prompt tokens, in-flight count, prefill rate, RTT and
// jitter. localities: leave out localities of weight 0 (not in panic).
func (s *lbState) place(p *balancer, q pickQuery, pr *priorityRT, in func(j int) bool, localities bool, r lb.Rand) *hostRT {
	hosts, inputs := s.placeHosts[:0], s.placeIn[:0]
	defer func() { s.placeHosts, s.placeIn = hosts[:0], inputs[:0] }() // reused: s.mu is held
	for j, h := range pr.hosts {
		if !in(j) || localities && s.localityWeighted && pr.localities[pr.locOf[j]].weight == 0 || !p.accepts(h, &q) || !placeable(h, q) {
			continue
		}
		hosts = append(hosts, h)
		inputs = append(inputs, placement.Host{
			Weight:                 h.ep.Weight,
			RTT:                    h.ep.RTT,
			Jitter:                 h.ep.Jitter,
			PendingPromptTokens:    h.st.pendingWork(time.Unix(0, q.now), rate(p.place, h.ep.PrefillTokensPerSecond)),
			PrefillTokensPerSecond: h.ep.PrefillTokensPerSecond,
			InFlight:               h.st.inflight.Load(),
			Slots:                  h.ep.MaxNumSeqs,
			ServiceTime:            time.Duration(h.st.slotHold.Load()),
			CachedPromptTokens:     p.cachedTokens(h.ep.Address, q.chain),
		})
	}
	i, ok := placement.Pick(p.place, inputs, q.tokens, r)
	if !ok {
		return nil
	}
	return hosts[i]
}
