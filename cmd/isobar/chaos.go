package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/isobar-mesh/isobar/chaos"
	"github.com/isobar-mesh/isobar/lab"
)

func newChaosCmd(ro *rootOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Rehearse correlated-site failures and measure what users saw",
		Long: `chaos runs failure drills against a fleet: it checks the fleet is healthy,
drives load through every region's ingress, injects one failure at a recorded
instant, watches the controllers detect it and the data planes route around
it, heals, and reports detection and reroute times, the TTFT of the requests
exposed to the failure, and success before, during and after.

Injection goes through an admin API over HTTPS with mTLS that answers
operator identities only (spiffe://isobar/operator/NAME): isobar lab serves
one with --admin-listen. --lab starts a lab for the run instead.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return usageError{errors.New("chaos needs a subcommand: list or run")}
		},
	}
	cmd.AddCommand(newChaosListCmd(ro), newChaosRunCmd(ro))
	return cmd
}

func newChaosListCmd(ro *rootOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the drills, what each injects and what it measures",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			tw := tabwriter.NewWriter(ro.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "DRILL\tINJECTS\tDETECT\tREROUTE\tWHAT")
			for _, d := range chaos.Drills() {
				var needs []string
				for _, k := range d.Needs {
					needs = append(needs, string(k))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Name, strings.Join(needs, ","), orDash(d.Detects), orDash(d.Reroutes), d.Summary)
			}
			return tw.Flush()
		},
	}
}

// chaosFlags are the flags of chaos run.
type chaosFlags struct {
	file, report                   string
	quiet                          bool
	target, cert, key, ca          string
	useLab                         bool
	labCfg                         lab.Config
	params                         chaos.Params
	before, during, after, maxWait time.Duration
	settle                         time.Duration
	rps                            float64
	maxTokens                      int
	maxErrorRate, maxLeak          float64
	maxRTO, maxDetect              time.Duration
	maxLost                        int
	regions                        []string
	labRegions                     []string
	delay, jitter                  time.Duration
}

func newChaosRunCmd(ro *rootOpts) *cobra.Command {
	var f chaosFlags
	cmd := &cobra.Command{
		Use:   "run [DRILL]",
		Short: "Run one drill, or a scenario file of drills, and report",
		Long: `run runs DRILL (see isobar chaos list) or every drill of --file, against
the admin API at --target with the operator certificate --tls-cert/--tls-key
and CA --tls-ca, or against a lab it starts (--lab, shaped by the --lab-*
flags) and tears down afterwards. A --lab lab pins the tenant acme-eu to
its EU region (residency config), which the residency drill follows.

The report is a table on stdout and, with --report, JSON: one object for a
drill, {"passed": bool, "drills": [...]} for a scenario. Figures that do not
apply to a drill are null. Thresholds (--max-rto, --max-error-rate,
--max-detect, --max-lost, --max-leak) fail a drill; the exit status is then
3 (1 is an error that kept a drill from running, 2 a bad command line), so a
drill can gate a CI job or a rollout. A drill the target cannot
inject is refused before anything is injected.

A scenario file (YAML or JSON):
  options: {before: 5s, during: 10s, after: 5s, rps: 5}
  thresholds: {max_error_rate: 0.01, max_rto: 3s}
  drills:
    - drill: kill-cell
      region: us-west
      cells: [1]
      thresholds: {max_rto: 1s}
    - drill: jitter
      delay_ms: 20`,
		Example: `  isobar chaos run kill-cell --lab
  isobar chaos run residency --lab --lab-fast   # acme-eu's requests never reach an engine outside eu-west
  isobar chaos run kill-region --lab --max-rto 3s --report kill-region.json
  isobar chaos run --file drills.yaml --target 127.0.0.1:9443 \
      --tls-cert pki/ops.pem --tls-key pki/ops-key.pem --tls-ca pki/ca.pem`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runChaos(cmd, ro, &f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.file, "file", "", "run the drills of this scenario file (YAML or JSON) instead of DRILL")
	fl.StringVar(&f.report, "report", "", "write the report as JSON to this file")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress lines, only the table")
	fl.StringVar(&f.target, "target", "", "admin API address HOST:PORT of the fleet to drill")
	fl.StringVar(&f.cert, "tls-cert", "", "operator certificate (identity spiffe://isobar/operator/NAME)")
	fl.StringVar(&f.key, "tls-key", "", "operator private key")
	fl.StringVar(&f.ca, "tls-ca", "", "CA bundle that signed the admin API's certificate")
	fl.BoolVar(&f.useLab, "lab", false, "start a lab with its admin API for the run, and tear it down after")
	fl.StringSliceVar(&f.labRegions, "lab-regions", lab.DefaultRegions(), "--lab: region names")
	fl.IntVar(&f.labCfg.Cells, "lab-cells", 3, "--lab: cells per region")
	fl.Float64Var(&f.labCfg.TimeScale, "lab-time-scale", 0.1, "--lab: simulated time scale (0.1: engines 10x faster)")
	fl.BoolVar(&f.labCfg.Fast, "lab-fast", false, "--lab: short control-loop timers (heartbeat 200 ms, region TTL 2 s, lease 2 s)")
	fl.StringVar(&f.labCfg.LB, "lab-lb", "xds", "--lab: gateway load balancing: xds, rr or lr")
	fl.StringVar(&f.labCfg.Dir, "lab-dir", "", "--lab: directory for the lab's certificates and etcd data (default temporary)")
	registerDrillParamFlags(fl, &f)
	fl.DurationVar(&f.before, "before", 0, "load before the injection (default 5s)")
	fl.DurationVar(&f.during, "during", 0, "how long the fault stays in, at least until detected and rerouted (default 10s; controller-* drills 4s)")
	fl.DurationVar(&f.after, "after", 0, "load after the fleet is healthy again (default 5s)")
	fl.DurationVar(&f.maxWait, "max-wait", 0, "longest wait for detection and reroute (default 30s)")
	fl.DurationVar(&f.settle, "settle", 0, "longest wait for a healthy fleet before and after (default 60s)")
	fl.Float64Var(&f.rps, "rps", 0, "requests per second per region (default 5)")
	fl.IntVar(&f.maxTokens, "max-tokens", 0, "output tokens per request (default 16)")
	fl.Float64Var(&f.maxErrorRate, "max-error-rate", -1, "fail when more than this fraction of requests fails during the drill")
	fl.DurationVar(&f.maxRTO, "max-rto", 0, "fail when reroute (or detection, for drills without one) takes longer")
	fl.DurationVar(&f.maxDetect, "max-detect", 0, "fail when detection takes longer")
	fl.IntVar(&f.maxLost, "max-lost", -1, "fail when more requests than this are lost")
	fl.Float64Var(&f.maxLeak, "max-leak", -1, "fail when the leak rate is higher (capability-mismatch)")
	return cmd
}

// step is one drill to run with its settings.
type step struct {
	drill  *chaos.Drill
	params chaos.Params
	opts   chaos.Options
}

func (f *chaosFlags) options(cmd *cobra.Command) (chaos.Options, error) {
	o := chaos.Options{Before: f.before, During: f.during, After: f.after, MaxWait: f.maxWait, Settle: f.settle,
		Load: chaos.LoadConfig{RPS: f.rps, MaxTokens: f.maxTokens}}
	for name, d := range map[string]time.Duration{"before": f.before, "during": f.during, "after": f.after,
		"max-wait": f.maxWait, "settle": f.settle, "max-rto": f.maxRTO, "max-detect": f.maxDetect} {
		if d < 0 {
			return o, usageError{fmt.Errorf("--%s %v: must be >= 0", name, d)}
		}
	}
	if f.rps < 0 || f.rps > 10_000 {
		return o, usageError{fmt.Errorf("--rps %v: want 0..10000", f.rps)}
	}
	ch := cmd.Flags().Changed
	if ch("max-error-rate") {
		if f.maxErrorRate < 0 || f.maxErrorRate > 1 {
			return o, usageError{fmt.Errorf("--max-error-rate %v: want a fraction in [0, 1]", f.maxErrorRate)}
		}
		o.Thresholds.MaxErrorRate = &f.maxErrorRate
	}
	if ch("max-leak") {
		if f.maxLeak < 0 || f.maxLeak > 1 {
			return o, usageError{fmt.Errorf("--max-leak %v: want a fraction in [0, 1]", f.maxLeak)}
		}
		o.Thresholds.MaxLeak = &f.maxLeak
	}
	if ch("max-rto") {
		o.Thresholds.MaxRTO = &f.maxRTO
	}
	if ch("max-detect") {
		o.Thresholds.MaxDetect = &f.maxDetect
	}
	if ch("max-lost") {
		if f.maxLost < 0 {
			return o, usageError{fmt.Errorf("--max-lost %d: must be >= 0", f.maxLost)}
		}
		o.Thresholds.MaxLost = &f.maxLost
	}
	return o, nil
}

func (f *chaosFlags) steps(cmd *cobra.Command, args []string) ([]step, error) {
	base, err := f.options(cmd)
	if err != nil {
		return nil, err
	}
	f.params.Regions = f.regions
	f.params.DelayMS = float64(f.delay) / float64(time.Millisecond)
	f.params.JitterMS = float64(f.jitter) / float64(time.Millisecond)
	switch {
	case f.file != "" && len(args) > 0:
		return nil, usageError{errors.New("give DRILL or --file, not both")}
	case f.file == "" && len(args) == 0:
		return nil, usageError{errors.New("name a drill (isobar chaos list shows them) or give --file")}
	case f.file == "":
		d, err := chaos.Lookup(args[0])
		if err != nil {
			return nil, usageError{err}
		}
		return []step{{drill: d, params: f.params, opts: base}}, nil
	}
	b, err := os.ReadFile(f.file)
	if err != nil {
		return nil, usageError{fmt.Errorf("--file: %w", err)}
	}
	sc, err := chaos.ParseScenario(b)
	if err != nil {
		return nil, usageError{fmt.Errorf("--file %s: %w", f.file, err)}
	}
	var out []step
	for _, sd := range sc.Drills {
		d, _ := chaos.Lookup(sd.Drill)
		o := base
		sc.Options.Apply(&o)
		sd.Options.Apply(&o)
		// Command-line thresholds override the file's.
		o.Thresholds = sc.Thresholds.Thresholds().Merge(sd.Thresholds.Thresholds()).Merge(base.Thresholds)
		out = append(out, step{drill: d, params: sd.Params, opts: o})
	}
	return out, nil
}

// registerDrillParamFlags registers the flags of the drills' Params.
func registerDrillParamFlags(fl *pflag.FlagSet, f *chaosFlags) {
	fl.StringVar(&f.params.Region, "region", "", "region to hit (default: the last one)")
	fl.StringSliceVar(&f.regions, "regions", nil, "regions to hit (correlated, telemetry-loss)")
	fl.IntSliceVar(&f.params.Cells, "cells", nil, "cell indexes to hit within --region (default 0)")
	fl.IntVar(&f.params.Count, "count", 0, "correlated: how many regions (default 1)")
	fl.BoolVar(&f.params.NoLeader, "no-leader", false, "correlated: leave the global leader alone")
	fl.StringVar(&f.params.Tenant, "tenant", "", "residency: the pinned tenant to follow (default: the first the fleet pins; --lab pins "+lab.DrillTenant+")")
	fl.DurationVar(&f.delay, "delay", 0, "jitter: added one-way delay (default 20ms)")
	fl.DurationVar(&f.jitter, "jitter", 0, "jitter: added jitter (default 5ms)")
	fl.Float64Var(&f.params.Severity, "severity", 0, "brownout: throttle severity 0..1 (default 0.8)")
	fl.IntVar(&f.params.MaxModelLen, "max-model-len", 0, "capability-mismatch: the restarted cell's context length (default 1024)")
	fl.BoolVar(&f.params.Silent, "silent", false, "capability-mismatch: the cell does not advertise its new max_model_len")
	fl.Float64Var(&f.params.StaggerMS, "stagger-ms", 0, "controller-*: the restarted controller's agents come back spread over this many ms (default 2000, the agents' largest backoff; negative: each on its own backoff)")
}

// startChaosLab starts the lab of chaos run --lab: the --lab-* flags'
// shape, no traffic of its own, its admin API on loopback, and the
// residency drill's pin (acme-eu to the lab's EU region).
func startChaosLab(cmd *cobra.Command, ro *rootOpts, f *chaosFlags, progress io.Writer) (*lab.Lab, error) {
	if !cmd.Flags().Changed("log-level") {
		ro.logLevel = "error"
	}
	log, err := ro.logger()
	if err != nil {
		return nil, err
	}
	cfg := f.labCfg
	cfg.Regions, cfg.NoTraffic, cfg.AdminListen = f.labRegions, true, "127.0.0.1:0"
	cfg.ResidencyData = lab.DrillResidency(cfg.Regions)
	if progress != nil {
		fmt.Fprintf(progress, "starting a lab: %d regions × %d cells\n", len(cfg.Regions), cfg.Cells)
	}
	l, err := lab.Start(cmd.Context(), cfg, lab.Deps{Logger: log})
	if errors.Is(err, lab.ErrInvalidConfig) {
		return nil, usageError{err}
	}
	return l, err
}

func runChaos(cmd *cobra.Command, ro *rootOpts, f *chaosFlags, args []string) error {
	steps, err := f.steps(cmd, args)
	if err != nil {
		return err
	}
	if f.useLab && f.target != "" {
		return usageError{errors.New("give --target or --lab, not both")}
	}
	ctx := cmd.Context()
	var progress io.Writer = ro.stderr
	if f.quiet {
		progress = nil
	}
	target, cert, key, ca := f.target, f.cert, f.key, f.ca
	if f.useLab {
		l, err := startChaosLab(cmd, ro, f, progress)
		if err != nil {
			return err
		}
		defer l.Stop()
		target = l.AdminAddr()
		cert, key, ca = l.OperatorCredentials()
	} else if target == "" {
		return usageError{errors.New("give --target HOST:PORT of an admin API (with --tls-cert, --tls-key, --tls-ca), or --lab")}
	}
	client, err := chaos.NewClient(target, cert, key, ca)
	if err != nil {
		return usageError{err}
	}
	defer client.Close()
	runner := &chaos.Runner{Fleet: client}
	var reports []*chaos.Report
	for _, s := range steps {
		s.opts.Progress = progress
		rep, err := runner.Run(ctx, s.drill, s.params, s.opts)
		if err != nil {
			if len(reports) > 0 {
				chaos.WriteTable(ro.stdout, reports)
			}
			if errors.Is(err, chaos.ErrBadParams) {
				return usageError{err}
			}
			return err
		}
		reports = append(reports, rep)
	}
	chaos.WriteTable(ro.stdout, reports)
	if f.report != "" {
		if err := writeChaosReport(f.report, f.file != "", reports); err != nil {
			return err
		}
	}
	var failed []string
	for _, r := range reports {
		if !r.Passed {
			failed = append(failed, r.Drill+": "+strings.Join(r.Failures, "; "))
		}
	}
	if len(failed) > 0 {
		// The drills ran and a threshold failed: exit status 3, apart
		// from an error that kept a drill from running (1).
		return checkFailedError{fmt.Errorf("chaos: %d of %d drills failed: %s", len(failed), len(reports), strings.Join(failed, " | "))}
	}
	return nil
}

func writeChaosReport(path string, scenario bool, reports []*chaos.Report) error {
	var v any = reports[0]
	if scenario {
		passed := true
		for _, r := range reports {
			passed = passed && r.Passed
		}
		v = map[string]any{"passed": passed, "drills": reports}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	return nil
}
