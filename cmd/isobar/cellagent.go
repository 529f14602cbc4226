package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/isobar-mesh/isobar/cellagent"
)

// cellagentFlagOf maps cellagent.Config fields to their flags, so that a
// Config validation error names the flag to fix.
func cellagentFlagOf() map[string]string {
	return map[string]string{
		"CellID":             "--cell-id",
		"Region":             "--region",
		"ControllerAddr":     "--controller",
		"VLLMURL":            "--vllm-url",
		"DCGMURL":            "--dcgm-url",
		"DCGMGPU":            "--dcgm-gpu",
		"NVML":               "--nvml",
		"Advertise":          "--advertise",
		"Interval":           "--interval",
		"ScrapeInterval":     "--scrape-interval",
		"Window":             "--window",
		"ScrapeTimeout":      "--scrape-timeout",
		"HealthTimeouts":     "--health-timeouts",
		"MaxBodyBytes":       "--max-body-bytes",
		"CompletionHandlers": "--completion-handlers",
		"StartupGrace":       "--startup-grace",
		"ShutdownTimeout":    "--shutdown-timeout",
		"MetricsListen":      "--metrics-listen",
		"TLS.Cert":           "--tls-cert",
		"TLS.Key":            "--tls-key",
		"TLS.CA":             "--tls-ca",
		"TLS.ServerName":     "--tls-server-name",

		"PrefillTokensPerSecond": "--prefill-tokens-per-s",
		"MaxNumSeqs":             "--max-num-seqs",
	}
}

type cellagentFlags struct {
	cfg    cellagent.Config
	once   bool
	output string
	tf     transportFlags
}

