package paper

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/gateway/lb"
	"github.com/isobar-mesh/isobar/gateway/placement"

	"github.com/isobar-mesh/isobar/internal/quantile"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/score"
)

// Policy is how the ingress spreads requests over the cells.
type Policy string

// The policies of the evaluation.
const (
	// RR is Envoy's ROUND_ROBIN (round_robin_lb.h, via gateway/lb) on W
	// worker threads, with active health checks and the same retries,
	// retry budget and outlier detection as every other policy.
	RR Policy = "rr"
	// RRPlain is RR as the published evaluation ran it: active health
	// checks only, no retries, no outlier detection. Failover stage only.
	RRPlain Policy = "rr-plain"
	// LR is Envoy's LEAST_REQUEST (least_request_lb.cc, via gateway/lb):
	// power of two choices over the requests in flight, shared across W
	// workers; otherwise configured as RR.
	LR Policy = "lr"
	// Isobar is isobar's regional control loop: every heartbeat the real
	// scorer (regional/score) turns each cell's signals into a pressure
	// and the real projector (regional/projection) into weights, which
	// reach the ingress as isobar's pushed cluster. The ingress picks as
	// isobar gateway --lb isobar does (gateway/placement): among the
	// endpoints with a weight, the least expected TTFT from the prompt
	// tokens it has itself sent to each cell without a first token yet,
	// the cell's prefill rate, the measured RTT and jitter and the
	// requests in flight.
	Isobar Policy = "isobar"
	// IsobarEnvoy is what stock Envoy does with isobar's resources: the
	// weights isobar's control loop pushes, picked by Envoy's
	// LEAST_REQUEST on W workers (gateway/lb: EDF over
	// weight/(active+1) when the weights differ, two choices when equal),
	// with the cluster's retries and outlier detection and no active
	// health checks.
	IsobarEnvoy Policy = "isobar-envoy"
	// IsobarGPUOnly is Isobar with the RTT and jitter signals weighted 0.
	IsobarGPUOnly Policy = "isobar-gpu-only"
	// IsobarCapability is Isobar with capability discovery: requests go
	// only to cells whose max_model_len holds them (the context-class
	// clusters).
	IsobarCapability Policy = "isobar-capability"
	// IsobarNoCrit is Isobar as its gateway behaves without issue 25's
	// criticality: every request standard, no flow-control queue, 429
	// once every eligible endpoint is at the in-flight cap
	// (DataPlane.MaxInflightPerEndpoint). Overload stage.
	IsobarNoCrit Policy = "isobar-nocrit"
	// IsobarStaticBudget is Isobar with the static retry budget
	// (DataPlane.RetryBudgetPercent); Isobar in the retry-storm stage runs
	// the dynamic one the regional controller publishes
	// (regional/xds RetryBudgetAt).
	IsobarStaticBudget Policy = "isobar-static-budget"
	// Oracle knows every engine's state (prompt tokens waiting to be
	// prefilled, running batch, liveness, max_model_len) and the network
	// at the instant a request arrives, and sends it where its predicted
	// TTFT is lowest. No real router has that knowledge: it marks the
	// limit.
	Oracle Policy = "oracle"
)

// Policies lists every policy, in report order.
func Policies() []Policy {
	return []Policy{RR, RRPlain, LR, IsobarNoCrit, IsobarStaticBudget, Isobar, IsobarEnvoy, IsobarGPUOnly, IsobarCapability,
		IsobarAffinity, PrefixHash, PrecisePrefix, Oracle}
}

// ParsePolicy returns the named policy.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies() {
		if string(p) == s {
			return p, nil
		}
	}
	names := make([]string, 0, 8)
	for _, p := range Policies() {
		names = append(names, string(p))
	}
	return "", fmt.Errorf("paper: unknown policy %q: want one of %s", s, strings.Join(names, ", "))
}

// isobar: the policy runs isobar's control loop (its pushed weights).
// precise-prefix is isobar-affinity with an exact cache.
func (p Policy) isobar() bool { return strings.HasPrefix(string(p), "isobar") || p == PrecisePrefix }

