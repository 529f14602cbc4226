package paper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/isobar-mesh/isobar/bench/load"
	"github.com/isobar-mesh/isobar/sim"
)

// Report is report.json.
type Report struct {
	Mode Mode `json:"mode"`
	// Seeds are the seeds every stage and policy ran at.
	Seeds       []uint64 `json:"seeds"`
	WallSeconds float64  `json:"wall_seconds"`
	// Method says how the figures were produced.
	Method    string    `json:"method"`
	Topology  Topology  `json:"topology"`
	DataPlane DataPlane `json:"data_plane"`
	// Grounds: ground → its results.
	Grounds map[string]*GroundReport `json:"grounds"`
	// Published: stage → policy → figure → the published system's value.
	Published map[string]map[string]map[string]float64 `json:"published"`
}

// GroundReport is one ground's results over the seeds.
type GroundReport struct {
	Profile sim.Profile `json:"profile"`
	// Stages: stage → policy → figure → median, min and max over seeds.
	Stages map[string]map[string]map[string]Agg `json:"stages"`
	// Targets are evaluated on the medians.
	Targets []Target `json:"targets"`
	// Knee says where rr's sustainable baseline_mixed rate lands against
	// the published 12 RPS, and why.
	Knee string `json:"knee"`
	// RequestDigests: stage → policy → a hash of the requests every trial
	// of the stage ran, over all seeds; equal across policies.
	RequestDigests map[string]map[string]string `json:"request_digests"`
	Charts         []string                     `json:"charts"`
}

// Agg is one figure over the seeds: its median, minimum and maximum (JSON
// null where no seed produced it) and how many seeds did.
type Agg struct {
	Median *float64 `json:"median"`
	Min    *float64 `json:"min"`
	Max    *float64 `json:"max"`
	N      int      `json:"n"`
}

// Target is one of the figures isobar aims at, and where it stands.
type Target struct {
	Stage  string   `json:"stage"`
	Policy string   `json:"policy"`
	Figure string   `json:"figure"`
	Op     string   `json:"op"` // "<=" or ">="
	Value  float64  `json:"value"`
	Got    *float64 `json:"got"`
	Met    bool     `json:"met"`
	What   string   `json:"what"`
	// AllSeeds: the target must hold on every seed, so Got is the worst
	// seed's figure (the minimum for ">=", the maximum for "<="), not the
	// median.
	AllSeeds bool `json:"all_seeds,omitempty"`
}

