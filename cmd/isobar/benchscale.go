package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/bench/scale"
)

type benchScaleFlags struct {
	out        string
	quiet      bool
	inProcess  bool
	cpuProfile string
	memProfile string
	// cellCPUProfile: each cell process profiles itself into this path
	// with its sequence number appended (.1, .2, ...).
	cellCPUProfile string
}

// benchScaleLong is the command's --help text.
const benchScaleLong = `scale measures the control plane's cost at every fleet size of --cells, for two
topologies: hierarchical (the cells split round-robin over R regional
controllers, for each R of --regions, each publishing a compact summary to
the global) and flat (one controller that ingests every cell's heartbeats,
as if there were no hierarchy; it does not depend on R, so it runs once per
fleet size).

Each point runs, in this process, the real regional controllers (heartbeat
service, registry, scoring, projection, xDS server, summary loop), and in
--cell-procs child processes (this binary re-executed, each with its
descriptor limit raised to its hard limit, controlled over its stdin and
stdout and reaped when the point ends) the synthetic cells: each a real
CellRegistry.Heartbeat gRPC stream over its own TCP connection on
127.0.0.1, plaintext, sending valid heartbeats with plausible signals every
--heartbeat-interval. --in-process runs the cells in this process instead.
When every cell is Ready, and after a short warm-up, it measures over
--window:

  ingest_heartbeats_per_s       heartbeats the controllers accepted per
                                second, beside the offered (cells/interval)
                                and ingest_fraction (target >= 0.99)
  ingest_aligned_fraction       the same by when the heartbeats were sent:
                                per cell, those numbered between the last
                                applied at the window's start and at its
                                end, less the refused, over what the cell
                                should have sent between their sent_at; the
                                controllers' read lag at the window's edges
                                moves ingest_fraction, not this
  cpu_s_per_s_per_1k_cells      this process's CPU (getrusage) per second
                                per 1,000 cells: the controllers'; the
                                senders' is sender_cpu_s_per_s (with
                                --in-process they share this process)
  rss_per_1k_cells_mib,         what the cells added to this process's RSS
  goroutines_per_cell           and goroutines
  cycle_p50_ms, cycle_p99_ms    one controller's score + project + xDS
                                build/validate/set over its cells, with the
                                real code on the live registry's cells, every
                                weight moving each cycle (a full push):
                                wall time, waits for a core included
  cycle_cpu_p50_ms, _p99_ms     the same cycles' CPU time (the thread's
                                clock): their cost, what the scale model
                                is checked on
  summary_bytes_per_region      proto.Size of the summaries the controllers
                                built (hierarchical)
  global_inbound_bytes_per_s    hierarchical: summary bytes x regions x
                                publish rate; flat: heartbeat bytes per
                                second into the one controller
  solve_ms                      optimize.Solve on an instance of R
                                regions generated as its benchmarks do
  death_to_removed_p50_ms/p99   --deaths times, a cell's TCP connection is
                                closed under its stream (like SIGKILL) and
                                timed until a go-control-plane ADS client
                                subscribed to EDS on its controller receives
                                an assignment without it
  silent_to_removed_p50_ms/p99  --silent-deaths times, a cell stops sending
                                while its stream stays open (a hung agent):
                                the TTL path, timed the same way
  ttl_failures_per_s            cells the controllers failed by TTL per
                                second over the window, where no cell stops
                                sending: heartbeats read too late; beside
                                ingest_lag_max_ms, the greatest read lag
                                (isobar_regional_ingest_lag_seconds) at the
                                window's end

Points this machine cannot hold are skipped with the reason in the report,
never dropped: fewer cells than regions, more cells than --max-cells, or
more file descriptors than RLIMIT_NOFILE allows here (one end of every
stream, two with --in-process) or in a cell process (its share of the cells;
give more --cell-procs).

--out DIR receives scale.json (the machine, the configuration and every
figure per point), scale.md (the table) and PNG charts (cycle.png,
inbound.png, cpu.png, death.png). One line per point goes to stderr as it
finishes (unless --quiet) and the table to stdout. Ctrl-C stops the point in
progress cleanly; the report is still written, marked interrupted.`