// healthChecked: the stock-Envoy baselines and the naive prefix router run
// active health checks.
func (p Policy) healthChecked() bool { return p == RR || p == RRPlain || p == LR || p == PrefixHash }

// resilient: retries, a retry budget and outlier detection, which an
// operator configures on stock Envoy as on isobar's cluster.
func (p Policy) resilient() bool { return p != RRPlain }

// envoy returns the gateway/lb policy of the stock-Envoy baselines.
func (p Policy) envoy(d DataPlane) (lb.Policy, bool) {
	switch p {
	case RR, RRPlain:
		return lb.DefaultPolicy(lb.RoundRobin), true
	case LR, IsobarEnvoy:
		pol := lb.DefaultPolicy(lb.LeastRequest)
		pol.ChoiceCount = uint32(d.ChoiceCount)
		return pol, true
	}
	return lb.Policy{}, false
}

func (p Policy) scoreConfig() score.Config {
	c := score.DefaultConfig()
	if p == IsobarGPUOnly {
		c.Weights[score.RTT], c.Weights[score.Jitter] = 0, 0
	}
	return c
}

// pick chooses the cell for request i's next attempt, or -1.
func (f *fleet) pick(i int) int {
	r := &f.reqs[i]
	f.saturated = false
	switch {
	case f.pool != nil:
		return f.pickEnvoy(r, i)
	case f.spec.policy == Oracle:
		return f.pickOracle(r)
	case f.spec.policy == PrefixHash:
		return f.pickHash(r, i)
	default:
		return f.pickIsobar(r, f.lbRand(i))
	}
}

// pendingWork is the prompt tokens cell c still has to prefill as the
// ingress can tell (placement.HeadProgress, as the gateway counts them):
// its pending prompt tokens (sent, no first byte yet) less the progress of
// the oldest, which has been prefilling since the later of its send and the
// last first byte from the cell, at the cell's prefill rate.
func (f *fleet) pendingWork(c int) int {
	e := f.cells[c]
	if len(e.pendingQ) == 0 {
		return e.pendingTokens
	}
	head := &f.reqs[e.pendingQ[0]]
	done := placement.HeadProgress(int64(head.work), f.prefillRate[c], f.now-max(head.sentAt, e.lastFirst))
	return e.pendingTokens - int(done)
}

// hostSelectionAttempts is the retry policy's
// host_selection_retry_max_attempts (regional/xds sets 3): a retry that
// lands on a host already tried picks again, up to this many times.
const hostSelectionAttempts = 3

// pickEnvoy: the request's worker picks among the hosts the health checks
// pass and outlier detection has not ejected (Envoy's panic mode: every
// host when fewer than half are healthy), through the Envoy algorithm. A
// host's weight is 1 for the baselines and isobar's pushed weight for
// isobar-envoy (weight 0: not in the EDS set at all).
//
// With declared capability (isobar-envoy in hetero) Envoy follows isobar's
// routes: the request's context class (x-isobar-prompt-tokens: prompt plus
// max_tokens) selects the class cluster of the cells whose max_model_len
// holds it (every declared max_model_len is a class), where a cell below
// its model's longest context has its ClassWeight; each such cluster has
// its own load balancer (pools).
func (f *fleet) pickEnvoy(r *request, i int) int {
	useDegraded := f.degradedTierServes()
	need := r.prompt + r.out
	classRoutes := f.spec.policy == IsobarEnvoy && f.declared()
	weight := func(e *engine) uint32 {
		switch {
		case f.spec.policy != IsobarEnvoy:
			return 1
		case e.degraded && !useDegraded:
			return 0
		case classRoutes && e.maxModelLen > 0 && need > e.maxModelLen:
			return 0
		case classRoutes && e.classWeight > 0:
			return e.classWeight
		}
		return e.weight
	}
	pool := f.pool
	lastW := &f.lastW
	if classRoutes {
		var mask uint64
		for c, e := range f.cells {
			if e.maxModelLen == 0 || need <= e.maxModelLen {
				mask |= 1 << c
			}
		}
		cp := f.classPools[mask]
		if cp == nil {
			pol, _ := f.spec.policy.envoy(f.cfg.DataPlane)
			p, err := lb.NewPool(pol, f.cfg.DataPlane.Workers, keyed(f.spec.seed, saltLB, 1<<62+mask))
			if err != nil {
				return -1 // the policy built f.pool already: unreachable
			}
			cp = &classPool{pool: p}
			f.classPools[mask] = cp
		}
		pool, lastW = cp.pool, &cp.lastW
	}
	members, healthy := 0, 0
	for c, e := range f.cells {
		f.hostW[c] = 0
		if w := weight(e); w > 0 {
			members++
			if !e.hcDown && e.ejectUntil <= f.now {
				f.hostW[c] = w
				healthy++
			}
		}
	}
	if 2*healthy < members {
		for c, e := range f.cells {
			f.hostW[c] = weight(e)
		}
	}
	if !slices.Equal(f.hostW, *lastW) {
		pool.Update(f.hostW, f.active)
		*lastW = append((*lastW)[:0], f.hostW...)
	}
	worker := int(r.worker % uint32(pool.Workers()))
	rnd := f.lbRand(i)
	c, ok := pool.Pick(worker, rnd, f.active)
	for k := 1; ok && k < hostSelectionAttempts && slices.Contains(r.tried, c); k++ {
		c, ok = pool.Pick(worker, rnd, f.active)
	}
	if !ok {
		return -1
	}
	return c
}

