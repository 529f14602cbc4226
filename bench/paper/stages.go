package paper

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/bench/load"
	"github.com/isobar-mesh/isobar/internal/quantile"
	"github.com/isobar-mesh/isobar/sim"
)

// Stage names, in the order they run.
const (
	StageCalibration      = "calibration"
	StageSLOThroughput    = "slo_throughput"
	StageLeadTime         = "lead_time"
	StageFailover         = "failover"
	StageBurst            = "burst"
	StageMismatch         = "mismatch"
	StageTelemetryFailure = "telemetry_failure"
	StageNetwork          = "network"
)

// Stages lists every stage in run order.
func Stages() []string {
	return []string{StageCalibration, StageSLOThroughput, StageLeadTime, StageFailover, StageBurst,
		StageMismatch, StageTelemetryFailure, StageNetwork, StageHetero, StageHomogeneous6, StageThrottled, StagePrefix,
		StageOverloadPriority, StageRetryStorm}
}

// stagePolicies are the policies each stage compares. The oracle runs
// wherever placement decides the figures; the lead-time and telemetry
// stages measure signals, which it does not use.
func stagePolicies(stage string) []Policy {
	switch stage {
	case StageFailover:
		return []Policy{RR, RRPlain, LR, Isobar, Oracle}
	case StageMismatch:
		return []Policy{RR, LR, Isobar, IsobarCapability, Oracle}
	case StageNetwork:
		return []Policy{RR, LR, IsobarGPUOnly, Isobar, Oracle}
	case StagePrefix:
		return []Policy{RR, LR, Isobar, IsobarAffinity, PrefixHash, PrecisePrefix, Oracle}
	case StageOverloadPriority:
		return []Policy{RR, LR, IsobarNoCrit, Isobar}
	case StageRetryStorm:
		return []Policy{RR, LR, IsobarStaticBudget, Isobar}
	case StageLeadTime, StageTelemetryFailure:
		return []Policy{RR, LR, Isobar}
	case StageCalibration, StageSLOThroughput, StageHetero, StageHomogeneous6, StageThrottled:
		return []Policy{RR, LR, Isobar, IsobarEnvoy, Oracle}
	default:
		return []Policy{RR, LR, Isobar, Oracle}
	}
}

// Mode sizes the run.
type Mode string

// The run sizes.
const (
	// Full is the published evaluation's length (many seeds, long windows).
	Full Mode = "full"
	// Quick is a shorter run with the same stages (minutes).
	Quick Mode = "quick"
	// Smoke is a tiny run for tests (seconds): the figures are noisy.
	Smoke Mode = "smoke"
)

// plan is the size of each stage.
type plan struct {
	// seeds: every stage runs once per seed, for every policy.
	seeds               int
	calibWarm, calibDur time.Duration
	sloWarm, sloDur     time.Duration
	sloCool             time.Duration
	sloIters            int
	sloClasses          []string // empty: all
	prefixClasses       []string // empty: all of prefixClasses
	episodeCells        []int
	episodeSeeds        int
	leadObserve         time.Duration
	burstDur            time.Duration
	mismatchDur         time.Duration
	netPhase            time.Duration
}

