package paper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/bench/load"
	"github.com/isobar-mesh/isobar/sim"
)

// Report is report.json.
type Report struct {
	Mode        Mode    `json:"mode"`
	Seed        uint64  `json:"seed"`
	WallSeconds float64 `json:"wall_seconds"`
	// Method says how the figures were produced.
	Method    string      `json:"method"`
	Profile   sim.Profile `json:"profile"`
	Topology  Topology    `json:"topology"`
	DataPlane DataPlane   `json:"data_plane"`
	// Stages: stage → policy → figures.
	Stages map[string]map[string]Figures `json:"stages"`
	// Published: stage → policy → figure → the published system's value.
	Published map[string]map[string]map[string]float64 `json:"published"`
	Targets   []Target                                 `json:"targets"`
	// RequestDigests: stage → policy → a hash of the requests every
	// trial of the stage ran; equal across policies.
	RequestDigests map[string]map[string]string `json:"request_digests"`
	Charts         []string                     `json:"charts"`
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
}

// published holds the figures of the published system (DESIGN §1, §8).
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
			"isobar": {"min_speedup_vs_rr": 1.56},
		},
		StageLeadTime:         {"isobar": {"lead_time_mean_s": 11.2}},
		StageFailover:         {"rr": {"reroute_p99_ms": 4226}, "isobar": {"reroute_p99_ms": 1247, "post_kill_success": 0.9976}},
		StageBurst:            {"isobar": {"routing_reaction_p95_ms": 482}},
		StageMismatch:         {"rr": {"leak_rate": 0.3211}, "lr": {"leak_rate": 0.2871}, "isobar": {"leak_rate": 0.0043}},
		StageTelemetryFailure: {"isobar": {"success_during": 0.999, "fallback_engage_p50_ms": 824}},
		StageNetwork:          {"isobar": {"jitter_p95_reduction_vs_gpu_only": 0.278}},
	}
}

func targets() []Target {
	return []Target{
		{Stage: StageMismatch, Policy: "isobar", Figure: "leak_rate", Op: "<=", Value: 0.002, What: "capability-mismatch leak with the error-rate signal alone ≤ 0.2 %"},
		{Stage: StageMismatch, Policy: "isobar-capability", Figure: "leak_rate", Op: "<=", Value: 0, What: "no leak with capability discovery"},
		{Stage: StageFailover, Policy: "isobar", Figure: "reroute_p99_ms", Op: "<=", Value: 300, What: "failover reroute P99 ≤ 300 ms"},
		{Stage: StageFailover, Policy: "isobar", Figure: "post_kill_success", Op: ">=", Value: 0.999, What: "post-kill success ≥ 99.9 %"},
		{Stage: StageSLOThroughput, Policy: "isobar", Figure: "min_speedup_vs_rr", Op: ">=", Value: 1.75, What: "≥ 1.75× rr sustainable RPS at the tier-2 SLO on every class"},
		{Stage: StageNetwork, Policy: "isobar", Figure: "jitter_p95_reduction_vs_gpu_only", Op: ">=", Value: 0.30, What: "≥ 30 % lower P95 TTFT than gpu-only under 20 ms jitter"},
		{Stage: StageTelemetryFailure, Policy: "isobar", Figure: "fallback_engage_max_ms", Op: "<=", Value: 500, What: "fallback engaged within one heartbeat (500 ms)"},
		{Stage: StageTelemetryFailure, Policy: "isobar", Figure: "success_during", Op: ">=", Value: 0.999, What: "≥ 99.9 % success while the DCGM exporter is down"},
		{Stage: StageLeadTime, Policy: "isobar", Figure: "lead_time_mean_s", Op: ">=", Value: 11, What: "average hardware lead time ≥ 11 s"},
		{Stage: StageLeadTime, Policy: "isobar", Figure: "slo_breaches", Op: "<=", Value: 0, What: "zero SLO breaches under hardware stress"},
	}
}

const method = `Virtual-time simulation of the published flat topology (one ingress, 9 cells in 3 sites at 2/12/20 ms one way). ` +
	`Engines: sim.Batcher with the frozen 70b-awq-flat profile (sim.Profile70BFlat, calibrated once on rr only) and sim.GPU. Isobar policies: the real regional/score and ` +
	`regional/projection every 500 ms heartbeat, the ingress following the pushed cluster (weighted least-request, ` +
	`retry on connect failure, ejection on one local-origin failure). Baselines: Envoy ROUND_ROBIN / LEAST_REQUEST ` +
	`with active health checks (2 s, unhealthy after 2). Same requests (arrivals, shapes, frontend latencies) for every policy.`

