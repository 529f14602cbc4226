package main

import (
	"errors"
	"log/slog"

	"github.com/spf13/cobra"
)

// transportFlags is --insecure, shared by the commands that serve or dial
// gRPC (regional, global, cellagent, gateway). mTLS is the only default:
// such a command given neither TLS material nor --insecure refuses to
// start, before it listens or dials anything.
type transportFlags struct{ insecure bool }

func (t *transportFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&t.insecure, "insecure", false,
		"run without TLS (plain-text gRPC, no peer identities; development only); without it --tls-cert, --tls-key and --tls-ca are required")
}

// errNoTransport is the refusal to start without TLS material or --insecure.
var errNoTransport = errors.New("no TLS material: give --tls-cert, --tls-key and --tls-ca for mTLS, or --insecure to run in plain text (development only)")

// check refuses to start with neither TLS material (any --tls-* flag;
// incomplete sets are refused later, naming the missing flag) nor
// --insecure, and with both.
func (t *transportFlags) check(tlsGiven bool) error {
	switch {
	case tlsGiven && t.insecure:
		return usageError{errors.New("--insecure and --tls-cert/--tls-key/--tls-ca exclude each other")}
	case !tlsGiven && !t.insecure:
		return usageError{errNoTransport}
	}
	return nil
}

// warn logs, at start, that the process runs in plain text.
func (t *transportFlags) warn(log *slog.Logger) {
	if t.insecure {
		log.Warn("running without TLS (--insecure): peers are not authenticated, so anyone who can reach this process can forge heartbeats, summaries, plans or xDS subscriptions")
	}
}