func newBenchScaleCmd(ro *rootOpts) *cobra.Command {
	var cfg scale.Config
	var f benchScaleFlags
	cmd := &cobra.Command{
		Use:   "scale --out DIR",
		Short: "Measure control-plane cost as the fleet grows, hierarchical vs flat",
		Long:  benchScaleLong,
		Example: `  isobar bench scale --out /tmp/scale
  isobar bench scale --out /tmp/scale --cells 10000 --regions 1,10,100 --cell-procs 3
  isobar bench scale --out /tmp/scale --cells 10,100,1000 --regions 1,10 --window 3s --deaths 10`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchScale(cmd, ro, cfg, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "", "directory for scale.json, scale.md and the charts (required)")
	fl.IntSliceVar(&cfg.Cells, "cells", scale.DefaultCells(), "fleet sizes, cells in total")
	fl.IntSliceVar(&cfg.Regions, "regions", scale.DefaultRegions(), "region counts of the hierarchical topology")
	fl.DurationVar(&cfg.Window, "window", 5*time.Second, "measurement window per point")
	fl.IntVar(&cfg.Deaths, "deaths", 20, "cell deaths timed per point")
	fl.IntVar(&cfg.SilentDeaths, "silent-deaths", 10, "silent cells (stream open, no heartbeats: the TTL path) timed per point")
	fl.IntVar(&cfg.CellProcs, "cell-procs", 0, "child processes that hold each point's cells (0: one per 4,000 cells)")
	fl.BoolVar(&f.inProcess, "in-process", false, "run the cells in this process, beside the controllers (no child processes)")
	fl.IntVar(&cfg.CycleSamples, "cycles", 200, "control cycles timed per point (within 3 s)")
	fl.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 500*time.Millisecond, "heartbeat interval of the cells and controllers")
	fl.DurationVar(&cfg.TTLGrace, "ttl-grace", 500*time.Millisecond, "a cell is Failed after heartbeat interval + this without heartbeats")
	fl.DurationVar(&cfg.SummaryInterval, "summary-interval", time.Second, "each hierarchical controller publishes its summary this often")
	fl.DurationVar(&cfg.StartTimeout, "start-timeout", 2*time.Minute, "bound on a point's start (every cell Ready and seen by the xDS client)")
	fl.DurationVar(&cfg.DeathTimeout, "death-timeout", 15*time.Second, "bound on each timed death's removal and each revival")
	fl.BoolVar(&cfg.DeltaXDS, "xds-delta", false, "controllers serve LEDS to delta clients and the timing xDS client watches over delta ADS (one endpoint's change sends that endpoint)")
	fl.IntVar(&cfg.MaxCells, "max-cells", 0, "skip points with more cells than this (0: only the machine's limits)")
	fl.Uint64Var(&cfg.Seed, "seed", 1, "seed of the synthetic signals, phases and optimiser instances")
	fl.StringSliceVar(&cfg.Topologies, "topology", []string{scale.Flat, scale.Hierarchical}, "topologies to run: flat, hierarchical or both")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress lines")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the controllers, the timing xDS client; not the cell processes) over the whole run to this file, for go tool pprof")
	fl.StringVar(&f.memProfile, "memprofile", "", "write this process's allocation profile (every allocation sampled since it started, and what is live) at the end of the run to this file, for go tool pprof")
	fl.StringVar(&f.cellCPUProfile, "cell-cpuprofile", "", "each cell process writes a CPU profile of itself (the senders, the probe sink) over its life to this path with .1, .2, ... appended in the order the processes start (a point starts its own), for go tool pprof")
	cmd.AddCommand(newBenchScaleCellsCmd(ro))
	return cmd
}

