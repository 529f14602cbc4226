package paper

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/gateway/lb"
	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/gateway/prefix"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/sim"
)

// Request outcomes as the client sees them.
const (
	statusPending = 0
	statusOK      = 200
	statusTooLong = 400 // the engine's max_model_len refused the prompt
	statusRefused = 503 // connection refused (a dead engine), no retry left
	statusReset   = 502 // the engine died with the request in flight
	// statusShed: the ingress refused it with 429 — every eligible
	// endpoint at its in-flight cap (the gateway's saturation), or it left
	// the flow-control queue evicted or expired.
	statusShed = 429
	// statusEngineError: the engine answered 503 before any token (a
	// brownout): a retriable status code for the route's retry policy, an
	// external-origin error for outlier detection (consecutive 5xx).
	statusEngineError = 500
)

// request is one client request and what happened to it. Times are virtual,
// from the start of the run; the client sits at the ingress.
type request struct {
	arrive      time.Duration
	prompt, out int
	frontend    time.Duration // engine frontend latency drawn for it
	class       int           // index into the run's classes
	burst       bool
	worker      uint32 // the Envoy worker thread that takes it (mod workers)
	session     uint64 // conversation or document (load.Shape.Session)
	shared      int    // prompt tokens shared with an earlier request of the session
	// blocks is the hash chain of the prompt's full KV blocks
	// (load.Shape.BlockHashes), which the engines' prefix cache keys.
	blocks []uint64
	// work is the prompt tokens the ingress expects the attempt's cell to
	// prefill: the prompt less what the policy expects it to hold cached.
	work     int
	retrying bool // holds a slot of the retry budget
	gen      int  // output tokens generated in the current attempt
	// pendingAt is the cell whose pending prompt tokens (at the ingress)
	// count this request's prompt, or -1.
	pendingAt    int
	sentAt       time.Duration // when the attempt counted there was sent
	cell         int           // the cell that served (or last refused) it
	attempts     int
	tried        []int
	first, end   time.Duration // client-side first token and completion
	engineArrive time.Duration
	status       int
	leaked       bool // sent to a cell whose max_model_len cannot hold it
	sentToDead   bool
	// crit and tenant: the request's criticality and tenant (0 the loud
	// tenant, 1 the quiet one), drawn per request in the overload stage
	// (assignClasses); standard and tenant 0 elsewhere.
	crit   reqclass.Criticality
	tenant int
	// queued: it waited in the flow-control queue; dequeued: it left it
	// to be routed, after waiting wait.
	queued, dequeued bool
	wait             time.Duration
}

func (r *request) ttft() time.Duration { return r.first - r.arrive }

// fault is one injection at a point of a run.
type fault struct {
	at   time.Duration
	kind faultKind
	cell int
	site int
	// value: throttle/PCIe severity, jitter in ns.
	value float64
	lead  time.Duration
}

type faultKind uint8

const (
	faultKill faultKind = iota + 1
	faultThrottle
	faultPCIe
	faultClearHW
	faultDCGMDown
	faultDCGMUp
	faultJitter
	// faultBrownout: the site's engines answer 503 to a share (value) of
	// the requests that reach them.
	faultBrownout
)

// runSpec is one run of the fleet: the same requests and faults for every
// policy.
type runSpec struct {
	policy   Policy
	requests []request
	faults   []fault
	// until is when the run stops (requests still running then are not
	// finished; callers leave a cool-down after the measured arrivals).
	until time.Duration
	seed  uint64
	// maxModelLen per cell (0: the model's full context).
	maxModelLen []int
	// declareCapability: the cells report their max_model_len to the
	// control plane (vLLM's /v1/models), so isobar's data plane routes by
	// it (the context-class clusters). Without it only isobar-capability
	// knows them; isobar learns from the refusals.
	declareCapability bool
	// cells, when set, replaces the ground's cells: one engine per entry
	// with its own site and profile (heterogeneous fleets).
	cells []cellSpec
	// prefixCache: the engines run automatic prefix caching (the
	// prefix stage); otherwise every prompt is prefilled whole, as with
	// vLLM's --no-enable-prefix-caching.
	prefixCache bool
	// inflightCap, when > 0, is the gateway's per-endpoint in-flight cap
	// (gateway.Config.MaxInflightPerEndpoint) for the isobar policies: an
	// arrival whose every eligible endpoint is at it is saturated (429,
	// or the flow-control queue with flowControl).
	inflightCap int
	// batchCap: the cap is per endpoint, flowcontrol.EndpointCap of its
	// max_num_seqs with inflightCap as the upper bound (see capOf).
	batchCap bool
	// flowControl: saturated arrivals wait in the gateway's queue
	// (gateway/flowcontrol, its default bounds) by criticality and tenant.
	flowControl bool
	// capacityRPS, when > 0, is the fleet's capacity the controller
	// divides its demand by (see utilisation): the pool utilisation that
	// bounds the error-rate penalty and, with dynamicBudget, the retry
	// budget xds.RetryBudgetAt(demand/capacity) (dynamicBudgetPercent).
	capacityRPS   float64
	dynamicBudget bool
	// budgetCurve, when set, replaces the default curve of the dynamic
	// budget (xds.DefaultRetryBudgetCurve of the static budget).
	budgetCurve *xds.RetryBudgetCurve
	// onTick is called after every control-plane tick (isobar and the
	// monitoring scorer of the baselines) with the cells' scores.
	onTick func(now time.Duration, scores []cellScore)
}