func aggregate(vals []float64) Agg {
	if len(vals) == 0 {
		return Agg{}
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Agg{Median: num(med), Min: num(s[0]), Max: num(s[len(s)-1]), N: len(s)}
}

// published holds the figures of the published system (docs/design.md §8.3).
func published() map[string]map[string]map[string]float64 {
	return map[string]map[string]map[string]float64{
		StageCalibration: {
			"rr":     {"success": 0.9975, "ttft_p50_ms": 350, "ttft_p95_ms": 650, "ttft_p99_ms": 850, "e2e_p95_ms": 5800},
			"isobar": {"routing_update_p50_ms": 0.2},
		},
		StageSLOThroughput: {
			"rr": {"baseline_mixed_sustainable_rps": 12, "rapid_shift_sustainable_rps": 11, "code_heavy_sustainable_rps": 10,
				"adversarial_spike_sustainable_rps": 17, "multiturn_sustainable_rps": 9, "rag_multidoc_sustainable_rps": 13,
				"long_context_sustainable_rps": 7, "very_long_sustainable_rps": 4},
			"isobar": {"min_vs_rr": 1.56},
		},
		StageLeadTime:         {"isobar": {"lead_time_mean_s": 11.2}},
		StageFailover:         {"rr": {"reroute_p99_ms": 4226}, "isobar": {"reroute_p99_ms": 1247, "post_kill_success": 0.9976}},
		StageBurst:            {"isobar": {"routing_reaction_p95_ms": 482}},
		StageMismatch:         {"rr": {"leak_rate": 0.3211}, "lr": {"leak_rate": 0.2871}, "isobar": {"leak_rate": 0.0043}},
		StageTelemetryFailure: {"isobar": {"success_during": 0.999, "fallback_engage_p50_ms": 824}},
		StageNetwork:          {"isobar": {"jitter_p95_reduction_vs_gpu_only": 0.278}},
		StageHetero: {"rr": {"e2e_p50_ms": 6730, "e2e_p99_ms": 7791},
			"isobar": {"e2e_p50_ms": 5970, "e2e_p99_ms": 7042, "constrained_weight_ratio": 1.0 / 134}},
		StageHomogeneous6: {"rr": {"e2e_p99_ms_at_12rps": 9900}, "lr": {"e2e_p99_ms_at_12rps": 7100},
			"isobar": {"e2e_p99_ms_at_12rps": 7100}},
	}
}

func targets() []Target {
	return []Target{
		{Stage: StageMismatch, Policy: "isobar", Figure: "leak_rate", Op: "<=", Value: 0.002, What: "capability-mismatch leak with the error-rate signal alone ≤ 0.2 %"},
		{Stage: StageMismatch, Policy: "isobar-capability", Figure: "leak_rate", Op: "<=", Value: 0, What: "no leak with capability discovery"},
		{Stage: StageFailover, Policy: "isobar", Figure: "reroute_p99_ms", Op: "<=", Value: 300, What: "failover reroute P99 ≤ 300 ms"},
		{Stage: StageFailover, Policy: "isobar", Figure: "post_kill_success", Op: ">=", Value: 0.999, What: "post-kill success ≥ 99.9 %"},
		{Stage: StageSLOThroughput, Policy: "isobar", Figure: "min_vs_rr", Op: ">=", Value: 1.75, What: "≥ 1.75× rr sustainable RPS at the tier-2 SLO on every class"},
		{Stage: StageNetwork, Policy: "isobar", Figure: "jitter_p95_reduction_vs_gpu_only", Op: ">=", Value: 0.30, What: "≥ 30 % lower P95 TTFT than gpu-only under 20 ms jitter"},
		{Stage: StageTelemetryFailure, Policy: "isobar", Figure: "fallback_engage_max_ms", Op: "<=", Value: 500, What: "fallback engaged within one heartbeat (500 ms)"},
		{Stage: StageTelemetryFailure, Policy: "isobar", Figure: "success_during", Op: ">=", Value: 0.999, What: "≥ 99.9 % success while the DCGM exporter is down"},
		{Stage: StageLeadTime, Policy: "isobar", Figure: "lead_time_mean_s", Op: ">=", Value: 11, What: "average hardware lead time ≥ 11 s"},
		{Stage: StageLeadTime, Policy: "isobar", Figure: "slo_breaches", Op: "<=", Value: 0, What: "zero SLO breaches under hardware stress"},
		{Stage: StageOverloadPriority, Policy: "isobar", Figure: "critical_success", Op: ">=", Value: 0.999, AllSeeds: true, What: "at 150 % load: critical success ≥ 99.9 % (worst seed)"},
		{Stage: StageOverloadPriority, Policy: "isobar", Figure: "critical_ttft_p95_ms", Op: "<=", Value: ms1(class("baseline_mixed").SLO), AllSeeds: true, What: "at 150 % load: critical TTFT P95 within the class SLO (worst seed)"},
		{Stage: StageOverloadPriority, Policy: "isobar", Figure: "standard_success", Op: ">=", Value: 0.99, AllSeeds: true, What: "at 150 % load: standard success ≥ 99 %, sheddable absorbing the shortfall (worst seed)"},
		{Stage: StageOverloadPriority, Policy: "isobar", Figure: "quiet_tenant_success_reduction_vs_no_overload", Op: "<=", Value: 0.01, AllSeeds: true, What: "at 150 % load: the quiet tenant's success within 1 point of its no-overload figure (worst seed)"},
		{Stage: StageOverloadPriority, Policy: "isobar", Figure: "goodput_reduction_vs_nocrit", Op: "<=", Value: 0, AllSeeds: true, What: "at 150 % load: goodput (share answered within the SLO) ≥ isobar without criticality's (worst seed)"},
		{Stage: StageRetryStorm, Policy: "isobar", Figure: "attempts_per_request", Op: "<=", Value: 1.1, AllSeeds: true, What: "brownout at 90 % load: ≤ 1.1 attempts per request with the dynamic retry budget (worst seed)"},
		{Stage: StageRetryStorm, Policy: "isobar", Figure: "success_vs_static", Op: ">=", Value: 1, AllSeeds: true, What: "brownout at 90 % load: success with the dynamic budget no worse than the static budget's (worst seed)"},
	}
}

// ms1 is d in milliseconds.
func ms1(d time.Duration) float64 { return float64(d) / 1e6 }

const method = `Virtual-time simulation of the published flat topology (one ingress, 9 cells in 3 sites at 2/12/20 ms one way), ` +
	`on two grounds: physics (sim.PhysicsProfile rtx-pro-6000 + llama-3.1-70b-awq: vLLM V1 scheduling at vLLM's defaults, KV capacity ` +
	`from memory, roofline step times with efficiencies fitted on single-engine load curves only) and paper-fit (the frozen ` +
	`70b-awq-flat profile). Every stage and policy runs at each seed; figures are the median and min–max over seeds. ` +
	`Request i's draws (arrival gap, class, lengths, frontend latency, Envoy worker, network delay and jitter, load-balancer ` +
	`choices) come from sources keyed by (seed, i), so every policy sees the same draws. The ingress models Envoy's worker ` +
	`threads (own round-robin index and EDF schedule per worker, requests in flight shared; gateway/lb follows ` +
	`round_robin_lb.h, least_request_lb.cc and edf_scheduler.h). rr and lr get active health checks (2 s, unhealthy after 2) ` +
	`and the same retries (connect failure, reset before the first byte; one retry; retry budget 20 %, min 3) and outlier ` +
	`detection (eject on one local-origin failure, 10 s × times ejected, at most 50 %) as isobar's cluster; rr-plain (failover ` +
	`stage) has health checks only, as the published baseline. Isobar policies: the real regional/score and regional/projection ` +
	`every 500 ms heartbeat; isobar's ingress picks as isobar gateway --lb isobar does (gateway/placement: least expected ` +
	`TTFT from its own pending prompt tokens per cell less the oldest one's progress, the cell's prefill rate, RTT and jitter, ` +
	`the wait for a batch slot and 1 ms per request in flight; probe budgets counted; a refusal as too long remembered; ` +
	`declared max_model_len honoured where declared); isobar-envoy feeds isobar's ` +
	`weights to Envoy's LEAST_REQUEST. The oracle sends each request where its predicted TTFT, from the true state of every engine and the ` +
	`network, is lowest.`

// Run runs the stages on each ground at every seed and writes
// report.json, report.md and the charts into dir (created if needed).
// The (ground, seed) jobs run in parallel, up to opt.Parallel at once.
func Run(ctx context.Context, grounds []Config, opt Options, dir string) (*Report, error) {
	pl, stages, err := checkRun(grounds, &opt, dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("paper: output directory: %w", err)
	}
	start := time.Now()
	rep := &Report{Mode: opt.Mode, Method: method, Topology: grounds[0].Topology, DataPlane: grounds[0].DataPlane,
		Grounds: map[string]*GroundReport{}, Published: published()}
	for k := range pl.seeds {
		rep.Seeds = append(rep.Seeds, opt.Seed+uint64(k))
	}
	jobs, err := runJobs(ctx, grounds, opt, pl, rep.Seeds, stages)
	if err != nil {
		return nil, err
	}
	for gi, cfg := range grounds {
		gr, err := groundReport(dir, cfg, jobs[gi])
		if err != nil {
			return nil, err
		}
		rep.Grounds[cfg.Ground] = gr
	}
	rep.WallSeconds = time.Since(start).Seconds()
	if err := writeJSON(filepath.Join(dir, "report.json"), rep); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(Markdown(rep)), 0o644); err != nil {
		return nil, fmt.Errorf("paper: %w", err)
	}
	return rep, nil
}