// Run runs the stages and writes report.json, report.md and the charts
// into dir (created if needed).
func Run(ctx context.Context, cfg Config, opt Options, dir string) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opt.Mode == "" {
		opt.Mode = Quick
	}
	pl, err := planFor(opt.Mode, cfg.Topology.Cells())
	if err != nil {
		return nil, err
	}
	stages := opt.Stages
	if len(stages) == 0 {
		stages = Stages()
	}
	for _, s := range stages {
		if !slices.Contains(Stages(), s) {
			return nil, fmt.Errorf("paper: unknown stage %q: want one of %s", s, strings.Join(Stages(), ", "))
		}
	}
	if dir == "" {
		return nil, errors.New("paper: an output directory is required")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("paper: output directory: %w", err)
	}
	start := time.Now()
	r := &runner{cfg: cfg, opt: opt, plan: pl,
		rep: &Report{Mode: opt.Mode, Seed: opt.Seed, Method: method, Profile: cfg.Profile, Topology: cfg.Topology,
			DataPlane: cfg.DataPlane, Stages: map[string]map[string]Figures{}, Published: published(),
			RequestDigests: map[string]map[string]string{}},
		calibTTFT: map[Policy][]time.Duration{}, timeline: map[Policy][]timelineBin{}, spikeRPS: map[Policy]float64{},
	}
	run := map[string]func(context.Context) error{
		StageCalibration: r.calibration, StageSLOThroughput: r.sloThroughput, StageLeadTime: r.leadTime,
		StageFailover: r.failover, StageBurst: r.burst, StageMismatch: r.mismatch,
		StageTelemetryFailure: r.telemetryFailure, StageNetwork: r.network,
	}
	for _, s := range Stages() {
		if !slices.Contains(stages, s) {
			continue
		}
		t := time.Now()
		if err := run[s](ctx); err != nil {
			return nil, fmt.Errorf("paper: stage %s: %w", s, err)
		}
		r.progress(s, "done in %.1f s", time.Since(t).Seconds())
	}
	r.rep.Targets = evaluate(r.rep.Stages)
	charts, err := writeCharts(dir, r)
	if err != nil {
		return nil, err
	}
	r.rep.Charts = charts
	r.rep.WallSeconds = time.Since(start).Seconds()
	if err := writeJSON(filepath.Join(dir, "report.json"), r.rep); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(Markdown(r.rep)), 0o644); err != nil {
		return nil, fmt.Errorf("paper: %w", err)
	}
	return r.rep, nil
}

func evaluate(st map[string]map[string]Figures) []Target {
	var out []Target
	for _, t := range targets() {
		f, ok := st[t.Stage][t.Policy]
		if !ok {
			continue
		}
		t.Got = f[t.Figure]
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
	StageSLOThroughput:    "SLO throughput — highest RPS with P95 TTFT ≤ tier-2 SLO and success ≥ 0.95 (bisection)",
	StageLeadTime:         "Hardware-telemetry lead time — thermal throttling and PCIe contention on each cell in turn, 10 RPS",
	StageFailover:         "Failover — SIGKILL one engine under 10 RPS, each cell in turn",
	StageBurst:            "Burst — adversarial_spike (10 RPS + 50-request bursts every 30 s)",
	StageMismatch:         "Capability mismatch — nearest cell at max_model_len 1024; 10 RPS, 30 % long_context",
	StageTelemetryFailure: "Telemetry failure — each cell's DCGM exporter down for 30 s, 10 RPS",
	StageNetwork:          "Network-aware placement — P95 TTFT (ms) per phase; 20 ms jitter on the nearest site",
}

// Markdown renders the report's tables, each policy a row and the
// published figures in rows of their own.
func Markdown(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# isobar bench paper — %s run\n\n", rep.Mode)
	fmt.Fprintf(&b, "%s\n\nProfile `%s` (frozen), seed %d, %.0f s wall time. Published figures are the closest published system's (DESIGN §1).\n\n",
		rep.Method, rep.Profile.Name, rep.Seed, rep.WallSeconds)
	for _, s := range Stages() {
		pols, ok := rep.Stages[s]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n", stageTitles[s])
		if s == StageSLOThroughput {
			sloTable(&b, pols, rep.Published[s])
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
				row[i] = fmtFig(pols[p][k])
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
				row[i] = ""
				if v, ok := pub[k]; ok {
					row[i] = fmtFig(&v)
				}
			}
			fmt.Fprintf(&b, "| *published %s* | %s |\n", p, strings.Join(row, " | "))
		}
		b.WriteString("\n")
	}
	if len(rep.Targets) > 0 {
		b.WriteString("## Targets\n\n| target | policy | figure | got | met |\n|---|---|---|---|---|\n")
		for _, t := range rep.Targets {
			met := "no"
			if t.Met {
				met = "yes"
			}
			fmt.Fprintf(&b, "| %s | %s | %s %s %s | %s | %s |\n", t.What, t.Policy, t.Figure, t.Op, fmtFig(&t.Value), fmtFig(t.Got), met)
		}
		b.WriteString("\n")
	}
	for _, c := range rep.Charts {
		fmt.Fprintf(&b, "![%s](%s)\n\n", c, c)
	}
	return b.String()
}

func policyOrder(pols map[string]Figures) []string {
	var out []string
	for _, p := range Policies() {
		if _, ok := pols[string(p)]; ok {
			out = append(out, string(p))
		}
	}
	return out
}

func sloTable(b *strings.Builder, pols map[string]Figures, pub map[string]map[string]float64) {
	names := policyOrder(pols)
	fmt.Fprintf(b, "| class | SLO | %s | isobar / rr | published rr |\n|---|---|%s---|---|\n",
		strings.Join(names, " | "), strings.Repeat("---|", len(names)))
	for _, c := range load.Classes() {
		k := c.Name + "_sustainable_rps"
		if _, ok := pols["rr"][k]; !ok {
			continue
		}
		row := make([]string, len(names))
		for i, p := range names {
			row[i] = fmtFig(pols[p][k])
		}
		pr := ""
		if v, ok := pub["rr"][k]; ok {
			pr = fmtFig(&v)
		}
		fmt.Fprintf(b, "| %s | %v | %s | %s | %s |\n", c.Name, c.SLO, strings.Join(row, " | "), fmtFig(pols["isobar"][c.Name+"_speedup_vs_rr"]), pr)
	}
	fmt.Fprintf(b, "\nMinimum isobar / rr over the classes: %s (published isobar: 1.56–1.75×).\n\n", fmtFig(pols["isobar"]["min_speedup_vs_rr"]))
}