// cellSpec is one cell of a fleet that is not the ground's uniform one.
type cellSpec struct {
	site    int
	profile sim.Profile
}

// cellScore is what the scorer made of one cell at one tick.
type cellScore struct {
	res       score.Result
	weight    uint32 // published weight (isobar policies)
	ttftP95   time.Duration
	windowReq int
	hwAlert   bool
}

// runResult is what a run measured besides the requests themselves.
type runResult struct {
	requests []request
	// removedAt[cell]: when the ingress stopped choosing the cell after
	// its kill (-1: never).
	removedAt []time.Duration
	// pushes: the times weights reached the ingress (isobar).
	pushes []time.Duration
	// fallbackAt[cell]: first tick with the scorer in fallback after the
	// cell's DCGM exporter died (-1: never).
	fallbackAt []time.Duration
	// updateCost: wall time of each control-plane scoring+projection pass.
	updateCost []time.Duration
	// prefixQueries and prefixHits: the engines' prefix-cache counters
	// (prompt tokens looked up, found) at the end of the run.
	prefixQueries, prefixHits int64
	// cellPrefill: prompt tokens each cell's engine computed (its prefill
	// work, cache hits excluded).
	cellPrefill []int64
	// budget: the dynamic retry budget at each tick (spec.dynamicBudget).
	budget []budgetSample
}

// event kinds of the simulation.
type evKind uint8

const (
	evArrive      evKind = iota + 1 // a request reaches the ingress
	evAtEngine                      // a request attempt reaches a cell
	evJoin                          // a request leaves the engine frontend
	evStepDone                      // an engine step ends
	evReply                         // a response ends at the ingress (refused, 400, done, reset)
	evTick                          // control-plane tick
	evHC                            // one active health-check probe result
	evHCRound                       // an active health-check round starts
	evFault                         // a fault is injected
	evWeights                       // new weights reach the ingress
	evDetect                        // the control plane learns a cell died
	evFirstByte                     // a response's first token reaches the ingress
	evQueueExpire                   // a flow-control queue entry may have expired
)