// overprovisioning is Envoy's default overprovisioning factor (1.4).
const overprovisioning = 1.4

// classPool is the load balancer of one class cluster of isobar-envoy
// (see pickEnvoy), by the set of cells it holds.
type classPool struct {
	pool  *lb.Pool
	lastW []uint32
}

// declared reports whether the cells' max_model_len reaches the control
// plane and the routes: isobar-capability, and every isobar policy when
// the run declares capability.
func (f *fleet) declared() bool {
	return f.spec.policy == IsobarCapability || f.spec.declareCapability && f.spec.policy.isobar()
}

// degradedTierServes reports whether Envoy would send traffic to the EDS
// DEGRADED hosts of isobar's cluster: only when the healthy hosts, scaled
// by the overprovisioning factor, cover less than the whole load
// (load_balancer_impl.cc, recalculatePerPriorityState). The data plane
// otherwise keeps them as a standby tier.
func (f *fleet) degradedTierServes() bool {
	members, healthy := 0, 0
	for _, e := range f.cells {
		if e.weight == 0 {
			continue
		}
		members++
		if !e.degraded {
			healthy++
		}
	}
	return members > 0 && overprovisioning*float64(healthy) < float64(members)
}

// pickIsobar is isobar's gateway pick (gateway/placement, the code
// isobar gateway --lb isobar runs): among the endpoints with a pushed
// weight, not ejected, not already tried by this request (the retry host
// predicate) and, with capability discovery, fitting the prompt, the one
// with the least expected TTFT — the RTT and jitter the regional prober
// measured (none for isobar-gpu-only), plus the prompt tokens the ingress
// has sent there without a first token yet and this request's, over the
// cell's prefill rate, plus a decode-contention term per request in
// flight, plus the wait for a batch slot once the requests in flight fill
// the cell's MaxNumSeqs (its capacity class), at the slot-holding time the
// ingress measures per cell (engine.slotHold). Constraints are relaxed in
// that order when nothing is left.
func (f *fleet) pickIsobar(r *request, rnd *rand.Rand) int {
	declared := f.declared()
	capable := func(c int) bool {
		e := f.cells[c]
		return e.fits(r.prompt+r.out, declared) && e.probeLeft != 0
	}
	hosts := f.placeBuf[:0]
	useDegraded := f.degradedTierServes()
	for _, relax := range []int{0, 1, 2} {
		hosts = hosts[:0]
		found := false
		for i, e := range f.cells {
			h := placement.Host{}
			eligible := e.weight > 0 && capable(i) && (useDegraded || !e.degraded) &&
				(relax >= 2 || e.ejectUntil <= f.now) &&
				(relax >= 1 || !slices.Contains(r.tried, i))
			if eligible {
				found = true
				h = placement.Host{Weight: e.weight, PendingPromptTokens: int64(f.pendingWork(i)),
					PrefillTokensPerSecond: f.prefillRate[i], InFlight: int64(f.active[i]),
					Slots: int64(e.prof.MaxNumSeqs), ServiceTime: e.slotHold, CachedPromptTokens: f.cachedTokens(i, r)}
				if f.spec.policy != IsobarGPUOnly {
					if f.siteRTT != nil { // none before the first tick
						sr := f.siteRTT[e.site]
						h.RTT, h.Jitter = sr.rtt, sr.jitter
					}
				}
			}
			hosts = append(hosts, h)
		}
		if found {
			break
		}
	}
	f.placeBuf = hosts
	c, ok := placement.Pick(f.placement, hosts, int64(r.prompt), rnd)
	if !ok {
		return -1
	}
	if f.spec.inflightCap > 0 && f.active[c] >= f.capOf(c) {
		return f.belowCap(hosts)
	}
	return c
}