func planFor(m Mode, cells int) (plan, error) {
	all := make([]int, cells)
	for i := range all {
		all[i] = i
	}
	switch m {
	case Full:
		return plan{seeds: 5, calibWarm: 10 * time.Second, calibDur: 120 * time.Second,
			sloWarm: 60 * time.Second, sloDur: 300 * time.Second, sloCool: 30 * time.Second, sloIters: 8,
			episodeCells: all, episodeSeeds: 1, leadObserve: 60 * time.Second,
			burstDur: 600 * time.Second, mismatchDur: 300 * time.Second, netPhase: 120 * time.Second}, nil
	case Quick:
		return plan{seeds: 3, calibWarm: 10 * time.Second, calibDur: 60 * time.Second,
			sloWarm: 30 * time.Second, sloDur: 120 * time.Second, sloCool: 15 * time.Second, sloIters: 7,
			episodeCells: all, episodeSeeds: 1, leadObserve: 60 * time.Second,
			burstDur: 180 * time.Second, mismatchDur: 120 * time.Second, netPhase: 60 * time.Second}, nil
	case Smoke:
		return plan{seeds: 2, calibWarm: 5 * time.Second, calibDur: 20 * time.Second,
			sloWarm: 5 * time.Second, sloDur: 20 * time.Second, sloCool: 5 * time.Second, sloIters: 3,
			sloClasses:    []string{"baseline_mixed", "adversarial_spike"},
			prefixClasses: []string{"multiturn", "baseline_mixed"},
			episodeCells:  []int{cells - 1}, episodeSeeds: 1, leadObserve: 30 * time.Second,
			burstDur: 35 * time.Second, mismatchDur: 30 * time.Second, netPhase: 15 * time.Second}, nil
	}
	return plan{}, fmt.Errorf("paper: unknown mode %q: want full, quick or smoke", m)
}

// Options configures Run.
type Options struct {
	Mode Mode
	// Seed is the first seed; a run uses Seeds consecutive seeds from it,
	// the same for every policy.
	Seed uint64
	// Seeds overrides the mode's number of seeds when > 0.
	Seeds int
	// Parallel bounds the (ground, seed) jobs run at once (default
	// GOMAXPROCS). Each job is one goroutine owning its fleets.
	Parallel int
	// Stages to run (default all).
	Stages []string
	// Classes restricts the SLO-throughput stage to these workload
	// classes (default: the mode's, all but in smoke runs).
	Classes []string
	// Progress, when set, is called as trials finish.
	Progress func(stage, msg string)
}

// runner runs the stages of one ground at one seed. One goroutine.
type runner struct {
	cfg   Config
	opt   Options
	plan  plan
	seed0 uint64 // this job's seed
	// figs: stage → policy → figures at this seed; digests: stage →
	// policy → hash of the requests run.
	figs    map[string]map[string]Figures
	digests map[string]map[string]string
	// ttft samples for the charts; the failover timeline.
	calibTTFT map[Policy][]time.Duration
	timeline  map[Policy][]timelineBin
	// sustainable adversarial_spike rate, for the burst stage.
	spikeRPS map[Policy]float64
	// sloRate: policy → class → sustainable rate at this seed (the
	// slo_throughput stage's, or fleetCapacity's own bisection).
	sloRate map[Policy]map[string]float64
}

type timelineBin struct {
	at             time.Duration // from the kill
	sent, failed   int
	toDeadAttempts int
}

func (r *runner) progress(stage, format string, a ...any) {
	if r.opt.Progress != nil {
		r.opt.Progress(stage, fmt.Sprintf("%s seed %d: ", r.cfg.Ground, r.seed0)+fmt.Sprintf(format, a...))
	}
}

func (r *runner) set(stage string, p Policy, f Figures) {
	if r.figs[stage] == nil {
		r.figs[stage] = map[string]Figures{}
	}
	r.figs[stage][string(p)] = f
}

// digestOf records the requests of a stage's trials per policy, so the
// report shows every policy ran the same requests.
func (r *runner) digestOf(stage string, p Policy, d string) {
	if r.digests[stage] == nil {
		r.digests[stage] = map[string]string{}
	}
	prev := r.digests[stage][string(p)]
	r.digests[stage][string(p)] = digestCombine(prev, d)
}

