// Command isobar is the single binary of the isobar control plane. This file
// is a shim: it builds the command tree; each command parses its flags (and
// the files they name) into its role's Config and calls that role's Run.
// The roles assemble themselves from their Config: regional.New builds the
// etcd client and the gossip node, global.New the etcd client, as the lab
// and the soak do. The commands add only the process-wide pieces: the
// logger, tracing, and a global member's optional gossip node.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit status.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "isobar: %v\n", err)
		return exitCode(err)
	}
	return exitOK
}

// Exit statuses, the same for every command (documented in the root
// command's help): promtool's convention of a distinct status for "the
// check ran and failed".
const (
	exitOK          = 0 // done
	exitError       = 1 // an error: the command could not do its work
	exitUsage       = 2 // a bad command line
	exitCheckFailed = 3 // a check, drill or benchmark target ran and failed
)

// exitCode maps a command's error to its exit status.
func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	var cf checkFailedError
	if errors.As(err, &cf) {
		return exitCheckFailed
	}
	var es exitStatusError
	if errors.As(err, &es) {
		return es.code
	}
	return exitError
}

// exitStatusError carries a status of its own: `sim engine
// --exit-on-kill` ends with 137 (128+SIGKILL), as a killed vLLM would,
// after the command's deferred shutdown has run.
type exitStatusError struct {
	error
	code int
}

func (e exitStatusError) Unwrap() error { return e.error }

// usageError marks errors caused by a bad command line (exit status 2).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// checkFailedError marks a check, drill or target that ran to the end and
// failed (exit status 3), as opposed to one that could not run (1).
type checkFailedError struct{ error }

func (c checkFailedError) Unwrap() error { return c.error }

// rootOpts holds the flags every subcommand shares.
type rootOpts struct {
	logLevel  string
	logFormat string
	// Tracing: --trace none|stdout|otlp, --otlp-endpoint, --otlp-insecure,
	// --trace-sample.
	trace        string
	otlpEndpoint string
	otlpInsecure bool
	traceSample  float64
	stdout       io.Writer
	stderr       io.Writer
}

// logger builds the process logger from the shared flags.
func (o *rootOpts) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)}
	}
	hopts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(o.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(o.stderr, hopts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(o.stderr, hopts)), nil
	default:
		return nil, usageError{fmt.Errorf("--log-format %q: want text or json", o.logFormat)}
	}
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	opts := &rootOpts{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "isobar",
		Short: "Route LLM inference traffic across GPU clusters in several datacenters",
		Long: `isobar is a hierarchical control plane for vLLM fleets spread over several
sites: a cellagent per GPU replica, a regional controller per datacenter that
scores cells and programs Envoy over xDS, and a global HA pair that routes
across regions.

Exit status, the same for every command: 0 done; 1 an error (the command
could not do its work: a source unreachable, a server that failed); 2 a bad
command line; 3 a check, drill or benchmark target that ran to the end and
failed (bench soak's checks, a chaos drill's budgets). isobar sim engine
--exit-on-kill exits 137 when killed, as a killed engine would.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&opts.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&opts.logFormat, "log-format", "text", "log format: text or json")
	root.PersistentFlags().StringVar(&opts.trace, "trace", "none", "OpenTelemetry tracing of every gRPC call: none, stdout or otlp")
	root.PersistentFlags().StringVar(&opts.otlpEndpoint, "otlp-endpoint", "127.0.0.1:4317", "OTLP/gRPC collector address for --trace otlp")
	root.PersistentFlags().BoolVar(&opts.otlpInsecure, "otlp-insecure", false, "send OTLP without TLS")
	root.PersistentFlags().Float64Var(&opts.traceSample, "trace-sample", 1, "fraction of new traces sampled")
	root.AddCommand(
		newSimCmd(opts),
		newCellagentCmd(opts),
		newRegionalCmd(opts),
		newLabCmd(opts),
		newGlobalCmd(opts),
		newCertsCmd(opts),
		newStatusCmd(opts),
		newGatewayCmd(opts),
		newPickerCmd(opts),
		newChaosCmd(opts),
		newBenchCmd(opts),
	)
	return root
}