// checkRun validates Run's arguments, defaults opt's mode and returns the
// plan and the stages to run.
func checkRun(grounds []Config, opt *Options, dir string) (plan, []string, error) {
	if len(grounds) == 0 {
		return plan{}, nil, fmt.Errorf("%w: no ground to run", ErrInvalidConfig)
	}
	seen := map[string]bool{}
	for _, g := range grounds {
		if err := g.Validate(); err != nil {
			return plan{}, nil, err
		}
		if seen[g.Ground] {
			return plan{}, nil, fmt.Errorf("%w: ground %q given twice", ErrInvalidConfig, g.Ground)
		}
		seen[g.Ground] = true
	}
	if opt.Mode == "" {
		opt.Mode = Quick
	}
	pl, err := planFor(opt.Mode, grounds[0].Topology.Cells())
	if err != nil {
		return plan{}, nil, err
	}
	if opt.Seeds < 0 {
		return plan{}, nil, fmt.Errorf("paper: %d seeds: want at least 1", opt.Seeds)
	}
	if opt.Seeds > 0 {
		pl.seeds = opt.Seeds
	}
	stages := opt.Stages
	if len(stages) == 0 {
		stages = Stages()
	}
	for _, s := range stages {
		if !slices.Contains(Stages(), s) {
			return plan{}, nil, fmt.Errorf("paper: unknown stage %q: want one of %s", s, strings.Join(Stages(), ", "))
		}
	}
	for _, c := range opt.Classes {
		if _, err := load.LookupClass(c); err != nil {
			return plan{}, nil, fmt.Errorf("paper: %w", err)
		}
	}
	if dir == "" {
		return plan{}, nil, errors.New("paper: an output directory is required")
	}
	return pl, stages, nil
}

