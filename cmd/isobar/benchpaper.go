package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/bench/paper"
)

type benchPaperFlags struct {
	out    string
	quick  bool
	smoke  bool
	seed   uint64
	stages string
	quiet  bool
}

func newBenchPaperCmd(ro *rootOpts) *cobra.Command {
	var f benchPaperFlags
	cmd := &cobra.Command{
		Use:   "paper --out DIR [--quick]",
		Short: "Run the published evaluation for rr, lr and isobar on the same requests",
		Long: `paper runs every stage of the published evaluation of multi-site LLM
routing, for round-robin (rr), least-request (lr) and isobar, on the same
requests, and writes DIR/report.json, DIR/report.md (the tables, with the
published figures beside ours, and the targets) and PNG charts.

Stages: calibration (baseline_mixed at 10 RPS), slo_throughput (per class,
the highest RPS with P95 TTFT <= the tier-2 SLO and success >= 0.95, by
bisection; warm-up and cool-down excluded), lead_time (thermal and PCIe
stress on each cell in turn), failover (SIGKILL one engine under 10 RPS),
burst (adversarial_spike), mismatch (one cell at max_model_len 1024; isobar
with the error-rate signal alone and isobar-capability with capability
discovery), telemetry_failure (each cell's DCGM exporter down) and network
(near-idle, symmetric, saturation, 20 ms jitter on one site, recovery; with
isobar-gpu-only, isobar without the RTT and jitter signals).

What runs: the published flat topology — one ingress in front of 9 cells in
3 sites at 2, 12 and 20 ms one way — in virtual time. Each cell is the
simulator's continuous-batching engine with the frozen 70b-awq-flat profile and
its GPU model; the isobar policies run isobar's own scorer and projector
every heartbeat, and the ingress follows the cluster isobar pushes. The
baselines are Envoy's ROUND_ROBIN and LEAST_REQUEST with active health
checks. Nothing is tuned per policy. Real sockets, xDS and processes are
measured by the live lab's drills (isobar chaos), not here.

Sizes: the full run (default) uses 10 calibration seeds, 600 s bisection
windows and every cell for the episode stages; --quick shortens windows and
seeds (a minute or so on 2 cores); the report says which.`,
		Example: `  isobar bench paper --quick --out /tmp/paper
  isobar bench paper --out results/ --stages calibration,failover`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchPaper(cmd, ro, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "", "directory for report.json, report.md and the charts (required)")
	fl.BoolVar(&f.quick, "quick", false, "shorter windows and fewer seeds")
	fl.BoolVar(&f.smoke, "smoke", false, "tiny run that checks the pipeline (seconds; figures are noise)")
	fl.Uint64Var(&f.seed, "seed", 1, "base seed of every trial (the same for every policy)")
	fl.StringVar(&f.stages, "stages", "", "comma-separated stages to run (default all: "+strings.Join(paper.Stages(), ",")+")")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress lines")
	return cmd
}

func runBenchPaper(cmd *cobra.Command, ro *rootOpts, f *benchPaperFlags) error {
	if f.out == "" {
		return usageError{errors.New("--out is required: the directory for report.json, report.md and the charts")}
	}
	if f.quick && f.smoke {
		return usageError{errors.New("--quick and --smoke are exclusive")}
	}
	opt := paper.Options{Mode: paper.Full, Seed: f.seed}
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
			found := false
			for _, k := range paper.Stages() {
				found = found || k == s
			}
			if !found {
				return usageError{fmt.Errorf("--stages: unknown stage %q: want some of %s", s, strings.Join(paper.Stages(), ","))}
			}
		}
	}
	start := time.Now()
	if !f.quiet {
		if opt.Mode == paper.Full {
			fmt.Fprintln(ro.stderr, "isobar bench paper: full run: about 10 minutes on a 2-core machine (virtual time; --quick takes about one)")
		}
		opt.Progress = func(stage, msg string) {
			fmt.Fprintf(ro.stderr, "[%6.1fs] %-17s %s\n", time.Since(start).Seconds(), stage, msg)
		}
	}
	rep, err := paper.Run(cmd.Context(), paper.DefaultConfig(), opt, f.out)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tGOT\tMET")
	for _, t := range rep.Targets {
		got := "—"
		if t.Got != nil {
			got = fmt.Sprintf("%.4g", *t.Got)
		}
		met := "no"
		if t.Met {
			met = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.What, got, met)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "report: %s (and report.md, %s)\n", filepath.Join(f.out, "report.json"), strings.Join(rep.Charts, ", "))
	return nil
}