// belowCap is the gateway's fallback when its pick is at the in-flight
// cap (gateway/balance.go, scan): the eligible endpoint with the fewest
// requests in flight below its cap, the first on ties; none sets
// f.saturated (the gateway's pickSaturated).
func (f *fleet) belowCap(hosts []placement.Host) int {
	best := -1
	for c, h := range hosts {
		if h.Weight == 0 || f.active[c] >= f.capOf(c) {
			continue
		}
		if best < 0 || f.active[c] < f.active[best] {
			best = c
		}
	}
	f.saturated = best < 0
	return best
}

// pickOracle sends the request where its predicted TTFT is lowest, from
// the true state of every engine and of the network (see predictTTFT).
// Ties go to the lowest index.
func (f *fleet) pickOracle(r *request) int {
	best, bestT := -1, time.Duration(math.MaxInt64)
	for c, e := range f.cells {
		if !e.alive || slices.Contains(r.tried, c) || (e.maxModelLen > 0 && r.prompt+r.out > e.maxModelLen) {
			continue
		}
		if t := f.predictTTFT(c, r); t < bestT {
			best, bestT = c, t
		}
	}
	return best
}

// predictTTFT is the oracle's model of request r's TTFT on cell c: the
// two network trips at the site's current mean delay, the engine
// frontend, what is left of the step in flight, the wait for a batch slot
// when the running batch is full (the sequence that frees it is known:
// the one with the fewest output tokens left), and the prefill of every
// prompt token ahead of r (waiting, partly prefilled, in the frontend, or
// still on the network to the cell) plus r's own, chunked by the step budget, each step also
// carrying the running batch's decodes.
func (f *fleet) predictTTFT(c int, r *request) time.Duration {
	e := f.cells[c]
	p := e.prof
	net := 2 * f.meanOneWay(e.site)
	own := r.prompt
	if f.spec.prefixCache {
		own = int(placement.UncachedTokens(int64(r.prompt), int64(e.b.CachedPrefixTokens(r.prompt, r.blocks))))
	}
	ahead := e.b.QueuedPrefillTokens() + e.frontendTokens + e.transitTokens + own
	st := e.b.Stats()
	ctx := 0
	if st.Running > 0 {
		ctx = e.runningTokens
	}
	step := p.EstimateDecodeStep(st.Running, ctx)
	steps := 1
	if room := p.MaxBatchedTokens - st.Running; room > 0 {
		steps = (ahead + room - 1) / room
	}
	t := net + r.frontend + p.EstimatePrefill(ahead) + time.Duration(steps)*step
	if e.stepping {
		t += max(e.stepEnd-f.now, 0)
	}
	// Sequences ahead of r that need a batch slot, against the free ones.
	if need := st.Waiting + len(e.frontend) + e.transitN + 1 - (p.MaxNumSeqs - st.Running); need > 0 {
		left := f.oracleBuf[:0]
		for _, i := range e.seqs {
			if q := &f.reqs[i]; q.gen > 0 {
				left = append(left, q.out-q.gen)
			}
		}
		slices.Sort(left)
		f.oracleBuf = left
		switch {
		case len(left) == 0:
			t += time.Duration(need) * step
		case need <= len(left):
			t += time.Duration(left[need-1]) * step
		default:
			t += time.Duration(left[len(left)-1]+(need-len(left))*r.out) * step
		}
	}
	return t
}

