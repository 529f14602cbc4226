package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/bench/paper"
	"github.com/isobar-mesh/isobar/gateway/placement"
)

type benchPaperFlags struct {
	out          string
	quick        bool
	smoke        bool
	seed         uint64
	seeds        int
	grounds      string
	stages       string
	classes      string
	affinityBand float64
	parallel     int
	quiet        bool
	// decodeCost: isobar's pick's cost per request in flight (0: default).
	decodeCost time.Duration
	// maxInflight: isobar gateway's per-endpoint in-flight cap in the
	// overload stage.
	maxInflight int
}

func newBenchPaperCmd(ro *rootOpts) *cobra.Command {
	var f benchPaperFlags
	cmd := &cobra.Command{
		Use:   "paper --out DIR [--quick]",
		Short: "Run the published evaluation for rr, lr, isobar and the oracle on the same requests, on two grounds, at several seeds",
		Long: `paper runs every stage of the published evaluation of multi-site LLM
routing for Envoy round-robin (rr, and rr-plain in the failover stage),
Envoy least-request (lr), isobar and an oracle, on the same requests, at
several seeds and on two grounds, and writes DIR/report.json, DIR/report.md
(the tables as "median [min–max]" over seeds, each policy against rr, lr and
the oracle, the published figures beside ours, the targets) and PNG charts.

Grounds: physics (rtx-pro-6000 + llama-3.1-70b-awq on the physics engine:
vLLM V1 scheduling at vLLM's defaults, KV capacity from memory, roofline step
times with efficiencies fitted on single-engine load curves only) and
paper-fit (the frozen 70b-awq-flat profile, kept for continuity).

Stages: calibration (baseline_mixed at 10 RPS), slo_throughput (per class,
the highest RPS at which 95 % of requests are answered within the tier-2
TTFT SLO, a failed request counting as a miss, by
bisection; warm-up and cool-down excluded), lead_time (thermal and PCIe
stress on each cell in turn), failover (SIGKILL one engine under 10 RPS),
burst (adversarial_spike), mismatch (one cell at max_model_len 1024; isobar
with the error-rate signal alone and isobar-capability with capability
discovery), telemetry_failure (each cell's DCGM exporter down) and network
(near-idle, symmetric, saturation, 20 ms jitter on one site, recovery; with
isobar-gpu-only, isobar without the RTT and jitter signals); issue 25's
overload_priority (150 % of the fleet's measured capacity, 20 % critical /
50 % standard / 30 % sheddable, two tenants 5:1; isobar with the gateway's
flow-control queue against isobar-nocrit, 429 at the in-flight cap) and
retry_storm (one site's engines answering 503 to 30 % of requests at 90 %
load; the dynamic retry budget against the static 20 %).

What runs: the published flat topology — one ingress in front of 9 cells in
3 sites at 2, 12 and 20 ms one way — in virtual time. Request i's random
draws (arrival, lengths, network delay and jitter, load-balancer choices)
are keyed by (seed, i), so every policy sees the same draws. The ingress
models Envoy's worker threads (--workers in the report's data_plane: 4), and
rr and lr get the same retries, retry budget and outlier detection as isobar's
cluster. Nothing is tuned per policy. Real sockets, xDS and processes are
measured by the live lab's drills (isobar chaos), not here.

Sizes: the full run (default) uses 5 seeds and longer windows (under 30
minutes on 2 cores); --quick uses 3 seeds (under 3 minutes); --smoke is a
pipeline check whose figures are noise.`,
		Example: `  isobar bench paper --quick --out /tmp/paper
  isobar bench paper --out results/ --stages calibration,failover
  isobar bench paper --quick --out /tmp/o25 --stages overload_priority,retry_storm`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchPaper(cmd, ro, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "", "directory for report.json, report.md and the charts (required)")
	fl.BoolVar(&f.quick, "quick", false, "shorter windows and fewer seeds")
	fl.BoolVar(&f.smoke, "smoke", false, "tiny run that checks the pipeline (seconds; figures are noise)")
	fl.Uint64Var(&f.seed, "seed", 1, "first seed; the run uses --seeds consecutive seeds from it (the same for every policy)")
	fl.IntVar(&f.seeds, "seeds", 0, "number of seeds (default: 5 full, 3 quick, 2 smoke)")
	fl.StringVar(&f.grounds, "grounds", "", "comma-separated grounds to run (default both: "+paper.GroundPhysics+","+paper.GroundPaperFit+")")
	fl.IntVar(&f.parallel, "parallel", 0, "(ground, seed) jobs run at once (default: the number of CPUs)")
	fl.StringVar(&f.stages, "stages", "", "comma-separated stages to run (default all: "+strings.Join(paper.Stages(), ",")+")")
	fl.StringVar(&f.classes, "classes", "", "comma-separated workload classes for slo_throughput and prefix_affinity (default: each stage's own)")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress lines")
	fl.Float64Var(&f.affinityBand, "affinity-band", placement.DefaultAffinityBand, "isobar-affinity's and precise-prefix's band, as isobar gateway --affinity-band")
	fl.DurationVar(&f.decodeCost, "isobar-decode-cost", 0, "isobar's pick: cost per request in flight, as isobar gateway --isobar-decode-cost (default 25ms)")
	fl.IntVar(&f.maxInflight, "max-inflight-per-endpoint", paper.DefaultDataPlane().MaxInflightPerEndpoint,
		"overload_priority: isobar's per-endpoint in-flight cap, as isobar gateway --max-inflight-per-endpoint")
	return cmd
}

func runBenchPaper(cmd *cobra.Command, ro *rootOpts, f *benchPaperFlags) error {
	if err := f.check(); err != nil {
		return err
	}
	grounds, err := f.pickGrounds(cmd.Flags().Changed("affinity-band"))
	if err != nil {
		return err
	}
	opt, err := f.options()
	if err != nil {
		return err
	}
	start := time.Now()
	if !f.quiet {
		if opt.Mode == paper.Full {
			fmt.Fprintln(ro.stderr, "isobar bench paper: full run: up to 30 minutes on a 2-core machine (virtual time; --quick takes under 3)")
		}
		opt.Progress = func(stage, msg string) {
			fmt.Fprintf(ro.stderr, "[%6.1fs] %-17s %s\n", time.Since(start).Seconds(), stage, msg)
		}
	}
	rep, err := paper.Run(cmd.Context(), grounds, opt, f.out)
	if err != nil {
		return err
	}
	return writeBenchPaperTargets(cmd.OutOrStdout(), grounds, rep, f.out)
}

// check refuses flag values no run could use.
func (f *benchPaperFlags) check() error {
	if f.out == "" {
		return usageError{errors.New("--out is required: the directory for report.json, report.md and the charts")}
	}
	if f.quick && f.smoke {
		return usageError{errors.New("--quick and --smoke are exclusive")}
	}
	if f.seeds < 0 {
		return usageError{fmt.Errorf("--seeds %d: want at least 1", f.seeds)}
	}
	if f.parallel < 0 {
		return usageError{fmt.Errorf("--parallel %d: want at least 1", f.parallel)}
	}
	if f.maxInflight < 1 {
		return usageError{fmt.Errorf("--max-inflight-per-endpoint %d: want at least 1", f.maxInflight)}
	}
	if f.decodeCost < 0 {
		return usageError{fmt.Errorf("--isobar-decode-cost %v: want a duration >= 0, e.g. 25ms", f.decodeCost)}
	}
	return nil
}

// pickGrounds returns the grounds --grounds names (all by default), with
// the data-plane flags applied.
func (f *benchPaperFlags) pickGrounds(affinityBandSet bool) ([]paper.Config, error) {
	grounds, err := paper.Grounds()
	if err != nil {
		return nil, err
	}
	if f.grounds != "" {
		var pick []paper.Config
		for _, name := range strings.Split(f.grounds, ",") {
			name = strings.TrimSpace(name)
			i := slices.IndexFunc(grounds, func(c paper.Config) bool { return c.Ground == name })
			if i < 0 {
				return nil, usageError{fmt.Errorf("--grounds: unknown ground %q: want some of %s,%s", name, paper.GroundPhysics, paper.GroundPaperFit)}
			}
			if !slices.ContainsFunc(pick, func(c paper.Config) bool { return c.Ground == name }) {
				pick = append(pick, grounds[i])
			}
		}
		grounds = pick
	}
	for i := range grounds {
		grounds[i].DataPlane.DecodeCost = f.decodeCost
		grounds[i].DataPlane.MaxInflightPerEndpoint = f.maxInflight
		if affinityBandSet {
			if !(f.affinityBand >= 0) || math.IsInf(f.affinityBand, 1) {
				return nil, usageError{fmt.Errorf("--affinity-band %v: want a number >= 0", f.affinityBand)}
			}
			grounds[i].DataPlane.AffinityBand = &f.affinityBand
		}
	}
	return grounds, nil
}

// options are the run's mode, seeds, stages and classes.
func (f *benchPaperFlags) options() (paper.Options, error) {
	opt := paper.Options{Mode: paper.Full, Seed: f.seed, Seeds: f.seeds, Parallel: f.parallel}
	switch {
	case f.quick:
		opt.Mode = paper.Quick
	case f.smoke:
		opt.Mode = paper.Smoke
	}
	if f.stages != "" {
		for _, s := range strings.Split(f.stages, ",") {
			opt.Stages = append(opt.Stages, strings.TrimSpace(s))
		}
		for _, s := range opt.Stages {
			if !slices.Contains(paper.Stages(), s) {
				return opt, usageError{fmt.Errorf("--stages: unknown stage %q: want some of %s", s, strings.Join(paper.Stages(), ","))}
			}
		}
	}
	if f.classes != "" {
		for _, c := range strings.Split(f.classes, ",") {
			opt.Classes = append(opt.Classes, strings.TrimSpace(c))
		}
	}
	return opt, nil
}

// writeBenchPaperTargets prints each ground's targets and where the
// report went.
func writeBenchPaperTargets(out io.Writer, grounds []paper.Config, rep *paper.Report, dir string) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUND\tTARGET\tGOT (MEDIAN)\tMET")
	var charts []string
	for _, g := range grounds {
		gr := rep.Grounds[g.Ground]
		for _, t := range gr.Targets {
			got := "—"
			if t.Got != nil {
				got = fmt.Sprintf("%.4g", *t.Got)
			}
			met := "no"
			if t.Met {
				met = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", g.Ground, t.What, got, met)
		}
		charts = append(charts, gr.Charts...)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "report: %s (and report.md, %s)\n", filepath.Join(dir, "report.json"), strings.Join(charts, ", "))
	return nil
}
