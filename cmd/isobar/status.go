package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/statusview"
)

// statusMinWatch is the shortest --watch period.
const statusMinWatch = 100 * time.Millisecond

// errStatusSources reports that some sources could not be read; the
// report was still printed with the error in each failed source's place.
var errStatusSources = errors.New("status: some sources could not be read")

type statusFlags struct {
	controllers []string
	globals     []string
	output      string
	watch       time.Duration
	timeout     time.Duration
	// Admin credentials of controllers run with TLS or a token.
	cert, key, ca, tokenFile string
}

// statusDeps are the command's collaborators; tests inject a fake clock
// and the httptest client.
type statusDeps struct {
	clock  clockwork.Clock
	client *http.Client
}

// newStatusCmd builds `isobar status`, the live fleet view read from the
// controllers' debug HTTP APIs. It writes to the command's output writer.
func newStatusCmd(ro *rootOpts) *cobra.Command {
	return newStatusCmdWith(ro, statusDeps{clock: clockwork.NewRealClock(), client: &http.Client{}})
}

// statusDebugAddrFlag names a regional controller's debug HTTP API, the
// spelling that replaced --controller (a gRPC address on other commands).
const statusDebugAddrFlag = "debug-addr"

func newStatusCmdWith(_ *rootOpts, deps statusDeps) *cobra.Command {
	f := &statusFlags{}
	cmd := &cobra.Command{
		Use:   "status --debug-addr ADDR [--debug-addr ADDR ...] [--global ADDR ...]",
		Short: "Show the live fleet of regional controllers and the global plan",
		Long: `status reads the debug HTTP API of one or more regional controllers
(their --metrics-listen address, given with --debug-addr) and prints, per controller, one row per cell and
the cross-region routes in force; with --global, also a global member's view
of the regions and the plan it last published.

Cell columns: CELL id; STATE lifecycle state (+drain when an operator drained
it, +conflict when its endpoint collides with another cell's); PRESSURE the
composite pressure in [0,1]; WEIGHT the weight published to the data plane
and TARGET the weight the signals alone would give; PENALTY the error-rate
penalty (with "probation" while re-admitted on probation); FALLBACK "yes"
when a telemetry source is missing and the score renormalised over the rest;
HEARTBEAT the age of the last heartbeat on the controller's clock; ENDPOINT;
MODEL/MAX_LEN; REASON of the last state change.

Routes: the source (plan: the global leader's plan; fallback: local-first
with spill-over from gossiped summaries; local: everything local), the plan's
epoch and sequence, and per model the share of this region's ingress served
by each region and the share shed.

Addresses are host:port or http(s)://host:port. --debug-addr and --global may
be repeated. --debug-addr was --controller, a spelling still accepted (and
deprecated: cellagent's and gateway's --controller is a gRPC address). --output json prints the same as JSON (the debug API's own
shapes); with --watch, one JSON document per line per refresh.

Exit status: 0 when every source answered, 1 when one could not be reached
or did not answer JSON (the others are still printed: an unreachable source
is an error, not a check that failed, so never 3), 2 for a bad command
line. With --watch, status runs until interrupted and exits 0.`,
		Example: `  isobar status --debug-addr 127.0.0.1:9090
  isobar status --debug-addr 127.0.0.1:9090 --debug-addr 127.0.0.1:9190 --watch 2s
  isobar status --global 127.0.0.1:9091 --output json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("status takes no arguments, got %q; give addresses with --debug-addr", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), cmd.OutOrStdout(), deps)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.controllers, statusDebugAddrFlag, "c", nil, "regional controller debug HTTP address (its --metrics-listen), host:port (repeatable)")
	deprecatedAlias(fl, "controller", statusDebugAddrFlag)
	fl.StringArrayVarP(&f.globals, "global", "g", nil, "global member debug address, host:port (repeatable)")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	fl.DurationVarP(&f.watch, "watch", "w", 0, "refresh every DURATION until interrupted (0: print once)")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Second, "time limit of each HTTP request")
	fl.StringVar(&f.cert, "tls-cert", "", "operator certificate (spiffe://isobar/operator/NAME) for controllers run with TLS; addresses then default to https://")
	fl.StringVar(&f.key, "tls-key", "", "private key of --tls-cert")
	fl.StringVar(&f.ca, "tls-ca", "", "CA bundle that signed the controllers' certificates (with --tls-cert, or alone with --admin-token-file)")
	fl.StringVar(&f.tokenFile, "admin-token-file", "", "file holding the controllers' admin bearer token (their --admin-token-file)")
	return cmd
}

func (f *statusFlags) sources() (ctrls, globals []statusview.Source, err error) {
	if len(f.controllers) == 0 && len(f.globals) == 0 {
		return nil, nil, usageError{errors.New("give at least one --debug-addr ADDR (a regional controller's --metrics-listen address) or --global ADDR")}
	}
	parse := func(flag string, addrs []string) ([]statusview.Source, error) {
		var out []statusview.Source
		for _, a := range addrs {
			src, err := statusview.ParseSource(a)
			if err != nil {
				return nil, usageError{fmt.Errorf("--%s %q: %w", flag, a, err)}
			}
			if f.ca != "" && !strings.Contains(a, "://") {
				src.Base = "https" + strings.TrimPrefix(src.Base, "http")
			}
			out = append(out, src)
		}
		return out, nil
	}
	if ctrls, err = parse(statusDebugAddrFlag, f.controllers); err != nil {
		return nil, nil, err
	}
	if globals, err = parse("global", f.globals); err != nil {
		return nil, nil, err
	}
	return ctrls, globals, nil
}

func (f *statusFlags) run(ctx context.Context, w io.Writer, deps statusDeps) error {
	if f.output != "table" && f.output != "json" {
		return usageError{fmt.Errorf("--output %q: want table or json", f.output)}
	}
	if f.watch != 0 && f.watch < statusMinWatch {
		return usageError{fmt.Errorf("--watch %v: want 0 (print once) or at least %v", f.watch, statusMinWatch)}
	}
	if f.timeout <= 0 {
		return usageError{fmt.Errorf("--timeout %v: want a positive duration", f.timeout)}
	}
	ctrls, globals, err := f.sources()
	if err != nil {
		return err
	}
	fetch := statusview.Fetcher{Client: deps.client, Timeout: f.timeout}
	if err := f.admin(&fetch); err != nil {
		return err
	}
	if f.watch == 0 {
		rep := fetch.Collect(ctx, ctrls, globals)
		if err := f.print(w, rep, false); err != nil {
			return err
		}
		if n := rep.Failed(); n > 0 {
			return fmt.Errorf("%w: %d of %d could not be read (see above)", errStatusSources, n, len(ctrls)+len(globals))
		}
		return nil
	}
	tick := deps.clock.NewTicker(f.watch)
	defer tick.Stop()
	clearScreen := f.output == "table" && isTerminal(w)
	for {
		rep := fetch.Collect(ctx, ctrls, globals)
		if ctx.Err() != nil {
			return nil
		}
		if f.output == "table" {
			if clearScreen {
				fmt.Fprint(w, "\x1b[H\x1b[2J")
			}
			fmt.Fprintf(w, "isobar status at %s, every %v (Ctrl-C to stop)\n\n", deps.clock.Now().Format(time.TimeOnly), f.watch)
		}
		if err := f.print(w, rep, true); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.Chan():
		}
	}
}

// admin sets the fetcher's admin credentials from the flags: an operator
// certificate over TLS and/or a bearer token.
func (f *statusFlags) admin(fetch *statusview.Fetcher) error {
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		fetch.Token = strings.TrimSpace(string(b))
	}
	if f.cert == "" && f.key == "" && f.ca == "" {
		return nil
	}
	var tc *tls.Config
	var err error
	switch {
	case f.cert != "" || f.key != "":
		if tc, err = certs.ClientConfig(f.cert, f.key, f.ca, ""); err != nil {
			return usageError{fmt.Errorf("operator credentials (--tls-cert, --tls-key, --tls-ca): %w", err)}
		}
	default:
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(f.ca)
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return usageError{fmt.Errorf("--tls-ca %s: want a readable PEM CA bundle (%v)", f.ca, err)}
		}
		tc = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	}
	fetch.Client = &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (f *statusFlags) print(w io.Writer, rep statusview.Report, watching bool) error {
	if f.output == "json" {
		enc := json.NewEncoder(w)
		if !watching {
			enc.SetIndent("", "  ")
		}
		return enc.Encode(rep)
	}
	return statusview.WriteTable(w, rep)
}