func newCellagentCmd(opts *rootOpts) *cobra.Command {
	f := &cellagentFlags{cfg: cellagent.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "cellagent",
		Short: "Per-GPU agent: scrape vLLM and dcgm-exporter, stream heartbeats to the regional controller",
		Long: `cellagent runs beside one vLLM replica. It scrapes the engine's /metrics,
/health and /v1/models and the GPU's dcgm-exporter page, derives the cell's
signal vector (queue depth, TTFT P95 and error rate over a sliding window,
KV-cache and GPU use) and streams heartbeats to the regional controller until
SIGINT or SIGTERM; then it sends a final TERMINATED heartbeat.

An engine death is reported at once: the agent keeps a TCP connection open to
the engine's port and probes /health the moment it closes.

With --tls-* the agent authenticates with a client certificate whose URI SAN
is spiffe://isobar/region/<region>/cell/<cell-id> (isobar certs issue --role
cellagent --cell ID --region R): the controller refuses heartbeats for any
other cell or region. Without --tls-* the agent refuses to start unless
--insecure (plain text, development only); --once needs neither.

--once scrapes a single time and prints one report (JSON by default). Its exit
status is 0 whenever the report was printed, even if a source failed (the
report says so); 2 for a bad command line.`,
		Example: `  isobar cellagent --cell-id us-east-1a-gpu0 --region us-east-1 --controller 127.0.0.1:18000 \
    --vllm-url http://127.0.0.1:8000/metrics --dcgm-url http://127.0.0.1:9400/metrics --dcgm-gpu 0
  isobar cellagent --once --vllm-url http://127.0.0.1:8000/metrics --dcgm-url http://127.0.0.1:9400/metrics`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("cellagent takes no arguments, got %q", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), cmd, opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cfg.CellID, "cell-id", "", "stable id of this cell ([A-Za-z0-9._-], at most 128 bytes); required unless --once")
	fl.StringVar(&f.cfg.Region, "region", "", "region this cell belongs to; required unless --once")
	fl.StringVar(&f.cfg.ControllerAddr, "controller", "", "regional controller gRPC address host:port; required unless --once")
	fl.StringVar(&f.cfg.VLLMURL, "vllm-url", "", "full URL of the engine's metrics page, e.g. http://127.0.0.1:8000/metrics (required)")
	fl.StringVar(&f.cfg.DCGMURL, "dcgm-url", "", "full URL of the dcgm-exporter metrics page; empty: no hardware signals")
	fl.StringVar(&f.cfg.DCGMGPU, "dcgm-gpu", "", "this cell's GPU on the exporter (or NVML): index or UUID; empty: the only GPU")
	fl.BoolVar(&f.cfg.NVML, "nvml", false, "read the GPU through NVML instead of dcgm-exporter (binary built with -tags nvml)")
	fl.StringVar(&f.cfg.Advertise, "advertise", "", "host:port the data plane sends requests to (default: host:port of --vllm-url)")
	fl.DurationVar(&f.cfg.Interval, "interval", f.cfg.Interval, "heartbeat interval (the controller's ack may change it)")
	fl.DurationVar(&f.cfg.ScrapeInterval, "scrape-interval", f.cfg.ScrapeInterval, "scrape period; 0: --interval")
	fl.DurationVar(&f.cfg.Window, "window", f.cfg.Window, "sliding window for TTFT P95, error rate and request rate")
	fl.DurationVar(&f.cfg.ScrapeTimeout, "scrape-timeout", f.cfg.ScrapeTimeout, "timeout of each scrape and /health probe")
	fl.IntVar(&f.cfg.HealthTimeouts, "health-timeouts", f.cfg.HealthTimeouts, "consecutive /health probes that must time out before an engine that was answering counts as down (a refused or reset connection counts at once)")
	fl.Int64Var(&f.cfg.MaxBodyBytes, "max-body-bytes", f.cfg.MaxBodyBytes, "cap on each scraped response body")
	fl.StringSliceVar(&f.cfg.CompletionHandlers, "completion-handlers", f.cfg.CompletionHandlers, "http_requests_total handler values counted for the error rate")
	fl.DurationVar(&f.cfg.StartupGrace, "startup-grace", 0, "report an engine that was never reachable as LOADING, not FAILED, for this long (vLLM listens only once its model is loaded)")
	fl.DurationVar(&f.cfg.ShutdownTimeout, "shutdown-timeout", f.cfg.ShutdownTimeout, "how long to wait for the final heartbeat to be delivered")
	fl.StringVar(&f.cfg.MetricsListen, "metrics-listen", "", "address to serve the agent's own /metrics on; empty: none")
	fl.StringVar(&f.cfg.TLS.Cert, "tls-cert", "", "client certificate (PEM) with identity spiffe://isobar/region/<region>/cell/<cell-id> (isobar certs issue --role cellagent) for mTLS to the controller; with --tls-key and --tls-ca")
	fl.StringVar(&f.cfg.TLS.Key, "tls-key", "", "client private key (PEM)")
	fl.StringVar(&f.cfg.TLS.CA, "tls-ca", "", "CA bundle (PEM) that verifies the controller")
	fl.StringVar(&f.cfg.TLS.ServerName, "tls-server-name", "", "name to verify in the controller's certificate (default: host of --controller)")
	fl.Float64Var(&f.cfg.PrefillTokensPerSecond, "prefill-tokens-per-s", 0, "the engine's prefill throughput in prompt tokens per second (its capacity class; vLLM does not publish it), "+
		"sent to the controller for the gateway's pick; 0: unknown")
	fl.Uint32Var(&f.cfg.MaxNumSeqs, "max-num-seqs", 0, "the engine's running-batch cap (its vLLM --max-num-seqs), sent to the controller; 0: unknown")
	fl.BoolVar(&f.once, "once", false, "scrape once, print a report and exit (opens no gRPC connection: needs neither TLS nor --insecure)")
	f.tf.add(cmd)
	fl.StringVarP(&f.output, "output", "o", "json", "report format with --once: json or text")
	return cmd
}