type event struct {
	at   time.Duration
	seq  uint64
	kind evKind
	a, b int // request index / cell index, per kind
	inc  int // engine incarnation the event belongs to
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// winEv is one completion-handler event in a cell's signal window.
type winEv struct {
	at   time.Duration
	err  bool
	ttft time.Duration // engine-side TTFT; -1 when none (errors, 400s)
}

// engine is one cell: a continuous-batching engine, its GPU and the
// cellagent's view of it.
type engine struct {
	id          string
	site        int
	prof        sim.Profile // the engine's timing profile
	maxModelLen int
	b           *sim.Batcher
	gpu         *sim.GPU
	alive       bool
	incarnation int
	dcgmUp      bool
	stepping    bool
	stepStart   time.Duration
	stepLoad    sim.StepLoad
	tokens      []sim.TokenEvent
	seqs        map[sim.SeqID]int // sequence → request index
	frontend    map[int]bool      // requests in the frontend (not yet in the batcher)
	stepEnd     time.Duration
	// frontendTokens: prompt tokens of the requests in the frontend;
	// runningTokens: context of the sequences in the batcher (the oracle's
	// knowledge).
	frontendTokens int
	runningTokens  int
	// transitTokens and transitN: prompt tokens and requests sent to the
	// cell and still on the network.
	transitTokens, transitN int
	// pendingTokens: the ingress's own count of prompt tokens sent to the
	// cell that have not yet produced a first token there (isobar's pick).
	pendingTokens int
	win           []winEv
	dpWin         []winEv // data-plane (ingress) view: 400s and refusals
	// ingress state
	hcFails    int
	hcDown     bool
	localFails int // consecutive local-origin failures (outlier detection)
	ejections  int // times ejected
	ejectUntil time.Duration
	weight     uint32
	// classWeight is the pushed weight in the context-class clusters when
	// it differs from weight (a cell below the model's longest context).
	classWeight uint32
	degraded    bool // pushed with EDS health DEGRADED
	// probeLeft is what is left of the probe budget the control plane
	// published with the cell's probation weight (-1: no budget, the cell
	// is not on a probe slot). isobar's pick stops sending it requests at
	// 0 (count-bounded probation, enforced by the data plane).
	probeLeft int
	// okNeed is the largest context (prompt + max tokens) the cell has
	// served at the ingress, refusedNeed the smallest it refused as too
	// long (HTTP 400; 0: none), statedLimit the limit its refusal stated;
	// see ceiling.
	okNeed, refusedNeed, statedLimit int
	// detected: the control plane knows it is dead.
	detected bool
	// rtt is the regional prober's estimator.
	rtt score.RTTEstimate
	// pendingQ: the requests whose prompts count in pendingTokens, in the
	// order they were sent; lastFirst: when the last of them left it (its
	// first byte, or its end). See pendingWork.
	pendingQ  []int
	lastFirst time.Duration
	// slotHold: the ingress's own estimate of how long a request holds a
	// batch slot on the cell (isobar's pick): an EWMA, weight
	// slotHoldAlpha, of reply − first byte over the attempts that
	// succeeded there; 0 until the first one.
	slotHold time.Duration
	// prefilled: prompt tokens the engine computed (every incarnation).
	prefilled int64
	// brownout is the share of arrivals the engine answers 503
	// (faultBrownout); consec5xx the ingress's count of consecutive 5xx
	// from it (outlier detection's consecutive_5xx).
	brownout  float64
	consec5xx int
}

// slotHoldAlpha is the weight of the newest sample in engine.slotHold:
// about the last ten completions, a few seconds of a cell's traffic at
// the rates the stages run, so the estimate follows the load's output
// lengths without swinging on one long reply.
const slotHoldAlpha = 0.1

// observeTTFT folds one successful attempt's send → first byte into
// f.ttft.
func (f *fleet) observeTTFT(d time.Duration) {
	if d <= 0 {
		return
	}
	if f.ttft <= 0 {
		f.ttft = d
		return
	}
	f.ttft += time.Duration(slotHoldAlpha * float64(d-f.ttft))
}

// observeSlotHold folds one successful attempt's reply − first byte into
// e.slotHold. That span is the decode phase, which is most of the time a
// request holds its batch slot (its prefill is a step or two); unlike
// reply − send it leaves out the network, the frontend and the wait for
// the slot itself, so a queue cannot inflate the estimate that measures
// it.
func (e *engine) observeSlotHold(d time.Duration) {
	if d <= 0 {
		return
	}
	if e.slotHold <= 0 {
		e.slotHold = d
		return
	}
	e.slotHold += time.Duration(slotHoldAlpha * float64(d-e.slotHold))
}

// fleet is one run in progress. Single goroutine; no real clock: the GPU
// models run on a fake clock the loop advances with virtual time.
type fleet struct {
	cfg    Config
	spec   runSpec
	reqs   []request
	cells  []*engine
	q      eventQueue
	seq    uint64
	now    time.Duration
	clock  *clockwork.FakeClock
	base   time.Time
	jitter []time.Duration
	// Random sources: per request (network trips, load-balancer choices),
	// keyed by (seed, request index), and one each for the health checks,
	// the RTT probes and the schedule (tick and probe phases), so no
	// policy's extra draws shift another stream.
	netR, lbR []*rand.Rand
	hcRand    *rand.Rand
	probeRand *rand.Rand
	schedRand *rand.Rand
	// The stock-Envoy ingress (rr, lr): W workers' balancers, the host
	// weights they were last refreshed with, and requests in flight per
	// host, shared by every policy's accounting.
	pool         *lb.Pool
	hostW, lastW []uint32
	classPools   map[uint64]*classPool
	// siteRTT: the round trip and jitter per site as the controller last
	// pushed them (pushSiteRTT).
	siteRTT       []siteRTT
	active        lb.Counts
	retriesActive int
	ended         int // requests that have ended (success or failure)
	lastFault     time.Duration
	oracleBuf     []int
	// isobar's gateway pick: its constants, each cell's prefill rate (its
	// capacity class), a reused host slice.
	placement   placement.Config
	prefillRate []float64
	placeBuf    []placement.Host
	// The prefix-aware policies: isobar-affinity's index of the blocks
	// sent to each cell, and prefix-hash's ring.
	prefixIdx *prefix.Index[int]
	ring      ring
	scorer    score.Config
	proj      *projection.Projector
	res       runResult
	nextSeq   sim.SeqID
	// cycleCells and wins: each tick's inputs to the mapping and the
	// cells' signal windows (reused buffers).
	cycleCells []cycle.Cell
	wins       []window
	tickBuf    []cellScore
	killedAt   []time.Duration
	dcgmAt     []time.Duration
	// pendingWeights are weight snapshots on their way to the ingress,
	// keyed by the evWeights event's a.
	pendingWeights map[int]weightSnap
	nextSnap       int
	// saturated: the last pick found every eligible endpoint at the
	// in-flight cap (spec.inflightCap).
	saturated bool
	// ttft: the ingress's EWMA (weight slotHoldAlpha) of send → first
	// byte over the successful attempts, every cell together: what the
	// gateway tells its flow-control queue (SetTTFT).
	ttft time.Duration
	// arrivals: when requests reached the ingress (the demand the
	// controller sees); budgetPct the retry budget in effect with
	// spec.dynamicBudget.
	arrivals  []time.Duration
	budgetPct float64
	// queue is the gateway's flow-control queue (spec.flowControl).
	queue *flowQueue
}

var errBadRun = errors.New("paper: invalid run")

func newFleet(cfg Config, spec runSpec) (*fleet, error) {
	n, err := fleetSize(cfg, spec)
	if err != nil {
		return nil, err
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := &fleet{
		cfg: cfg, spec: spec,
		reqs:      slices.Clone(spec.requests),
		clock:     clockwork.NewFakeClockAt(base),
		base:      base,
		netR:      make([]*rand.Rand, len(spec.requests)),
		lbR:       make([]*rand.Rand, len(spec.requests)),
		hcRand:    keyed(spec.seed, saltHC, 0),
		probeRand: keyed(spec.seed, saltProbe, 0),
		schedRand: keyed(spec.seed, saltSchedule, 0),
		budgetPct: cfg.DataPlane.RetryBudgetPercent,
		hostW:     make([]uint32, n),
		active:    make(lb.Counts, n),
		jitter:    make([]time.Duration, len(cfg.Topology.Sites)),
		scorer:    spec.policy.scoreConfig(),
		killedAt:  make([]time.Duration, n),
		dcgmAt:    make([]time.Duration, n),

		pendingWeights: make(map[int]weightSnap),
		classPools:     make(map[uint64]*classPool),
	}
	f.res.removedAt = make([]time.Duration, n)
	f.res.fallbackAt = make([]time.Duration, n)
	for i := range n {
		f.res.removedAt[i], f.res.fallbackAt[i], f.killedAt[i], f.dcgmAt[i] = -1, -1, -1, -1
	}
	if f.proj, err = projection.New(projection.DefaultConfig()); err != nil {
		return nil, err
	}
	f.placement = placement.DefaultConfig()
	if cfg.DataPlane.DecodeCost > 0 {
		f.placement.DecodeCost = cfg.DataPlane.DecodeCost
	}
	if b := cfg.DataPlane.AffinityBand; b != nil {
		f.placement.AffinityBand = *b
	}
	if !spec.policy.affinity() {
		f.placement.AffinityBand = 0
	}
	switch spec.policy {
	case IsobarAffinity:
		f.prefixIdx = newPrefixIndex()
	case PrefixHash:
		f.ring = newRing(n)
	}
	if pol, ok := spec.policy.envoy(cfg.DataPlane); ok {
		if f.pool, err = lb.NewPool(pol, cfg.DataPlane.Workers, keyed(spec.seed, saltLB, 1<<62)); err != nil {
			return nil, err
		}
	}
	for i := range n {
		if err := f.addEngine(i); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// fleetSize is the number of cells spec runs on cfg's topology, after
// checking its cells and max_model_len values.
func fleetSize(cfg Config, spec runSpec) (int, error) {
	n := cfg.Topology.Cells()
	if len(spec.cells) > 0 {
		n = len(spec.cells)
		for i, c := range spec.cells {
			if c.site < 0 || c.site >= len(cfg.Topology.Sites) {
				return 0, fmt.Errorf("%w: cell %d in site %d of %d", errBadRun, i, c.site, len(cfg.Topology.Sites))
			}
			if err := c.profile.Validate(); err != nil {
				return 0, err
			}
		}
	}
	if len(spec.maxModelLen) != 0 && len(spec.maxModelLen) != n {
		return 0, fmt.Errorf("%w: %d max_model_len values for %d cells", errBadRun, len(spec.maxModelLen), n)
	}
	return n, nil
}

// addEngine adds cell i: its engine (batcher and GPU) on its profile and
// site.
func (f *fleet) addEngine(i int) error {
	cfg, spec := f.cfg, f.spec
	prof, site := cfg.Profile, cfg.Topology.SiteOf(i)
	if len(spec.cells) > 0 {
		prof, site = spec.cells[i].profile, spec.cells[i].site
	}
	b, err := sim.NewBatcher(prof)
	if err != nil {
		return err
	}
	g, err := sim.NewGPU(sim.GPUConfig{Info: sim.GPUInfo{Index: i}, Profile: prof.GPU, Seed: int64(spec.seed)}, f.clock)
	if err != nil {
		return err
	}
	g.SetProcess(sim.ProcessReady, 0)
	e := &engine{
		id: fmt.Sprintf("cell-%d", i), site: site, prof: prof,
		b: b, gpu: g, alive: true, dcgmUp: true,
		seqs: make(map[sim.SeqID]int), frontend: make(map[int]bool),
		weight: projection.DefaultConfig().MaxWeight, probeLeft: -1,
	}
	if len(spec.maxModelLen) > 0 {
		e.maxModelLen = spec.maxModelLen[i]
	}
	f.cells = append(f.cells, e)
	f.prefillRate = append(f.prefillRate, prefillRate(prof))
	return nil
}

func (f *fleet) push(at time.Duration, k evKind, a, b, inc int) {
	f.seq++
	heap.Push(&f.q, event{at: at, seq: f.seq, kind: k, a: a, b: b, inc: inc})
}

// oneWay draws one trip's delay between the ingress and site s from r:
// the site's delay plus |N(0,1)| × its jitter.
func (f *fleet) oneWay(s int, r *rand.Rand) time.Duration {
	d := f.cfg.Topology.Sites[s].OneWay
	if j := f.jitter[s]; j > 0 {
		d += time.Duration(math.Abs(r.NormFloat64()) * float64(j))
	}
	return d
}

// meanOneWay is the expected trip delay to site s now: E|N(0,1)| = √(2/π).
func (f *fleet) meanOneWay(s int) time.Duration {
	return f.cfg.Topology.Sites[s].OneWay + time.Duration(math.Sqrt(2/math.Pi)*float64(f.jitter[s]))
}

// trip draws a network trip of request i to or from site s.
func (f *fleet) trip(i, s int) time.Duration {
	if f.netR[i] == nil {
		f.netR[i] = keyed(f.spec.seed, saltNet, uint64(i))
	}
	return f.oneWay(s, f.netR[i])
}

// lbRand is request i's source for load-balancer choices.
func (f *fleet) lbRand(i int) *rand.Rand {
	if f.lbR[i] == nil {
		f.lbR[i] = keyed(f.spec.seed, saltLB, uint64(i))
	}
	return f.lbR[i]
}

func (f *fleet) advanceClock() {
	if t := f.base.Add(f.now); t.After(f.clock.Now()) {
		f.clock.Advance(t.Sub(f.clock.Now()))
	}
}

// run simulates until spec.until and returns the result.
func (f *fleet) run() (runResult, error) {
	for i := range f.reqs {
		f.push(f.reqs[i].arrive, evArrive, i, 0, 0)
	}
	for i, ft := range f.spec.faults {
		f.push(ft.at, evFault, i, 0, 0)
		f.lastFault = max(f.lastFault, ft.at)
	}
	phase := time.Duration(f.schedRand.Int64N(int64(f.cfg.DataPlane.Heartbeat)))
	f.push(phase, evTick, 0, 0, 0)
	hp := time.Duration(f.schedRand.Int64N(int64(f.cfg.DataPlane.HCInterval)))
	if f.spec.policy.healthChecked() {
		f.push(hp, evHCRound, 0, 0, 0)
	}
	for f.q.Len() > 0 {
		ev := heap.Pop(&f.q).(event)
		if ev.at > f.spec.until {
			break
		}
		// Once every request has ended and every fault is in, nothing
		// left (ticks, health checks) can change a figure.
		if f.ended == len(f.reqs) && ev.at > f.lastFault {
			break
		}
		f.now = ev.at
		if err := f.handle(ev); err != nil {
			return runResult{}, err
		}
	}
	f.res.requests = f.reqs
	for _, e := range f.cells {
		st := e.b.Stats()
		f.res.prefixQueries += st.PrefixQueries
		f.res.prefixHits += st.PrefixHits
		f.res.cellPrefill = append(f.res.cellPrefill, e.prefilled)
	}
	return f.res, nil
}

func (f *fleet) handle(ev event) error {
	switch ev.kind {
	case evArrive:
		f.arrivals = append(f.arrivals, f.now)
		f.route(ev.a)
	case evQueueExpire:
		f.expireQueued()
		f.dispatchQueued()
	case evAtEngine:
		f.atEngine(ev.a, ev.b, ev.inc)
	case evJoin:
		return f.join(ev.a, ev.b, ev.inc)
	case evStepDone:
		f.stepDone(ev.b, ev.inc)
	case evReply:
		f.reply(ev.a, ev.b)
	case evTick:
		f.tick()
		f.push(f.now+f.cfg.DataPlane.Heartbeat, evTick, 0, 0, 0)
	case evHCRound:
		for i, e := range f.cells {
			rtt := f.oneWay(e.site, f.hcRand) + f.oneWay(e.site, f.hcRand)
			ok := 0
			if e.alive {
				ok = 1
			}
			f.push(f.now+rtt, evHC, ok, i, 0)
		}
		f.push(f.now+f.cfg.DataPlane.HCInterval, evHCRound, 0, 0, 0)
	case evHC:
		e := f.cells[ev.b]
		if ev.a == 1 {
			e.hcFails, e.hcDown = 0, false
			return nil
		}
		e.hcFails++
		if e.hcFails >= f.cfg.DataPlane.HCUnhealthy && !e.hcDown {
			e.hcDown = true
			f.markRemoved(ev.b)
		}
	case evFault:
		f.inject(f.spec.faults[ev.a])
	case evWeights:
		// ev.a indexes the pending weight snapshot carried in pending. As
		// the gateway's table update, new weights offer the flow-control
		// queue any slot they open.
		f.applyWeights(ev.a)
		f.dispatchQueued()
	case evFirstByte:
		f.clearPending(ev.a, ev.b)
	case evDetect:
		e := f.cells[ev.b]
		if e.incarnation == ev.inc && !e.alive {
			e.detected = true
			f.tick() // the FAILED heartbeat triggers an urgent cycle
		}
	}
	return nil
}

// markRemoved records when the ingress stopped choosing a killed cell.
func (f *fleet) markRemoved(c int) {
	if f.killedAt[c] >= 0 && f.res.removedAt[c] < 0 {
		f.res.removedAt[c] = f.now
	}
}

// route sends (or re-sends) request i from the ingress.
func (f *fleet) route(i int) {
	r := &f.reqs[i]
	if r.attempts == 0 && f.yields(i) && f.enqueue(i) {
		return
	}
	c := f.pick(i)
	if c < 0 && f.saturated && r.attempts == 0 && f.enqueue(i) {
		return
	}
	if c < 0 {
		r.status, r.end = statusRefused, f.now
		if f.saturated && r.attempts == 0 {
			r.status = statusShed
		}
		f.ended++
		f.endRetry(r)
		return
	}
	e := f.cells[c]
	r.cell = c
	r.gen = 0
	r.attempts++
	r.tried = append(r.tried, c)
	f.active[c]++
	if e.probeLeft > 0 {
		e.probeLeft--
	}
	f.sent(c, r)
	e.pendingTokens += r.work
	e.pendingQ = append(e.pendingQ, i)
	r.pendingAt, r.sentAt = c, f.now
	e.transitTokens += r.prompt
	e.transitN++
	if e.maxModelLen > 0 && r.prompt+r.out > e.maxModelLen {
		r.leaked = true
	}
	f.push(f.now+f.trip(i, e.site), evAtEngine, i, c, e.incarnation)
}

// atEngine: request i's attempt reaches cell c.
func (f *fleet) atEngine(i, c, inc int) {
	r, e := &f.reqs[i], f.cells[c]
	e.transitTokens -= r.prompt
	e.transitN--
	back := f.now + f.trip(i, e.site)
	if !e.alive || e.incarnation != inc {
		r.sentToDead = true
		f.push(back, evReply, i, c, 0)
		r.status = statusRefused
		return
	}
	r.engineArrive = f.now
	if e.brownout > 0 && keyed(f.spec.seed, saltBrownout, uint64(i)<<8|uint64(r.attempts)).Float64() < e.brownout {
		e.win = append(e.win, winEv{at: f.now, err: true, ttft: -1})
		r.status = statusEngineError
		f.push(back, evReply, i, c, 0)
		return
	}
	if e.maxModelLen > 0 && r.prompt+r.out > e.maxModelLen {
		e.win = append(e.win, winEv{at: f.now, err: true, ttft: -1})
		r.status = statusTooLong
		f.push(back, evReply, i, c, 0)
		return
	}
	e.frontend[i] = true
	e.frontendTokens += r.prompt
	f.push(f.now+r.frontend, evJoin, i, c, inc)
}

func (f *fleet) join(i, c, inc int) error {
	e := f.cells[c]
	if !e.alive || e.incarnation != inc || !e.frontend[i] {
		return nil
	}
	delete(e.frontend, i)
	r := &f.reqs[i]
	e.frontendTokens -= r.prompt
	id := f.nextSeq
	f.nextSeq++
	var blocks []uint64
	if f.spec.prefixCache {
		blocks = r.blocks
	}
	if err := e.b.AddBlocks(id, r.prompt, r.out, blocks); err != nil {
		if !errors.Is(err, sim.ErrExceedsKVCache) {
			return err
		}
		e.win = append(e.win, winEv{at: f.now, err: true, ttft: -1})
		r.status = statusTooLong
		f.push(f.now+f.trip(i, e.site), evReply, i, c, 0)
		return nil
	}
	e.seqs[id] = i
	e.runningTokens += r.prompt
	if !e.stepping {
		f.startStep(c)
	}
	return nil
}

func (f *fleet) startStep(c int) {
	e := f.cells[c]
	s := e.b.Step()
	if s.Idle || s.Duration <= 0 {
		e.stepping = false
		return
	}
	f.advanceClock()
	d := time.Duration(float64(s.Duration) * e.gpu.StepMultiplier(f.clock.Now()))
	e.stepping, e.stepStart, e.stepEnd = true, f.now, f.now+d
	e.tokens = append(e.tokens[:0], s.Tokens...)
	e.prefilled += int64(s.PrefillTokens)
	prefill := 0.0
	if s.Duration > 0 {
		prefill = min(float64(s.PrefillDuration)/float64(s.Duration), 1)
	}
	e.stepLoad = sim.StepLoad{Batch: s.Scheduled, PrefillShare: prefill, Tokens: len(s.Tokens)}
	f.push(f.now+d, evStepDone, 0, c, e.incarnation)
}

func (f *fleet) stepDone(c, inc int) {
	e := f.cells[c]
	if !e.alive || e.incarnation != inc {
		return
	}
	f.advanceClock()
	e.gpu.RecordStep(f.base.Add(e.stepStart), f.base.Add(f.now), e.stepLoad)
	for _, tk := range e.tokens {
		i, ok := e.seqs[tk.ID]
		if !ok {
			continue
		}
		r := &f.reqs[i]
		r.gen = tk.N
		e.runningTokens++
		if tk.N == 1 {
			r.first = f.now + f.trip(i, e.site)
			e.win = append(e.win, winEv{at: f.now, ttft: f.now - r.engineArrive})
			f.push(r.first, evFirstByte, i, c, 0)
		}
		if tk.Done {
			delete(e.seqs, tk.ID)
			e.runningTokens -= r.prompt + tk.N
			r.status = statusOK
			f.push(f.now+f.trip(i, e.site), evReply, i, c, 0)
		}
	}
	f.startStep(c)
}

// clearPending removes request i's prompt from cell c's pending tokens
// at the ingress, once: at its first token or when the attempt ends.
func (f *fleet) clearPending(i, c int) {
	r := &f.reqs[i]
	if r.pendingAt != c {
		return
	}
	e := f.cells[c]
	e.pendingTokens -= r.work
	if k := slices.Index(e.pendingQ, i); k >= 0 {
		e.pendingQ = slices.Delete(e.pendingQ, k, k+1)
	}
	e.lastFirst = f.now
	r.pendingAt = -1
}

// reply: request i's attempt on cell c ended at the ingress.
func (f *fleet) reply(i, c int) {
	r, e := &f.reqs[i], f.cells[c]
	f.active[c]--
	f.clearPending(i, c)
	switch r.status {
	case statusRefused, statusReset:
		if r.status == statusRefused {
			e.dpWin = append(e.dpWin, winEv{at: f.now, err: true, ttft: -1})
		}
		// A refused connection, or a reset before the first byte, is a
		// local-origin failure: outlier detection counts it and the retry
		// policy (connect-failure, reset) may send the request elsewhere.
		if f.spec.policy.resilient() && r.first == 0 {
			f.localFailure(c)
			if f.retry(r) {
				r.status = statusPending
				r.first = 0
				f.route(i)
				f.dispatchQueued()
				return
			}
		}
		r.end = f.now
		f.ended++
	case statusEngineError:
		e.dpWin = append(e.dpWin, winEv{at: f.now, err: true, ttft: -1})
		if f.spec.policy.resilient() {
			f.external5xx(c)
			if f.retry(r) {
				r.status = statusPending
				f.route(i)
				f.dispatchQueued()
				return
			}
		}
		r.end = f.now
		f.ended++
	case statusTooLong:
		e.dpWin = append(e.dpWin, winEv{at: f.now, err: true, ttft: -1})
		if need := r.prompt + r.out; e.refusedNeed == 0 || need < e.refusedNeed {
			e.refusedNeed = need
		}
		// The refusal states the limit (vLLM's "maximum context length
		// is N tokens"), as the engine's 400 does.
		e.statedLimit = e.maxModelLen
		r.end = f.now
		f.ended++
	default:
		e.localFails, e.consec5xx = 0, 0
		e.okNeed = max(e.okNeed, r.prompt+r.out)
		e.dpWin = append(e.dpWin, winEv{at: f.now, ttft: -1})
		if r.status == statusOK && r.first > 0 {
			e.observeSlotHold(f.now - r.first)
			f.observeTTFT(r.first - r.sentAt)
		}
		r.end = f.now
		f.ended++
	}
	f.endRetry(r)
	f.dispatchQueued()
}

// ceiling is the largest context (prompt + max tokens) the ingress still
// sends cell e, or 0 for no limit: the gateway's rejection memory
// (gateway/capability.go, placement.ContextCeiling), which catches a
// max_model_len nobody declared at its first refusal.
func (e *engine) ceiling() int {
	return int(placement.ContextCeiling(int64(e.okNeed), int64(e.refusedNeed), int64(e.statedLimit)))
}

// fits reports whether the ingress may send cell e a request needing need
// tokens of context: within its declared max_model_len when declared,
// and within its learned ceiling.
func (e *engine) fits(need int, declared bool) bool {
	if declared && e.maxModelLen > 0 && need > e.maxModelLen {
		return false
	}
	c := e.ceiling()
	return c == 0 || need <= c
}

// localFailure is outlier detection's consecutive local-origin failure
// counter (Envoy outlier_detection with split_external_local_origin_errors):
// at EjectConsecutive the host is ejected for EjectFor × times ejected,
// unless MaxEjectPercent of the hosts are out already.
func (f *fleet) localFailure(c int) {
	e := f.cells[c]
	e.localFails++
	if e.localFails < f.cfg.DataPlane.EjectConsecutive {
		return
	}
	if f.eject(c) {
		e.localFails = 0
	}
}

// eject takes cell c out for EjectFor × times ejected, unless it is out
// already or MaxEjectPercent of the hosts are; it reports whether it did.
func (f *fleet) eject(c int) bool {
	e := f.cells[c]
	if e.ejectUntil > f.now {
		return false
	}
	out := 0
	for _, x := range f.cells {
		if x.ejectUntil > f.now {
			out++
		}
	}
	if 100*(out+1) > f.cfg.DataPlane.MaxEjectPercent*len(f.cells) {
		return false
	}
	e.ejections++
	e.ejectUntil = f.now + time.Duration(e.ejections)*f.cfg.DataPlane.EjectFor
	f.markRemoved(c)
	return true
}

// retry reports whether request r may be retried: attempts left and room
// in the retry budget (max(RetryBudgetMin, RetryBudgetPercent % of the
// requests in flight) retries in flight at once).
func (f *fleet) retry(r *request) bool {
	d := f.cfg.DataPlane
	if r.attempts > d.NumRetries {
		return false
	}
	if !r.retrying {
		var inflight uint64
		for _, a := range f.active {
			inflight += a
		}
		pct := d.RetryBudgetPercent
		if f.spec.dynamicBudget {
			pct = f.budgetPct
		}
		budget := max(d.RetryBudgetMin, int(pct*float64(inflight)/100))
		if f.retriesActive >= budget {
			return false
		}
		r.retrying = true
		f.retriesActive++
	}
	return true
}

func (f *fleet) endRetry(r *request) {
	if r.retrying {
		r.retrying = false
		f.retriesActive--
	}
}

func (f *fleet) inject(ft fault) {
	f.advanceClock()
	switch ft.kind {
	case faultKill:
		e := f.cells[ft.cell]
		if !e.alive {
			return
		}
		e.alive = false
		f.killedAt[ft.cell] = f.now
		if f.spec.policy == Oracle {
			f.markRemoved(ft.cell) // it knows at once, and never picks a dead cell
		}
		// Requests in flight are reset; the ingress learns one trip later.
		for id, i := range e.seqs {
			f.reqs[i].status = statusReset
			f.push(f.now+f.trip(i, e.site), evReply, i, ft.cell, 0)
			delete(e.seqs, id)
		}
		for i := range e.frontend {
			f.reqs[i].status = statusReset
			f.push(f.now+f.trip(i, e.site), evReply, i, ft.cell, 0)
		}
		clear(e.frontend)
		e.frontendTokens, e.runningTokens = 0, 0
		e.incarnation++
		e.stepping = false
		b, _ := sim.NewBatcher(e.prof) // the profile was validated at start
		e.b = b
		if f.spec.policy.isobar() {
			f.push(f.now+f.cfg.DataPlane.KillDetect, evDetect, 0, ft.cell, e.incarnation)
		}
	case faultThrottle:
		f.cells[ft.cell].gpu.Throttle(ft.value, ft.lead)
	case faultPCIe:
		f.cells[ft.cell].gpu.PCIe(ft.value, ft.lead)
	case faultClearHW:
		f.cells[ft.cell].gpu.ClearFaults()
	case faultDCGMDown:
		f.cells[ft.cell].dcgmUp = false
		f.dcgmAt[ft.cell] = f.now
	case faultDCGMUp:
		f.cells[ft.cell].dcgmUp = true
	case faultJitter:
		f.jitter[ft.site] = time.Duration(ft.value)
	case faultBrownout:
		for _, e := range f.cells {
			if e.site == ft.site {
				e.brownout = ft.value
			}
		}
	}
}

// fullContext is the context of the grounds' models (max_position_embeddings
// of Llama 3.1/3.3), which a cell at its model's full max_model_len
// declares.
const fullContext = 131072

// capacityClassTokens is the prompt size a cell's prefill rate is
// measured at: the rate its capacity class would carry.
const capacityClassTokens = 2048

// prefillRate is a profile's prefill throughput in prompt tokens per
// second on an idle engine, at capacityClassTokens.
func prefillRate(p sim.Profile) float64 {
	d := p.EstimatePrefill(capacityClassTokens)
	if d <= 0 {
		return 0
	}
	return capacityClassTokens / d.Seconds()
}

// pending weight snapshots in flight to the ingress.
type weightSnap struct {
	w        []uint32
	class    []uint32 // ClassWeight (0: as w)
	degraded []bool   // EDS health DEGRADED (a hardware derate)
	probe    []uint32 // probe budgets (0: none)
}

func (f *fleet) applyWeights(k int) {
	snap := f.pendingWeights[k]
	delete(f.pendingWeights, k)
	for i, w := range snap.w {
		e := f.cells[i]
		// A probe budget counts from the push that opens the slot: a
		// repeated push of the same slot does not refill it.
		switch b := snap.probe[i]; {
		case b == 0:
			e.probeLeft = -1
		case e.probeLeft < 0 || e.weight == 0:
			e.probeLeft = int(b)
		}
		e.weight, e.classWeight = w, snap.class[i]
		e.degraded = snap.degraded[i]
		if w == 0 {
			f.markRemoved(i)
		}
	}
	f.res.pushes = append(f.res.pushes, f.now)
}