// runJobs runs the stages for every ground and seed, opt.Parallel jobs
// at a time, and returns the jobs by ground and seed.
func runJobs(ctx context.Context, grounds []Config, opt Options, pl plan, seeds []uint64, stages []string) ([][]*runner, error) {
	jobs := make([][]*runner, len(grounds))
	g, gctx := errgroup.WithContext(ctx)
	par := opt.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	g.SetLimit(par)
	for gi, cfg := range grounds {
		jobs[gi] = make([]*runner, pl.seeds)
		for k, seed := range seeds {
			r := &runner{cfg: cfg, opt: opt, plan: pl, seed0: seed,
				figs: map[string]map[string]Figures{}, digests: map[string]map[string]string{},
				calibTTFT: map[Policy][]time.Duration{}, timeline: map[Policy][]timelineBin{}, spikeRPS: map[Policy]float64{},
				sloRate: map[Policy]map[string]float64{},
			}
			jobs[gi][k] = r
			g.Go(func() error { return r.runStages(gctx, stages) })
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return jobs, nil
}

// groundReport aggregates one ground's jobs (one per seed) over the
// seeds, evaluates the targets and writes the ground's charts into dir.
func groundReport(dir string, cfg Config, jobs []*runner) (*GroundReport, error) {
	gr := &GroundReport{Profile: cfg.Profile, Stages: map[string]map[string]map[string]Agg{},
		RequestDigests: map[string]map[string]string{}}
	per := map[string]map[string]map[string][]float64{}
	for _, r := range jobs {
		collectFigures(per, r.figs)
		for st, pols := range r.digests {
			if gr.RequestDigests[st] == nil {
				gr.RequestDigests[st] = map[string]string{}
			}
			for pol, d := range pols {
				gr.RequestDigests[st][pol] = digestCombine(gr.RequestDigests[st][pol], d)
			}
		}
	}
	medians := map[string]map[string]Figures{}
	for st, pols := range per {
		gr.Stages[st] = map[string]map[string]Agg{}
		medians[st] = map[string]Figures{}
		for pol, figs := range pols {
			gr.Stages[st][pol] = map[string]Agg{}
			medians[st][pol] = Figures{}
			for k, vals := range figs {
				a := aggregate(vals)
				gr.Stages[st][pol][k] = a
				medians[st][pol][k] = a.Median
			}
		}
	}
	gr.Targets = evaluate(medians, gr.Stages)
	gr.Knee = knee(cfg, gr.Stages)
	charts, err := writeCharts(dir, jobs[0], medians[StageSLOThroughput])
	if err != nil {
		return nil, err
	}
	gr.Charts = charts
	return gr, nil
}

// collectFigures appends one job's figures (stage → policy → figure) to
// per's values (stage → policy → figure → one value per job that has it).
func collectFigures(per map[string]map[string]map[string][]float64, figs map[string]map[string]Figures) {
	for st, pols := range figs {
		if per[st] == nil {
			per[st] = map[string]map[string][]float64{}
		}
		for pol, figs := range pols {
			if per[st][pol] == nil {
				per[st][pol] = map[string][]float64{}
			}
			for k, v := range figs {
				vals := per[st][pol][k]
				if v != nil {
					vals = append(vals, *v)
				}
				per[st][pol][k] = vals
			}
		}
	}
}

// runStages runs the given stages, in run order, at this job's seed.
func (r *runner) runStages(ctx context.Context, stages []string) error {
	run := map[string]func(context.Context) error{
		StageCalibration: r.calibration, StageSLOThroughput: r.sloThroughput, StageLeadTime: r.leadTime,
		StageFailover: r.failover, StageBurst: r.burst, StageMismatch: r.mismatch,
		StageTelemetryFailure: r.telemetryFailure, StageNetwork: r.network,
		StageHetero: r.hetero, StageHomogeneous6: r.homogeneous6, StageThrottled: r.throttled,
		StagePrefix: r.prefixAffinity, StageOverloadPriority: r.overloadPriority, StageRetryStorm: r.retryStorm,
	}
	for _, s := range Stages() {
		if !slices.Contains(stages, s) {
			continue
		}
		t := time.Now()
		if err := run[s](ctx); err != nil {
			return fmt.Errorf("paper: %s seed %d: stage %s: %w", r.cfg.Ground, r.seed0, s, err)
		}
		r.progress(s, "done in %.1f s", time.Since(t).Seconds())
	}
	return nil
}

// publishedKnee is the published rr sustainable rate of baseline_mixed.
const publishedKnee = 12.0

// knee says where rr's baseline_mixed knee lands on a ground, and why.
func knee(cfg Config, st map[string]map[string]map[string]Agg) string {
	a, ok := st[StageSLOThroughput]["rr"]["baseline_mixed_sustainable_rps"]
	if !ok || a.Median == nil {
		return "baseline_mixed was not bisected in this run."
	}
	why := ""
	switch cfg.Ground {
	case GroundPhysics:
		why = fmt.Sprintf("On the physics engine nothing was fitted to routing results: the knee is where the prefill of "+
			"%d-token prompts at the GPU's roofline collides on an engine often enough to push P95 TTFT past 1.5 s. "+
			"vLLM's defaults (max_num_seqs %d, max_num_batched_tokens %d, a KV cache of %d tokens) never cap the batch "+
			"at this load, so the published deployment must have run slower hardware, other vLLM settings, or "+
			"counted TTFT differently; the gap is reported, not fitted away.",
			512, cfg.Profile.MaxNumSeqs, cfg.Profile.MaxBatchedTokens, cfg.Profile.KVCacheTokens)
	case GroundPaperFit:
		why = "70b-awq-flat was fitted once to the published rr rows (running batch 9), so its knee sits near the " +
			"published one by construction; its batch cap, not the GPU, sets the knee."
	}
	return fmt.Sprintf("rr sustains %s RPS on baseline_mixed (median; min–max %s–%s over %d seeds) against the published %.0f RPS (%s). %s",
		fmtFig(a.Median), fmtFig(a.Min), fmtFig(a.Max), a.N, publishedKnee, pct(*a.Median/publishedKnee-1), why)
}

func pct(x float64) string { return fmt.Sprintf("%+.0f %%", 100*x) }

// evaluate sets each target's figure (the median, or the worst seed's
// for an AllSeeds target, from aggs) and whether it is met.
func evaluate(st map[string]map[string]Figures, aggs map[string]map[string]map[string]Agg) []Target {
	var out []Target
	for _, t := range targets() {
		f, ok := st[t.Stage][t.Policy]
		if !ok {
			continue
		}
		t.Got = f[t.Figure]
		if a := aggs[t.Stage][t.Policy][t.Figure]; t.AllSeeds {
			t.Got = a.Min
			if t.Op == "<=" {
				t.Got = a.Max
			}
		}
		if t.Got != nil {
			if t.Op == "<=" {
				t.Met = *t.Got <= t.Value
			} else {
				t.Met = *t.Got >= t.Value
			}
		}
		out = append(out, t)
	}
	return out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("paper: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("paper: %w", err)
	}
	return os.Rename(tmp, path)
}

func fmtFig(v *float64) string {
	if v == nil {
		return "—"
	}
	x := *v
	switch {
	case x == math.Trunc(x) && math.Abs(x) < 1e7:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 1:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.4f", x)
	}
}

var stageTitles = map[string]string{
	StageCalibration:      "Calibration — baseline_mixed, 10 RPS",
	StageSLOThroughput:    "SLO throughput — highest RPS at which 95 % of requests are answered within the tier-2 TTFT SLO (a failure counts as a miss; bisection)",
	StageLeadTime:         "Hardware-telemetry lead time — thermal throttling and PCIe contention on each cell in turn, 10 RPS",
	StageFailover:         "Failover — SIGKILL one engine under 10 RPS, each cell in turn",
	StageBurst:            "Burst — adversarial_spike (10 RPS + 50-request bursts every 30 s)",
	StageMismatch:         "Capability mismatch — nearest cell at max_model_len 1024; 10 RPS, 30 % long_context",
	StageTelemetryFailure: "Telemetry failure — each cell's DCGM exporter down for 30 s, 10 RPS",
	StageNetwork:          "Network-aware placement — P95 TTFT (ms) per phase; 20 ms jitter on the nearest site",
	StageHetero:           "Heterogeneous fleet — 2×h200-sxm, 2×h100-sxm, 2×h100-sxm at max_model_len 1024; baseline_mixed at 12 RPS; E2E over every request, a failure counting as a miss (— where the percentile is a failed request), and over answered ones (_served) (physics grounds only)",
	StageHomogeneous6:     "Homogeneous fleet — 6×h100-sxm; baseline_mixed at 12 and 20 RPS (physics grounds only)",
	StageThrottled:        "Throttled GPUs — one cell per site at half clock; sustainable baseline_mixed RPS",
	StageOverloadPriority: "Overload priority — baseline_mixed at 150 % of the fleet's capacity (the oracle's sustainable baseline_mixed rate at this seed), 20 % critical / 50 % standard / 30 % sheddable, a loud tenant sending 5× the quiet one; success, TTFT P95 (answered requests) and goodput (share answered within the SLO) in all, by criticality and by tenant; the quiet tenant's success at 75 % of capacity for comparison",
	StageRetryStorm:       "Retry storm — baseline_mixed at 90 % of the fleet's capacity; from the end of the warm-up the nearest site's engines answer 503 to 30 % of requests; attempts per request, success and the retry budget (static 20 % for rr, lr and isobar-static-budget; isobar: regional/xds RetryBudgetAt of demand over capacity)",
	StagePrefix:           "Prefix-cache affinity — every engine with vLLM's automatic prefix caching; sustainable RPS per class (bisection, as SLO throughput), the engines' prefix-cache hit rate (tokens) at that rate, and on rag_multidoc at 75 % of isobar-affinity's sustainable rate the busiest cell's requests over the mean, TTFT P99 and success (pile-up)",
}

// Markdown renders the report: per ground, each stage's table (median
// and min–max over seeds, each policy a row, the published figures in
// rows of their own), the SLO-throughput table with each policy against
// rr, lr and the oracle, the win/loss verdicts, and the targets.
func Markdown(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# isobar bench paper — %s run\n\n", rep.Mode)
	fmt.Fprintf(&b, "%s\n\nSeeds %v, %.0f s wall time. Figures are `median [min–max]` over the seeds. "+
		"Published figures are the closest published system's (docs/design.md §8).\n\n", rep.Method, rep.Seeds, rep.WallSeconds)
	for _, gname := range groundOrder(rep.Grounds) {
		gr := rep.Grounds[gname]
		fmt.Fprintf(&b, "# Ground `%s` — profile `%s`\n\n%s\n\n", gname, gr.Profile.Name, gr.Knee)
		for _, s := range Stages() {
			pols, ok := gr.Stages[s]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "## %s (%s)\n\n", stageTitles[s], gname)
			if s == StageSLOThroughput {
				sloTable(&b, pols, rep.Published[s], len(rep.Seeds))
				continue
			}
			var figs []string
			for _, f := range pols {
				for k := range f {
					if !slices.Contains(figs, k) {
						figs = append(figs, k)
					}
				}
			}
			slices.Sort(figs)
			fmt.Fprintf(&b, "| policy | %s |\n|---|%s\n", strings.Join(figs, " | "), strings.Repeat("---|", len(figs)))
			names := policyOrder(pols)
			for _, p := range names {
				row := make([]string, len(figs))
				for i, k := range figs {
					row[i] = fmtAgg(pols[p][k])
				}
				fmt.Fprintf(&b, "| %s | %s |\n", p, strings.Join(row, " | "))
			}
			for _, p := range names {
				pub, ok := rep.Published[s][p]
				if !ok {
					continue
				}
				row := make([]string, len(figs))
				for i, k := range figs {
					if v, ok := pub[k]; ok {
						row[i] = fmtFig(&v)
					}
				}
				fmt.Fprintf(&b, "| *published %s* | %s |\n", p, strings.Join(row, " | "))
			}
			b.WriteString("\n")
		}
		if len(gr.Targets) > 0 {
			fmt.Fprintf(&b, "## Targets (%s, on the medians)\n\n| target | policy | figure | got | met |\n|---|---|---|---|---|\n", gname)
			for _, t := range gr.Targets {
				met := "no"
				if t.Met {
					met = "yes"
				}
				fmt.Fprintf(&b, "| %s | %s | %s %s %s | %s | %s |\n", t.What, t.Policy, t.Figure, t.Op, fmtFig(&t.Value), fmtFig(t.Got), met)
			}
			b.WriteString("\n")
		}
		for _, c := range gr.Charts {
			fmt.Fprintf(&b, "![%s](%s)\n\n", c, c)
		}
	}
	return b.String()
}

func groundOrder(g map[string]*GroundReport) []string {
	var out []string
	for _, n := range []string{GroundPhysics, GroundPaperFit} {
		if _, ok := g[n]; ok {
			out = append(out, n)
		}
	}
	var rest []string
	for n := range g {
		if !slices.Contains(out, n) {
			rest = append(rest, n)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

// fmtAgg writes "median [min–max]", or the median alone when the seeds
// agree.
func fmtAgg(a Agg) string {
	if a.Median == nil {
		return "—"
	}
	if a.Min == nil || a.Max == nil || *a.Min == *a.Max {
		return fmtFig(a.Median)
	}
	return fmt.Sprintf("%s [%s–%s]", fmtFig(a.Median), fmtFig(a.Min), fmtFig(a.Max))
}

func policyOrder[V any](pols map[string]V) []string {
	var out []string
	for _, p := range Policies() {
		if _, ok := pols[string(p)]; ok {
			out = append(out, string(p))
		}
	}
	return out
}

// verdict compares a policy with a baseline over the seeds from the
// per-seed ratios: a win or a loss only when every one of the seeds has a
// ratio and they all agree.
func verdict(a Agg, seeds int) string {
	switch {
	case a.Min == nil || a.Max == nil:
		return "—"
	case a.N < seeds:
		return "undecided"
	case *a.Min > 1:
		return "win"
	case *a.Max < 1:
		return "loss"
	default:
		return "mixed"
	}
}

func sloTable(b *strings.Builder, pols map[string]map[string]Agg, pub map[string]map[string]float64, seeds int) {
	names := policyOrder(pols)
	fmt.Fprintf(b, "Sustainable RPS, `median [min–max]` over seeds; the fraction of the oracle is the median of the per-seed ratios.\n\n")
	fmt.Fprintf(b, "The idle floor is the TTFT of the class's P95 prompt on an idle engine of the nearest site (network, frontend, prefill): where it exceeds the SLO no router can meet it at any rate.\n\n")
	fmt.Fprintf(b, "| class | SLO | idle floor | %s | published rr |\n|---|---|---|%s---|\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)))
	for _, c := range load.Classes() {
		k := c.Name + "_sustainable_rps"
		if _, ok := pols["rr"][k]; !ok {
			continue
		}
		row := make([]string, len(names))
		for i, p := range names {
			row[i] = fmtAgg(pols[p][k])
			if p != string(Oracle) {
				if f := pols[p][c.Name+"_oracle_fraction"]; f.Median != nil {
					row[i] += fmt.Sprintf(" (%.2f×o)", *f.Median)
				}
			}
		}
		pr := ""
		if v, ok := pub["rr"][k]; ok {
			pr = fmtFig(&v)
		}
		fmt.Fprintf(b, "| %s | %v | %s ms | %s | %s |\n", c.Name, c.SLO, fmtAgg(pols["rr"][c.Name+"_ttft_floor_ms"]), strings.Join(row, " | "), pr)
	}
	b.WriteString("\nVerdicts per class (win/loss only when every seed has a ratio and all agree; a ratio needs the baseline above 0 RPS):\n\n| class | isobar vs rr | isobar vs lr | lr vs rr |\n|---|---|---|---|\n")
	for _, c := range load.Classes() {
		if _, ok := pols["rr"][c.Name+"_sustainable_rps"]; !ok {
			continue
		}
		iso, lrp := pols[string(Isobar)], pols[string(LR)]
		fmt.Fprintf(b, "| %s | %s %s | %s %s | %s %s |\n", c.Name,
			verdict(iso[c.Name+"_vs_rr"], seeds), fmtAgg(iso[c.Name+"_vs_rr"]),
			verdict(iso[c.Name+"_vs_lr"], seeds), fmtAgg(iso[c.Name+"_vs_lr"]),
			verdict(lrp[c.Name+"_vs_rr"], seeds), fmtAgg(lrp[c.Name+"_vs_rr"]))
	}
	fmt.Fprintf(b, "\nMinimum isobar / rr over the classes: %s (published isobar: 1.56–1.75×); isobar's minimum fraction of the oracle: %s.\n\n",
		fmtAgg(pols[string(Isobar)]["min_vs_rr"]), fmtAgg(pols[string(Isobar)]["min_oracle_fraction"]))
}