// newBenchScaleCellsCmd is the hidden cell process of bench scale: it runs
// scale.ServeCells on stdin and stdout until stdin ends (its parent closed
// it, or died).
func newBenchScaleCellsCmd(ro *rootOpts) *cobra.Command {
	var profile string
	cmd := &cobra.Command{
		Use:    "cells",
		Short:  "A cell process of bench scale (internal: started by bench scale)",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, _, err := benchOutputs(cmd, ro, true)
			if err != nil {
				return err
			}
			if profile != "" {
				stop, err := startCPUProfile(profile)
				if err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				defer stop()
			}
			return scale.ServeCells(cmd.Context(), cmd.InOrStdin(), ro.stdout, log)
		},
	}
	cmd.Flags().StringVar(&profile, "cpuprofile", "", "write a CPU profile of this cell process to this file until it exits")
	return cmd
}

func runBenchScale(cmd *cobra.Command, ro *rootOpts, cfg scale.Config, f benchScaleFlags) error {
	if f.out == "" {
		return usageError{errors.New("--out DIR is required: the directory for scale.json, scale.md and the charts")}
	}
	ch := cmd.Flags().Changed
	// Zero means "default" in scale.Config; on the command line it is
	// refused.
	for _, p := range []struct {
		flag string
		zero bool
	}{
		{"window", cfg.Window <= 0}, {"deaths", cfg.Deaths <= 0}, {"silent-deaths", cfg.SilentDeaths <= 0}, {"cycles", cfg.CycleSamples <= 0},
		{"cell-procs", cfg.CellProcs < 0}, {"start-timeout", cfg.StartTimeout <= 0},
		{"death-timeout", cfg.DeathTimeout <= 0},
		{"heartbeat-interval", cfg.HeartbeatInterval <= 0}, {"ttl-grace", cfg.TTLGrace <= 0},
		{"summary-interval", cfg.SummaryInterval <= 0}, {"seed", cfg.Seed == 0}, {"max-cells", cfg.MaxCells < 0},
	} {
		if p.zero {
			return usageError{fmt.Errorf("--%s: must be > 0", p.flag)}
		}
	}
	if ch("cells") && len(cfg.Cells) == 0 || ch("regions") && len(cfg.Regions) == 0 {
		return usageError{errors.New("--cells and --regions need at least one value")}
	}
	log, progress, err := benchOutputs(cmd, ro, f.quiet)
	if err != nil {
		return err
	}
	deps := scale.Deps{Logger: log, Progress: progress}
	if !f.inProcess {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("the cells' processes re-execute this binary: %w (or give --in-process)", err)
		}
		var started int
		deps.CellProcess = func() *exec.Cmd {
			args := []string{"bench", "scale", "cells"}
			if f.cellCPUProfile != "" {
				started++
				args = append(args, "--cpuprofile", fmt.Sprintf("%s.%d", f.cellCPUProfile, started))
			}
			return exec.Command(exe, args...)
		}
	}
	if f.cellCPUProfile != "" && f.inProcess {
		return usageError{errors.New("--cell-cpuprofile profiles the cell processes; with --in-process the cells are in --cpuprofile's")}
	}
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer stop()
	}
	rep, runErr := scale.Run(cmd.Context(), cfg, deps)
	if f.memProfile != "" {
		if err := writeAllocProfile(f.memProfile); err != nil {
			runErr = errors.Join(runErr, fmt.Errorf("--memprofile: %w", err))
		}
	}
	if errors.Is(runErr, scale.ErrInvalidConfig) {
		return usageError{runErr}
	}
	if rep == nil {
		return runErr
	}
	if err := scale.Write(f.out, rep); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	scale.WriteMarkdown(ro.stdout, rep)
	fmt.Fprintf(ro.stderr, "wrote %s, %s and %d charts\n", filepath.Join(f.out, "scale.json"), filepath.Join(f.out, "scale.md"), len(scale.ChartFiles()))
	return runErr
}

// writeAllocProfile writes this process's allocation profile to path.
func writeAllocProfile(path string) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(out, 0); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// startCPUProfile profiles this process into path until the returned stop
// is called.
func startCPUProfile(path string) (stop func(), err error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		_ = out.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = out.Close()
	}, nil
}