func (f *cellagentFlags) run(ctx context.Context, cmd *cobra.Command, opts *rootOpts) error {
	if !f.once {
		tls := f.cfg.TLS
		if err := f.tf.check(tls.Cert != "" || tls.Key != "" || tls.CA != ""); err != nil {
			return err
		}
	}
	if err := checkDurationFlags(cmd.Flags()); err != nil {
		return err
	}
	logger, err := opts.logger()
	if err != nil {
		return err
	}
	deps := cellagent.Deps{Logger: logger}
	if f.once {
		if f.output != "json" && f.output != "text" {
			return usageError{fmt.Errorf("--output %q: want json or text", f.output)}
		}
		report, err := cellagent.ScrapeOnce(ctx, f.cfg, deps)
		if err != nil {
			return cellagentConfigError(err)
		}
		if f.output == "text" {
			return writeOnceText(opts.stdout, report)
		}
		enc := json.NewEncoder(opts.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}
	if cmd.Flags().Changed("output") {
		return usageError{errors.New("--output applies only with --once")}
	}
	f.tf.warn(logger)
	tr, err := opts.tracing(ctx, "cellagent")
	if err != nil {
		return err
	}
	defer shutdownTracing(tr)
	deps.DialOptions = append(deps.DialOptions, tr.dial...)
	return cellagentConfigError(cellagent.Run(ctx, f.cfg, deps))
}

// checkDurationFlags refuses zero or negative durations given explicitly
// (zero would silently mean "default").
func checkDurationFlags(fs *pflag.FlagSet) error {
	var err error
	fs.Visit(func(fl *pflag.Flag) {
		if err != nil || fl.Value.Type() != "duration" {
			return
		}
		if strings.HasPrefix(fl.Value.String(), "-") || fl.Value.String() == "0s" {
			if fl.Name == "startup-grace" && fl.Value.String() == "0s" {
				return // 0 disables the grace
			}
			err = usageError{fmt.Errorf("--%s %s: must be positive", fl.Name, fl.Value.String())}
		}
	})
	return err
}

// cellagentConfigError turns a Config error into a usage error naming the
// flag.
func cellagentConfigError(err error) error {
	if err == nil {
		return nil
	}
	var fe *cellagent.FieldError
	if errors.As(err, &fe) {
		flag, ok := cellagentFlagOf()[fe.Field]
		if !ok {
			flag = fe.Field
		}
		return usageError{fmt.Errorf("%s: %s", flag, fe.Problem)}
	}
	if errors.Is(err, cellagent.ErrNoNVML) {
		return usageError{fmt.Errorf("--nvml: %w", err)}
	}
	return err
}

func writeOnceText(w io.Writer, r cellagent.OnceReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := r.State
	if r.Reason != "" {
		state += " (" + r.Reason + ")"
	}
	fmt.Fprintf(tw, "state\t%s\n", state)
	fmt.Fprintf(tw, "model\t%s\n", orDash(r.Capability.Model))
	fmt.Fprintf(tw, "max_model_len\t%d\n", r.Capability.MaxModelLen)
	for _, s := range []struct {
		name string
		st   cellagent.SourceStatus
	}{{"vllm", r.Sources.VLLM}, {"dcgm", r.Sources.DCGM}, {"models", r.Sources.Models}} {
		v := "ok"
		if !s.st.OK {
			v = "FAIL"
		}
		if s.st.Error != "" {
			v += ": " + s.st.Error
		}
		fmt.Fprintf(tw, "source %s\t%s\n", s.name, v)
	}
	sig := r.Signals
	for _, row := range []struct {
		name string
		v    *float64
	}{
		{"queue_depth", sig.QueueDepth}, {"running", sig.Running},
		{"ttft_p95_seconds", sig.TTFTP95Seconds}, {"error_rate", sig.ErrorRate},
		{"window_requests", sig.WindowRequests}, {"kv_cache_usage", sig.KVCacheUsage},
		{"gpu_util", sig.GPUUtil}, {"vram_used", sig.VRAMUsed},
		{"sm_active", sig.SMActive}, {"dram_active", sig.DRAMActive},
		{"temperature_celsius", sig.TemperatureCelsius}, {"power_watts", sig.PowerWatts},
		{"request_rate", sig.RequestRate}, {"prefix_cache_hit_rate", sig.PrefixCacheHitRate},
	} {
		v := "-"
		if row.v != nil {
			v = strconv.FormatFloat(*row.v, 'g', 6, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\n", row.name, v)
	}
	tr := "-"
	if sig.ClockThrottleReasons != nil {
		tr = fmt.Sprintf("%#x", *sig.ClockThrottleReasons)
	}
	fmt.Fprintf(tw, "clock_throttle_reasons\t%s\n", tr)
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