// tick is one control-plane pass: every cellagent's heartbeat (its
// scrape of the engine and the DCGM exporter over the signal window), the
// regional controller's RTT probe, scoring and — for the isobar policies —
// projection and the push to the ingress. The baselines get the same
// scoring as monitoring only (for the lead-time alert); their routing
// ignores it.
func (f *fleet) tick() {
	start := time.Now() // wall time, for the routing-update cost only
	f.advanceClock()
	cells, wins := f.cycleCells[:0], f.wins[:0]
	u := f.utilisation()
	for _, e := range f.cells {
		e.rtt.Add(f.oneWay(e.site, f.probeRand) + f.oneWay(e.site, f.probeRand))
		c, w := f.cycleCell(e)
		c.Utilisation = u
		cells, wins = append(cells, c), append(wins, w)
	}
	// The regional controller's mapping (regional/cycle), as it runs it.
	pcells, results := cycle.Map(f.scorer, cells)
	scores := f.tickBuf[:0]
	for i, e := range f.cells {
		res, w := results[i], wins[i]
		if !e.dcgmUp && res.Fallback && f.dcgmAt[i] >= 0 && f.res.fallbackAt[i] < 0 {
			f.res.fallbackAt[i] = f.now
		}
		scores = append(scores, cellScore{res: res, weight: e.weight, ttftP95: w.ttftP95, windowReq: w.requests, hwAlert: hardwareAlert(res)})
	}
	f.pushSiteRTT()
	if f.spec.dynamicBudget {
		f.budgetPct = f.dynamicBudgetPercent(u)
	}
	if f.spec.policy.isobar() {
		d := f.proj.Project(f.base.Add(f.now), pcells)
		if d.Push {
			n := len(d.Weights)
			snap := weightSnap{w: make([]uint32, n), class: make([]uint32, n), degraded: make([]bool, n), probe: make([]uint32, n)}
			for i, w := range d.Weights {
				snap.w[i], snap.class[i], snap.degraded[i], snap.probe[i] = w.Published, w.ClassWeight, w.Degraded, w.ProbeBudget
			}
			k := f.nextSnap
			f.nextSnap++
			f.pendingWeights[k] = snap
			f.push(f.now+f.cfg.DataPlane.PushDelay, evWeights, k, 0, 0)
		}
		f.res.updateCost = append(f.res.updateCost, time.Since(start))
	}
	f.tickBuf, f.cycleCells, f.wins = scores, cells, wins
	if f.spec.onTick != nil {
		f.spec.onTick(f.now, scores)
	}
}

// siteRTTRepush is the controller's rule for re-pushing a round trip
// (regional/cycle: at most every PlacementRepush, when it moved by more
// than RTTDrifted's max(1 ms, a tenth)).
const siteRTTRepush = cycle.PlacementRepush

// siteRTT is a round trip and jitter as pushed to the ingress.
type siteRTT struct {
	rtt, jitter time.Duration
	at          time.Duration // when pushed
}

// pushSiteRTT updates the round trips the ingress has, as the regional
// controller pushes them (regional/cycle/placement.go): each site is a locality
// whose cells share a network, so it carries the median of its cells'
// probed RTTs and jitters (per-cell probe noise would otherwise read as a
// lasting preference), re-pushed when either drifts by more than
// max(1 ms, a tenth) and at most every siteRTTRepush.
func (f *fleet) pushSiteRTT() {
	if f.siteRTT == nil {
		f.siteRTT = make([]siteRTT, len(f.cfg.Topology.Sites))
		for i := range f.siteRTT {
			f.siteRTT[i].at = -siteRTTRepush
		}
	}
	for s := range f.siteRTT {
		var rtts, jits []time.Duration
		for _, e := range f.cells {
			if e.site == s && e.rtt.N > 0 {
				rtts, jits = append(rtts, e.rtt.RTT), append(jits, e.rtt.Jitter)
			}
		}
		if len(rtts) == 0 {
			continue
		}
		slices.Sort(rtts)
		slices.Sort(jits)
		want := siteRTT{rtt: rtts[(len(rtts)-1)/2], jitter: jits[(len(jits)-1)/2], at: f.now}
		cur := &f.siteRTT[s]
		if f.now-cur.at >= siteRTTRepush && (cycle.RTTDrifted(cur.rtt, want.rtt) || cycle.RTTDrifted(cur.jitter, want.jitter)) {
			*cur = want
		}
	}
}