func digestCombine(a, b string) string {
	if a == "" {
		return b
	}
	h := fnv.New64a()
	h.Write([]byte(a))
	h.Write([]byte{0})
	h.Write([]byte(b))
	return fmt.Sprintf("%016x", h.Sum64())
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func (r *runner) trial(p Policy, reqs []request, faults []fault, until time.Duration, seed uint64, mml []int, onTick func(time.Duration, []cellScore)) (runResult, error) {
	return r.trialSpec(runSpec{policy: p, requests: reqs, faults: faults, until: until, seed: seed, maxModelLen: mml, onTick: onTick})
}

func (r *runner) trialSpec(spec runSpec) (runResult, error) {
	f, err := newFleet(r.cfg, spec)
	if err != nil {
		return runResult{}, err
	}
	return f.run()
}

func (r *runner) seed(stage string, k int) uint64 {
	return r.seed0*1_000_003 + (hashString(stage)&0xffffff)*131 + uint64(k)
}

func class(name string) load.Class {
	c, err := load.LookupClass(name)
	if err != nil {
		panic(err) // the names below are the package's own
	}
	return c
}

// drain is how long a run continues after the last measured arrival so
// that the requests finish; a request still running then has failed.
const drain = 120 * time.Second

// calibration: baseline_mixed at 10 RPS.
func (r *runner) calibration(ctx context.Context) error {
	pl := r.plan
	for _, p := range stagePolicies(StageCalibration) {
		var all []request
		falseAlerts := 0
		var costs []time.Duration
		{
			if err := ctx.Err(); err != nil {
				return err
			}
			seed := r.seed(StageCalibration, 0)
			w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 10, duration: pl.calibWarm + pl.calibDur + 10*time.Second, seed: seed}
			reqs := w.generate(r.cfg.Profile)
			r.digestOf(StageCalibration, p, digest(reqs))
			res, err := r.trial(p, reqs, nil, w.duration+drain, seed, nil, func(_ time.Duration, sc []cellScore) {
				for _, c := range sc {
					if c.hwAlert {
						falseAlerts++
					}
				}
			})
			if err != nil {
				return err
			}
			for _, q := range res.requests {
				if q.arrive >= pl.calibWarm && q.arrive < pl.calibWarm+pl.calibDur {
					all = append(all, q)
				}
			}
			costs = append(costs, res.updateCost...)
		}
		st := summarise(all, func(*request) bool { return true })
		r.calibTTFT[p] = st.ttft
		f := Figures{
			"requests": num(float64(st.n)), "success": num(st.success),
			"ttft_p50_ms": ms(st.ttftP50), "ttft_p95_ms": ms(st.ttftP95), "ttft_p99_ms": ms(st.ttftP99),
			"e2e_p95_ms": ms(st.e2eP95), "false_alerts": num(float64(falseAlerts)),
			"routing_update_p50_ms": nil, "routing_update_p99_ms": nil,
		}
		if len(costs) > 0 {
			f["routing_update_p50_ms"] = ms(quantile.Of(costs, 0.5))
			f["routing_update_p99_ms"] = ms(quantile.Of(costs, 0.99))
		}
		r.set(StageCalibration, p, f)
		r.progress(StageCalibration, "%s: success %.4f TTFT P50 %.0f ms P95 %.0f ms P99 %.0f ms E2E P95 %.0f ms",
			p, st.success, float64(st.ttftP50)/1e6, float64(st.ttftP95)/1e6, float64(st.ttftP99)/1e6, float64(st.e2eP95)/1e6)
	}
	return nil
}

// sustainableIn reports whether the fleet spec describes holds class c's
// SLO at rps (its requests and until are filled in here).
func (r *runner) sustainableIn(spec runSpec, c load.Class, rps float64) (bool, reqStats, error) {
	pl := r.plan
	w := workload{mix: []mixPart{{c, 1}}, rps: rps, duration: pl.sloWarm + pl.sloDur + pl.sloCool, seed: spec.seed}
	spec.requests, spec.until = w.generate(r.cfg.Profile), w.duration+drain
	res, err := r.trialSpec(spec)
	if err != nil {
		return false, reqStats{}, err
	}
	st := summarise(res.requests, arrivedIn(pl.sloWarm, pl.sloWarm+pl.sloDur))
	return st.meetsSLO(c.SLO), st, nil
}

