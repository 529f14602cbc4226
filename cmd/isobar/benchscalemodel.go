package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/bench/scalemodel"
	"github.com/isobar-mesh/isobar/summary"
)

type benchScaleModelFlags struct {
	from, out string
	opt       scalemodel.Options
}

// benchScaleModelLong is the command's --help text.
const benchScaleModelLong = `scale-model runs the calibrated virtual-time model of the control plane
(package bench/scalemodel) for fleets no machine here can hold.

Its per-operation costs (CPU per heartbeat, per controller; the full-push
and live cycle against cells per controller; summary and heartbeat bytes;
solve time against regions) were fitted on a measured 'isobar bench scale'
run and frozen (bench/scalemodel/calibrated.go); --refit fits them on
--from instead. It first runs the model as each of --from's largest
measured points ran (that machine's cores, less the senders' CPU) and puts
cycle cost, controllers' CPU and global inbound beside the measured ones
(within 15 % is the bar), then, with --holdout-max-cells, the same from a
fit on the smaller points only; then the grid --cells x --regions (0: flat)
x --cores, and where each resource runs out.

--out DIR receives model.json and model.md; the markdown also goes to
stdout.`

func newBenchScaleModelCmd(ro *rootOpts) *cobra.Command {
	var f benchScaleModelFlags
	cmd := &cobra.Command{
		Use:   "scale-model --from DIR/scale.json --out DIR",
		Short: "Run the calibrated control-plane model (100,000 cells) and check it against a measured bench scale run",
		Long:  benchScaleModelLong,
		Example: `  isobar bench scale-model --from /tmp/scale/scale.json --out /tmp/model
  isobar bench scale-model --from /tmp/scale/scale.json --out /tmp/model --refit --holdout-max-cells 1000`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchScaleModel(ro, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.from, "from", "", "a bench scale scale.json: the measured points to check the model against (required)")
	fl.StringVar(&f.out, "out", "", "directory for model.json and model.md (required)")
	fl.BoolVar(&f.opt.Refit, "refit", false, "fit the constants on --from instead of the frozen ones")
	fl.Float64Var(&f.opt.CPUExp, "cpu-exp", 0, "with --refit and the hold-out: fix the ingest CPU's exponent (1: linear in heartbeats; 0: fitted)")
	fl.IntVar(&f.opt.NearestRTT, "nearest-rtt", summary.DefaultNearestRTT, "peers' RTTs the measured run's summaries carried (the controllers' default; 0: every peer, as before issue 26 item 4)")
	fl.IntVar(&f.opt.ProjectNearestRTT, "project-nearest-rtt", summary.DefaultNearestRTT, "peers' RTTs the projections' summaries carry (the controllers' default; 0: every peer)")
	fl.Float64Var(&f.opt.Item4SummaryBytes, "item4-summary-bytes", 475, "also show the global inbound with summaries of this size (issue 26 item 4; 0: not)")
	fl.IntVar(&f.opt.HoldoutMaxCells, "holdout-max-cells", 1000, "also fit on points of at most this many cells and check that fit on the largest (0: not)")
	fl.IntSliceVar(&f.opt.Cells, "cells", []int{100000}, "fleet sizes to project")
	fl.IntSliceVar(&f.opt.Regions, "regions", []int{100, 1000, 0}, "region counts to project (0: flat, one controller)")
	fl.Float64SliceVar(&f.opt.Cores, "cores", []float64{2, 16}, "cores the controllers share")
	fl.DurationVar(&f.opt.Horizon, "horizon", 2*time.Second, "virtual time simulated per projection")
	fl.Uint64Var(&f.opt.Seed, "seed", 1, "seed of the phases and cost draws")
	return cmd
}

func runBenchScaleModel(ro *rootOpts, f benchScaleModelFlags) error {
	if f.from == "" || f.out == "" {
		return usageError{errors.New("--from FILE and --out DIR are required")}
	}
	if len(f.opt.Cells) == 0 || len(f.opt.Regions) == 0 || len(f.opt.Cores) == 0 || f.opt.Horizon <= 0 || f.opt.Seed == 0 || f.opt.CPUExp < 0 || f.opt.CPUExp > 1 {
		return usageError{errors.New("--cells, --regions and --cores need a value; --horizon and --seed must be > 0; --cpu-exp in [0, 1]")}
	}
	rep, err := scalemodel.ReadReport(f.from)
	if err != nil {
		return usageError{err}
	}
	r, err := scalemodel.Build(rep, f.from, f.opt)
	if err != nil {
		return err
	}
	if err := scalemodel.Write(f.out, r); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	scalemodel.WriteMarkdown(ro.stdout, r)
	fmt.Fprintf(ro.stderr, "wrote %s and %s\n", filepath.Join(f.out, "model.json"), filepath.Join(f.out, "model.md"))
	return nil
}