// Alert thresholds on the hardware signals (normalised scores): the
// thermal signal at half scale (82.5 °C, or any throttle bit), or DRAM
// activity at 0.95. Fixed before any comparison; the calibration run
// reports how often they fire without a fault (false_alerts).
const (
	alertThermal = 0.5
	alertDRAM    = 0.95
)

func hardwareAlert(r score.Result) bool {
	return (r.Present[score.Thermal] && r.Normalized[score.Thermal] >= alertThermal) ||
		(r.Present[score.DRAMActive] && r.Normalized[score.DRAMActive] >= alertDRAM)
}

type window struct {
	requests int
	errRate  float64
	ttftP95  time.Duration
}

// cycleCell is what the regional controller knows of cell e (the
// regional/cycle input): what its heartbeat carries, with the probe's RTT
// and jitter, as the registry reads it (application signals while the
// engine answers, hardware ones while the DCGM exporter does), its state
// (failed once detected), its declared context when the run declares it,
// and the data plane's error window.
func (f *fleet) cycleCell(e *engine) (cycle.Cell, window) {
	from := f.now - f.cfg.DataPlane.Window
	e.win = pruneWin(e.win, from)
	e.dpWin = pruneWin(e.dpWin, from)
	c := cycle.Cell{ID: e.id, State: lifecycle.Ready}
	if e.detected {
		c.State = lifecycle.Failed
	}
	if f.declared() {
		c.MaxModelLen = uint32(fullContext) // 0: the model's full context
		if e.maxModelLen > 0 {
			c.MaxModelLen = uint32(e.maxModelLen)
		}
	}
	var w window
	r := score.Reading{AppOK: e.alive, HardwareOK: e.dcgmUp, RTT: e.rtt.RTT, Jitter: e.rtt.Jitter, RTTOK: true}
	if e.alive {
		var ttfts []time.Duration
		errs := 0
		for _, ev := range e.win {
			w.requests++
			if ev.err {
				errs++
			}
			if ev.ttft >= 0 {
				ttfts = append(ttfts, ev.ttft)
			}
		}
		st := e.b.Stats()
		r.QueueDepth, r.Running, r.KVCache = score.Some(float64(st.Waiting)), score.Some(float64(st.Running)), score.Some(st.KVUsage)
		if w.requests > 0 {
			w.errRate = float64(errs) / float64(w.requests)
			r.ErrorRate = score.Some(w.errRate)
		}
		if len(ttfts) > 0 {
			slices.Sort(ttfts)
			w.ttftP95 = quantile.Sorted(ttfts, 0.95)
			r.TTFTP95 = score.Some(w.ttftP95.Seconds())
		}
	}
	if e.dcgmUp {
		g := e.gpu.GPUSample()
		r.GPUUtil = score.Some(g.UtilPct / 100)
		if t := g.FBUsedMiB + g.FBFreeMiB; t > 0 {
			r.VRAM = score.Some(g.FBUsedMiB / t)
		}
		r.SMActive, r.DRAMActive = score.Some(g.SMActive), score.Some(g.DRAMActive)
		r.TemperatureC = score.Some(g.GPUTempC)
		r.ThrottleReasons, r.ThrottleOK = g.ThrottleReasons, true
	}
	if n := len(e.dpWin); n > 0 {
		errs := 0
		for _, ev := range e.dpWin {
			if ev.err {
				errs++
			}
		}
		c.DataPlane = cycle.ErrorWindow{Rate: float64(errs) / float64(n), Requests: float64(n), OK: true}
	}
	c.Reading, c.EngineRequests = r, float64(w.requests)
	return c, w
}

func pruneWin(w []winEv, from time.Duration) []winEv {
	k := 0
	for k < len(w) && w[k].at < from {
		k++
	}
	if k == 0 {
		return w
	}
	return append(w[:0], w[k:]...)
}