// bisect returns the highest rate (to the plan's resolution) at which
// the fleet spec describes holds class c's SLO.
func (r *runner) bisect(ctx context.Context, spec runSpec, c load.Class) (float64, error) {
	lo, hi := 0.0, r.cfg.SLOHigh
	for range r.plan.sloIters {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		mid := (lo + hi) / 2
		ok, _, err := r.sustainableIn(spec, c, mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// sloThroughput bisects, per class and policy, the highest rate meeting
// the class's tier-2 SLO, and reports each policy against rr, lr and the
// oracle at this seed.
func (r *runner) sloThroughput(ctx context.Context) error {
	pl := r.plan
	classes := load.Classes()
	if len(r.opt.Classes) > 0 {
		pl.sloClasses = r.opt.Classes
	}
	if len(pl.sloClasses) > 0 {
		classes = slices.DeleteFunc(classes, func(c load.Class) bool { return !slices.Contains(pl.sloClasses, c.Name) })
	}
	pols := stagePolicies(StageSLOThroughput)
	rate := map[Policy]map[string]float64{}
	for _, p := range pols {
		rate[p] = map[string]float64{}
		for ci, c := range classes {
			seed := r.seed(StageSLOThroughput, ci)
			lo, err := r.bisect(ctx, runSpec{policy: p, seed: seed}, c)
			if err != nil {
				return err
			}
			r.digestOf(StageSLOThroughput, p, fmt.Sprintf("%s/%d", c.Name, seed))
			rate[p][c.Name] = lo
			r.noteRate(p, c.Name, lo)
			if c.Name == "adversarial_spike" {
				r.spikeRPS[p] = lo
			}
			r.progress(StageSLOThroughput, "%s %s: %.2f RPS at P95 TTFT <= %v", p, c.Name, lo, c.SLO)
		}
	}
	ratio := func(a, b float64) *float64 {
		if b <= 0 {
			return nil
		}
		return num(a / b)
	}
	floors := map[string]time.Duration{}
	for _, c := range classes {
		floors[c.Name] = r.ttftFloor(c)
	}
	for _, p := range pols {
		f := Figures{}
		minRR, minLR, minOracle := math.Inf(1), math.Inf(1), math.Inf(1)
		for _, c := range classes {
			v := rate[p][c.Name]
			f[c.Name+"_sustainable_rps"] = num(v)
			f[c.Name+"_slo_ms"] = ms(c.SLO)
			f[c.Name+"_ttft_floor_ms"] = ms(floors[c.Name])
			if p != RR {
				if x := ratio(v, rate[RR][c.Name]); x != nil {
					f[c.Name+"_vs_rr"] = x
					minRR = min(minRR, *x)
				}
			}
			if p != LR {
				if x := ratio(v, rate[LR][c.Name]); x != nil {
					f[c.Name+"_vs_lr"] = x
					minLR = min(minLR, *x)
				}
			}
			if x := ratio(v, rate[Oracle][c.Name]); x != nil {
				f[c.Name+"_oracle_fraction"] = x
				minOracle = min(minOracle, *x)
			}
		}
		if p != RR {
			f["min_vs_rr"] = num(minRR)
		}
		if p != LR {
			f["min_vs_lr"] = num(minLR)
		}
		f["min_oracle_fraction"] = num(minOracle)
		r.set(StageSLOThroughput, p, f)
	}
	return nil
}

// ttftFloor is the TTFT of class c's 95th-percentile prompt on an idle
// engine of the nearest site: both network trips, the frontend and the
// prefill alone. A class whose floor exceeds its SLO cannot be served
// within it at any rate, whatever the router.
func (r *runner) ttftFloor(c load.Class) time.Duration {
	s := load.NewSampler(c, r.seed0)
	prompts := make([]int, 2000)
	for i := range prompts {
		// Spread over 200 s so that rapid_shift's phases both count.
		prompts[i] = s.Next(time.Duration(i) * 100 * time.Millisecond).Prompt
	}
	slices.Sort(prompts)
	p95 := prompts[len(prompts)*95/100]
	near := r.cfg.Topology.Sites[0].OneWay
	for _, st := range r.cfg.Topology.Sites {
		near = min(near, st.OneWay)
	}
	p := r.cfg.Profile
	return 2*near + p.FrontendLatency + p.FrontendJitter + p.EstimatePrefill(p95)
}

// SLO the lead-time and telemetry stages hold baseline_mixed to.
const baselineSLO = 1500 * time.Millisecond

// leadTime injects thermal throttling and PCIe contention on each cell in
// turn under 10 RPS. The alert is the first heartbeat whose hardware
// signals cross the alert thresholds; the crossing is when the stressed
// cell's TTFT P95 (cellagent window) crosses the SLO under round-robin,
// which does not react: the point it would cross. A breach is an episode
// in which the whole fleet's TTFT P95 over a 10 s window exceeds the SLO.
func (r *runner) leadTime(ctx context.Context) error {
	pl := r.plan
	type episode struct {
		cell int
		kind faultKind
		seed uint64
	}
	var eps []episode
	k := 0
	for _, c := range pl.episodeCells {
		for _, kind := range []faultKind{faultThrottle, faultPCIe} {
			for range pl.episodeSeeds {
				eps = append(eps, episode{c, kind, r.seed(StageLeadTime, k)})
				k++
			}
		}
	}
	inject := 20 * time.Second
	crossRR := make([]time.Duration, len(eps))
	for _, p := range stagePolicies(StageLeadTime) {
		var leads []float64
		missed, breaches, crossed := 0, 0, 0
		for ei, ep := range eps {
			if err := ctx.Err(); err != nil {
				return err
			}
			at := inject + time.Duration(ep.seed%1000)*time.Millisecond
			lead := sim.DefaultThrottleLead
			if ep.kind == faultPCIe {
				lead = sim.DefaultPCIeLead
			}
			w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 10, duration: at + pl.leadObserve, seed: ep.seed}
			reqs := w.generate(r.cfg.Profile)
			r.digestOf(StageLeadTime, p, digest(reqs))
			alert, cross := time.Duration(-1), time.Duration(-1)
			res, err := r.trial(p, reqs, []fault{{at: at, kind: ep.kind, cell: ep.cell, value: 1, lead: lead}}, w.duration+drain, ep.seed, nil,
				func(now time.Duration, sc []cellScore) {
					if now < at {
						return
					}
					c := sc[ep.cell]
					if alert < 0 && c.hwAlert {
						alert = now
					}
					if cross < 0 && c.ttftP95 > baselineSLO {
						cross = now
					}
				})
			if err != nil {
				return err
			}
			if p == RR {
				crossRR[ei] = cross
			}
			if cross >= 0 {
				crossed++
			}
			if fleetBreach(res.requests, at, w.duration, baselineSLO) {
				breaches++
			}
			switch {
			case alert < 0:
				missed++
			case crossRR[ei] >= 0:
				leads = append(leads, (crossRR[ei] - alert).Seconds())
			}
		}
		f := Figures{
			"episodes": num(float64(len(eps))), "lead_time_mean_s": num(mean(leads)),
			"lead_time_min_s": nil, "alerts_missed": num(float64(missed)),
			"slo_breaches": num(float64(breaches)), "cell_crossed_slo": num(float64(crossed)),
		}
		if len(leads) > 0 {
			f["lead_time_min_s"] = num(slices.Min(leads))
		}
		r.set(StageLeadTime, p, f)
		r.progress(StageLeadTime, "%s: lead %.1f s (n=%d), breaches %d/%d, missed %d", p, mean(leads), len(leads), breaches, len(eps), missed)
	}
	return nil
}

// fleetBreach reports whether the TTFT P95 of the requests with their
// first token in any 10 s window (1 s steps) within [from, to) exceeded
// slo, or a request failed there.
func fleetBreach(rs []request, from, to, slo time.Duration) bool {
	const win = 10 * time.Second
	for t := from; t+win <= to; t += time.Second {
		var ttft []time.Duration
		for i := range rs {
			q := &rs[i]
			if q.status == statusOK && q.first >= t && q.first < t+win {
				ttft = append(ttft, q.ttft())
			}
		}
		if len(ttft) >= 20 && quantile.Of(ttft, 0.95) > slo {
			return true
		}
	}
	return false
}

// failover kills one engine (SIGKILL: in-flight requests reset, new
// connections refused) under 10 RPS, each cell in turn.
func (r *runner) failover(ctx context.Context) error {
	pl := r.plan
	for _, p := range stagePolicies(StageFailover) {
		var reroutes []time.Duration
		var post []request
		inflightFailed, episodes, never := 0, 0, 0
		k := 0
		for _, c := range pl.episodeCells {
			for range pl.episodeSeeds {
				if err := ctx.Err(); err != nil {
					return err
				}
				seed := r.seed(StageFailover, k)
				k++
				kill := 30*time.Second + time.Duration(seed%1000)*time.Millisecond
				w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 10, duration: kill + 30*time.Second, seed: seed}
				reqs := w.generate(r.cfg.Profile)
				r.digestOf(StageFailover, p, digest(reqs))
				res, err := r.trial(p, reqs, []fault{{at: kill, kind: faultKill, cell: c}}, w.duration+drain, seed, nil, nil)
				if err != nil {
					return err
				}
				episodes++
				if at := res.removedAt[c]; at >= 0 {
					reroutes = append(reroutes, at-kill)
				} else {
					never++
				}
				for _, q := range res.requests {
					switch {
					case q.arrive >= kill:
						post = append(post, q)
					case q.status == statusReset:
						inflightFailed++
					}
				}
				if _, ok := r.timeline[p]; !ok {
					r.timeline[p] = failoverTimeline(res.requests, kill)
				}
			}
		}
		st := summarise(post, func(*request) bool { return true })
		f := Figures{
			"episodes": num(float64(episodes)), "reroute_p50_ms": ms(quantile.Of(reroutes, 0.5)),
			"reroute_p95_ms": ms(quantile.Of(reroutes, 0.95)), "reroute_p99_ms": ms(quantile.Of(reroutes, 0.99)),
			"never_rerouted": num(float64(never)), "post_kill_requests": num(float64(st.n)),
			"post_kill_success": num(st.success), "post_kill_ttft_p95_ms": ms(st.ttftP95),
			"in_flight_failed": num(float64(inflightFailed)),
		}
		if len(reroutes) == 0 {
			f["reroute_p50_ms"], f["reroute_p95_ms"], f["reroute_p99_ms"] = nil, nil, nil
		}
		r.set(StageFailover, p, f)
		r.progress(StageFailover, "%s: reroute P99 %.0f ms, post-kill success %.4f (%d requests)", p,
			float64(quantile.Of(reroutes, 0.99))/1e6, st.success, st.n)
	}
	return nil
}

func failoverTimeline(rs []request, kill time.Duration) []timelineBin {
	const bin = 250 * time.Millisecond
	from, to := kill-5*time.Second, kill+10*time.Second
	bins := make([]timelineBin, int((to-from)/bin))
	for i := range bins {
		bins[i].at = from - kill + time.Duration(i)*bin
	}
	for _, q := range rs {
		if q.arrive < from || q.arrive >= to {
			continue
		}
		b := &bins[int((q.arrive-from)/bin)]
		b.sent++
		if q.status != statusOK {
			b.failed++
		}
		if q.sentToDead {
			b.toDeadAttempts++
		}
	}
	return bins
}

// burst runs adversarial_spike (10 RPS plus 50-request bursts every 30 s).
// The routing reaction is, per burst, the time until the ingress has new
// weights (isobar); the baselines have no routing updates.
func (r *runner) burst(ctx context.Context) error {
	pl := r.plan
	c := class("adversarial_spike")
	seed := r.seed(StageBurst, 0)
	w := workload{mix: []mixPart{{c, 1}}, rps: 10, duration: pl.burstDur, seed: seed}
	reqs := w.generate(r.cfg.Profile)
	for _, p := range stagePolicies(StageBurst) {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.digestOf(StageBurst, p, digest(reqs))
		res, err := r.trial(p, reqs, nil, w.duration+drain, seed, nil, nil)
		if err != nil {
			return err
		}
		bst := summarise(res.requests, func(q *request) bool { return q.burst })
		all := summarise(res.requests, func(*request) bool { return true })
		f := Figures{
			"burst_requests": num(float64(bst.n)), "burst_success": num(bst.success), "burst_ttft_p95_ms": ms(bst.ttftP95),
			"success": num(all.success), "ttft_p95_ms": ms(all.ttftP95),
			"routing_reaction_p95_ms": nil, "sustainable_rps": nil,
		}
		if v, ok := r.spikeRPS[p]; ok {
			f["sustainable_rps"] = num(v)
		}
		if p.isobar() {
			var reactions []time.Duration
			for t := c.BurstEvery; t < w.duration; t += c.BurstEvery {
				i, _ := slices.BinarySearch(res.pushes, t)
				if i < len(res.pushes) && res.pushes[i]-t < c.BurstEvery {
					reactions = append(reactions, res.pushes[i]-t)
				}
			}
			if len(reactions) > 0 {
				f["routing_reaction_p95_ms"] = ms(quantile.Of(reactions, 0.95))
			}
		}
		r.set(StageBurst, p, f)
		r.progress(StageBurst, "%s: burst success %.4f, burst TTFT P95 %.0f ms", p, bst.success, float64(bst.ttftP95)/1e6)
	}
	return nil
}

// mismatch: one cell (the nearest) at max_model_len 1024, the rest at the
// model's full context; 10 RPS of baseline_mixed with 30 % long_context.
func (r *runner) mismatch(ctx context.Context) error {
	pl := r.plan
	n := r.cfg.Topology.Cells()
	mml := make([]int, n)
	mml[0] = 1024
	seed := r.seed(StageMismatch, 0)
	w := workload{mix: []mixPart{{class("baseline_mixed"), 0.7}, {class("long_context"), 0.3}}, rps: 10, duration: pl.mismatchDur, seed: seed}
	reqs := w.generate(r.cfg.Profile)
	long := func(q *request) bool { return q.prompt+q.out > 1024 }
	for _, p := range stagePolicies(StageMismatch) {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.digestOf(StageMismatch, p, digest(reqs))
		res, err := r.trial(p, reqs, nil, w.duration+drain, seed, mml, nil)
		if err != nil {
			return err
		}
		leaked, longN := 0, 0
		for i := range res.requests {
			if q := &res.requests[i]; long(q) {
				longN++
				if q.leaked {
					leaked++
				}
			}
		}
		ls := summarise(res.requests, long)
		ss := summarise(res.requests, func(q *request) bool { return !long(q) })
		all := summarise(res.requests, func(*request) bool { return true })
		f := Figures{
			"long_requests": num(float64(longN)), "leak_rate": num(float64(leaked) / float64(max(longN, 1))),
			"long_prompt_success": num(ls.success), "short_prompt_success": num(ss.success), "success": num(all.success),
			"short_ttft_p95_ms": ms(ss.ttftP95), "long_ttft_p95_ms": ms(ls.ttftP95),
		}
		r.set(StageMismatch, p, f)
		r.progress(StageMismatch, "%s: leak %.4f, long-prompt success %.4f", p, float64(leaked)/float64(max(longN, 1)), ls.success)
	}
	return nil
}

// telemetryFailure kills each cell's DCGM exporter in turn for 30 s
// under 10 RPS. Fallback engages when the scorer runs on the remaining
// signals (score.Result.Fallback) for that cell.
func (r *runner) telemetryFailure(ctx context.Context) error {
	pl := r.plan
	for _, p := range stagePolicies(StageTelemetryFailure) {
		var engage []time.Duration
		var during []request
		episodes := 0
		k := 0
		for _, c := range pl.episodeCells {
			for range pl.episodeSeeds {
				if err := ctx.Err(); err != nil {
					return err
				}
				seed := r.seed(StageTelemetryFailure, k)
				k++
				down := 20*time.Second + time.Duration(seed%1000)*time.Millisecond
				up := down + 30*time.Second
				w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 10, duration: up + 10*time.Second, seed: seed}
				reqs := w.generate(r.cfg.Profile)
				r.digestOf(StageTelemetryFailure, p, digest(reqs))
				res, err := r.trial(p, reqs, []fault{{at: down, kind: faultDCGMDown, cell: c}, {at: up, kind: faultDCGMUp, cell: c}},
					w.duration+drain, seed, nil, nil)
				if err != nil {
					return err
				}
				episodes++
				if at := res.fallbackAt[c]; at >= 0 {
					engage = append(engage, at-down)
				}
				for _, q := range res.requests {
					if q.arrive >= down && q.arrive < up {
						during = append(during, q)
					}
				}
			}
		}
		st := summarise(during, func(*request) bool { return true })
		f := Figures{
			"episodes": num(float64(episodes)), "success_during": num(st.success), "ttft_p95_during_ms": ms(st.ttftP95),
			"fallback_engage_p50_ms": nil, "fallback_engage_max_ms": nil, "heartbeat_ms": ms(r.cfg.DataPlane.Heartbeat),
		}
		if p.isobar() && len(engage) > 0 {
			f["fallback_engage_p50_ms"] = ms(quantile.Of(engage, 0.5))
			f["fallback_engage_max_ms"] = ms(slices.Max(engage))
		}
		r.set(StageTelemetryFailure, p, f)
		r.progress(StageTelemetryFailure, "%s: success during %.4f, fallback engaged %d/%d", p, st.success, len(engage), episodes)
	}
	return nil
}

