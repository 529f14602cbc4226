package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/bench"
)

func newBenchCmd(ro *rootOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load driver, evaluation and soak harnesses",
		Long: `bench drives load against any OpenAI-compatible URL (load), runs the
published evaluation for rr, lr and isobar on the same requests (paper),
measures control-plane cost as the fleet grows (scale), and runs isobar's harnesses in one process against real control-plane
components, judging the results against stated bounds (soak).`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			return usageError{errors.New("bench needs a subcommand: load, paper, scale or soak")}
		},
	}
	cmd.AddCommand(newBenchLoadCmd(ro), newBenchPaperCmd(ro), newBenchScaleCmd(ro), newBenchScaleModelCmd(ro), newBenchSoakCmd(ro))
	return cmd
}

// benchSoakFlags are the flags of bench soak that do not map one to one
// onto bench.SoakConfig.
type benchSoakFlags struct {
	report      string
	quiet       bool
	rssAllowMiB int
}

// benchSoakLong is the command's --help text.
const benchSoakLong = `soak starts, in this process, an embedded etcd, the global HA pair and one
regional controller per region (the real code of isobar global and isobar
regional), then --cells synthetic cells split over the regions. Each cell
is a real CellRegistry.Heartbeat gRPC stream over its own TCP connection,
sending valid heartbeats with plausible signals every --heartbeat-interval.
No engines run: the cells' endpoints are fake, and the controllers' RTT
probes go to one loopback listener the soak runs. Everything is plaintext
gRPC on 127.0.0.1 (no TLS): the soak measures the control plane's own
resource use, not the cost of mTLS.

Churn: every --churn-interval a --churn fraction of the cells die (their TCP
connection is closed under the stream, with no Terminated heartbeat, as
when an agent is SIGKILLed) and --churn-down later come back on a new
stream with the same cell id and a new incarnation.

Samples (every --sample after --warmup, one at the start and one at the
end): process RSS (VmRSS from /proc/self/status; elsewhere the Go runtime's
Sys - HeapReleased, and the report says so), goroutines, heap in use, the
controllers' open heartbeat streams (isobar_regional_heartbeat_streams),
cells Ready and Failed in their registries, and the plan (epoch:sequence)
each region applied.

Checks (any failure exits with status 3 and says which):
  rss_flat, goroutines_flat  the median of the last third of the samples
                             after the warm-up is at most the median of
                             the first third × (1 + --max-*-growth) plus
                             --rss-allowance-mib / --goroutine-allowance
  streams_match_cells        after churn stops, within --settle, every cell
                             is back and Ready and each region's open
                             streams equal its live cells (no leaked stream)
  goroutines_return          after every cell stops, within --settle, no
                             stream is open and goroutines are back at the
                             count before the cells started plus
                             --goroutine-return-allowance
  stream_errors              streams that ended without a kill plus refused
                             heartbeats are at most --max-stream-errors
  plan_epochs_monotonic      each region's applied epoch:sequence never
                             decreases (polled every 100 ms, and per sample)
  plans_advance              each region's applied plan advanced
  plan_gap                   no region went longer than the plan TTL (30 s)
                             without a new plan, or routed off the plan

The series is printed as it is taken (stderr, unless --quiet) and again as
a table with the checks on stdout; --report writes it all as JSON, also
for a failed or interrupted run. The run is bounded: start-up at most
2 min, churn for --duration, each end check at most --settle. Ctrl-C stops
everything cleanly (exit status 1, report marked interrupted).`

func newBenchSoakCmd(ro *rootOpts) *cobra.Command {
	cfg := bench.DefaultSoakConfig()
	var f benchSoakFlags
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Run the control plane for a long time under churn and check it stays flat",
		Long:  benchSoakLong,
		Example: `  isobar bench soak --duration 10m --cells 1000 --report soak.json
  isobar bench soak --duration 60s --warmup 15s --cells 1000
  isobar bench soak --duration 2m --regions a,b --cells 200 --churn 0.1 --churn-interval 2s`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBenchSoak(cmd, ro, cfg, f)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the cells run under churn, warm-up included")
	fl.StringSliceVar(&cfg.Regions, "regions", cfg.Regions, "region names (one regional controller each)")
	fl.IntVar(&cfg.Cells, "cells", cfg.Cells, "synthetic cells in total, split over the regions")
	fl.Float64Var(&cfg.ChurnFraction, "churn", cfg.ChurnFraction, "fraction of the cells that die every --churn-interval (0: no churn)")
	fl.DurationVar(&cfg.ChurnInterval, "churn-interval", cfg.ChurnInterval, "interval between churn rounds")
	fl.DurationVar(&cfg.ChurnDown, "churn-down", cfg.ChurnDown, "how long a dead cell stays away before it returns")
	fl.DurationVar(&cfg.SampleEvery, "sample", cfg.SampleEvery, "interval between samples")
	fl.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "samples before this are not judged for flatness (0: min(30s, --duration/3))")
	fl.DurationVar(&cfg.Settle, "settle", cfg.Settle, "bound on each end check (cells back after churn; goroutines back after stop)")
	fl.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "heartbeat interval of the cells and controllers")
	fl.Float64Var(&cfg.MaxRSSGrowth, "max-rss-growth", cfg.MaxRSSGrowth, "rss_flat: allowed relative growth of the median RSS")
	fl.IntVar(&f.rssAllowMiB, "rss-allowance-mib", int(cfg.RSSAllowance>>20), "rss_flat: allowed absolute growth of the median RSS, MiB")
	fl.Float64Var(&cfg.MaxGoroutineGrowth, "max-goroutine-growth", cfg.MaxGoroutineGrowth, "goroutines_flat: allowed relative growth of the median goroutine count")
	fl.IntVar(&cfg.GoroutineAllowance, "goroutine-allowance", cfg.GoroutineAllowance, "goroutines_flat: allowed absolute growth of the median goroutine count")
	fl.IntVar(&cfg.GoroutineReturnAllowance, "goroutine-return-allowance", cfg.GoroutineReturnAllowance, "goroutines_return: goroutines allowed above the count before the cells started")
	fl.IntVar(&cfg.MaxStreamErrors, "max-stream-errors", cfg.MaxStreamErrors, "stream_errors: unexpected stream ends plus refused heartbeats allowed (-1: no check)")
	fl.StringVar(&f.report, "report", "", "write the series and the verdicts as JSON to this file")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress lines, only the final table")
	fl.StringVar(&cfg.Dir, "dir", "", "directory for etcd's data (default temporary, removed after)")
	fl.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the churn and the synthetic signals")
	return cmd
}

func runBenchSoak(cmd *cobra.Command, ro *rootOpts, cfg bench.SoakConfig, f benchSoakFlags) error {
	ch := cmd.Flags().Changed
	// Zero means "default" in bench.SoakConfig; on the command line it
	// means what it says, or is refused where it cannot.
	if ch("churn") {
		if !(cfg.ChurnFraction >= 0 && cfg.ChurnFraction <= 1) {
			return usageError{fmt.Errorf("--churn %v: want a fraction of the cells in [0, 1]", cfg.ChurnFraction)}
		}
		if cfg.ChurnFraction == 0 {
			cfg.ChurnFraction = -1 // bench.SoakConfig's "no churn"
		}
	}
	for _, p := range []struct {
		flag string
		zero bool
	}{
		{"duration", cfg.Duration == 0}, {"cells", cfg.Cells == 0}, {"churn-interval", cfg.ChurnInterval == 0},
		{"churn-down", cfg.ChurnDown == 0}, {"sample", cfg.SampleEvery == 0}, {"settle", cfg.Settle == 0},
		{"heartbeat-interval", cfg.HeartbeatInterval == 0}, {"max-rss-growth", cfg.MaxRSSGrowth == 0},
		{"rss-allowance-mib", f.rssAllowMiB == 0}, {"max-goroutine-growth", cfg.MaxGoroutineGrowth == 0},
		{"goroutine-allowance", cfg.GoroutineAllowance == 0}, {"goroutine-return-allowance", cfg.GoroutineReturnAllowance == 0},
		{"seed", cfg.Seed == 0},
	} {
		if p.zero {
			return usageError{fmt.Errorf("--%s 0: must be > 0", p.flag)}
		}
	}
	if f.rssAllowMiB < 0 || f.rssAllowMiB > 1<<20 {
		return usageError{fmt.Errorf("--rss-allowance-mib %d: want 1..%d", f.rssAllowMiB, 1<<20)}
	}
	cfg.RSSAllowance = uint64(f.rssAllowMiB) << 20
	if ch("warmup") && cfg.Warmup == 0 {
		return usageError{errors.New("--warmup 0: give a positive warm-up, or leave it out for the default")}
	}
	log, progress, err := benchOutputs(cmd, ro, f.quiet)
	if err != nil {
		return err
	}
	rep, runErr := bench.RunSoak(cmd.Context(), cfg, bench.SoakDeps{Logger: log, Progress: progress})
	if errors.Is(runErr, bench.ErrInvalidConfig) {
		return usageError{runErr}
	}
	if rep != nil {
		bench.WriteSoakTable(ro.stdout, rep)
		if f.report != "" {
			b, err := json.MarshalIndent(rep, "", "  ")
			if err != nil {
				return err
			}
			if err := os.WriteFile(f.report, append(b, '\n'), 0o644); err != nil {
				return fmt.Errorf("--report: %w", err)
			}
		}
	}
	if errors.Is(runErr, bench.ErrSoakFailed) {
		return checkFailedError{runErr} // ran to the end, a check failed
	}
	return runErr
}

// noArgs refuses positional arguments as a usage error (exit status 2).
func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return usageError{err}
	}
	return nil
}

// benchOutputs returns a harness's logger (errors only unless --log-level
// was given: the harness prints its own progress) and its progress writer
// (stderr, or nil with --quiet).
func benchOutputs(cmd *cobra.Command, ro *rootOpts, quiet bool) (*slog.Logger, io.Writer, error) {
	if !cmd.Flags().Changed("log-level") {
		ro.logLevel = "error"
	}
	log, err := ro.logger()
	if err != nil {
		return nil, nil, err
	}
	if quiet {
		return log, nil, nil
	}
	return log, ro.stderr, nil
}