// network runs five phases in one run: near-idle (2 RPS), symmetric (10),
// saturation (13), 20 ms jitter on the nearest site (10) and recovery
// (10, jitter removed).
func (r *runner) network(ctx context.Context) error {
	pl := r.plan
	phases := []struct {
		name   string
		rps    float64
		jitter time.Duration
	}{
		{"near_idle", 2, 0}, {"symmetric", 10, 0}, {"saturation", 13, 0},
		{"jitter", 10, 20 * time.Millisecond}, {"recovery", 10, 0},
	}
	seed := r.seed(StageNetwork, 0)
	var reqs []request
	var faults []fault
	for i, ph := range phases {
		w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: ph.rps, duration: pl.netPhase, seed: seed + uint64(i)}
		off := time.Duration(i) * pl.netPhase
		for _, q := range w.generate(r.cfg.Profile) {
			q.arrive += off
			reqs = append(reqs, q)
		}
		faults = append(faults, fault{at: off, kind: faultJitter, site: 0, value: float64(ph.jitter)})
	}
	end := time.Duration(len(phases)) * pl.netPhase
	settle := min(10*time.Second, pl.netPhase/4)
	p95 := map[Policy]map[string]time.Duration{}
	for _, p := range stagePolicies(StageNetwork) {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.digestOf(StageNetwork, p, digest(reqs))
		res, err := r.trial(p, reqs, faults, end+drain, seed, nil, nil)
		if err != nil {
			return err
		}
		f := Figures{}
		p95[p] = map[string]time.Duration{}
		for i, ph := range phases {
			off := time.Duration(i) * pl.netPhase
			st := summarise(res.requests, arrivedIn(off+settle, off+pl.netPhase))
			f[ph.name+"_ttft_p95_ms"] = ms(st.ttftP95)
			p95[p][ph.name] = st.ttftP95
		}
		r.set(StageNetwork, p, f)
		r.progress(StageNetwork, "%s: jitter-phase TTFT P95 %.0f ms", p, float64(p95[p]["jitter"])/1e6)
	}
	if g, ok := p95[IsobarGPUOnly]["jitter"]; ok && g > 0 {
		v := 1 - float64(p95[Isobar]["jitter"])/float64(g)
		r.figs[StageNetwork][string(Isobar)]["jitter_p95_reduction_vs_gpu_only"] = num(v)
	}
	if g, ok := p95[RR]["jitter"]; ok && g > 0 {
		v := 1 - float64(p95[Isobar]["jitter"])/float64(g)
		r.figs[StageNetwork][string(Isobar)]["jitter_p95_reduction_vs_rr"] = num(v)
	}
	return nil
}
