package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/deploy"
)

// regional, global, cellagent and gateway refuse to start with neither TLS
// material nor --insecure: exit 2 at once, before listening, dialling etcd
// or the controller (the addresses given would fail differently, or hang,
// if they were used), with a message naming --tls-cert and --insecure.
func TestNoTLSWithoutInsecureRefused(t *testing.T) {
	for _, args := range [][]string{
		{"regional", "--region", "r1", "--listen", "127.0.0.1:1", "--metrics-listen", "-"},
		{"global", "--name", "g1", "--listen", "127.0.0.1:1", "--etcd-endpoints", "127.0.0.1:1"},
		{"cellagent", "--cell-id", "c1", "--region", "r1", "--controller", "127.0.0.1:1", "--vllm-url", "http://127.0.0.1:1/metrics"},
		{"gateway", "--controller", "127.0.0.1:1", "--region", "r1", "--listen", "127.0.0.1:1"},
	} {
		t.Run(args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), "--tls-cert") || !strings.Contains(stderr.String(), "--insecure") {
				t.Fatalf("exit %d, stderr %q; want 2 naming --tls-cert and --insecure", code, stderr.String())
			}
			if strings.Contains(stderr.String(), "running without TLS") {
				t.Errorf("refused start logged the --insecure warning: %q", stderr.String())
			}
			// --insecure together with TLS material is a contradiction.
			stderr.Reset()
			code = run(append(append([]string{}, args...), "--insecure", "--tls-cert", "x.pem"), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), "exclude") {
				t.Fatalf("--insecure with --tls-cert: exit %d, stderr %q", code, stderr.String())
			}
		})
	}
}

// Incomplete TLS material is refused at once too, naming what is missing
// (before etcd, listeners or the controller are touched).
func TestPartialTLSRefused(t *testing.T) {
	for _, args := range [][]string{
		{"regional", "--region", "r1", "--listen", "127.0.0.1:1", "--metrics-listen", "-", "--tls-cert", "c.pem"},
		{"global", "--name", "g1", "--etcd-endpoints", "127.0.0.1:1", "--tls-cert", "c.pem"},
		{"cellagent", "--cell-id", "c1", "--region", "r1", "--controller", "127.0.0.1:1", "--vllm-url", "http://127.0.0.1:1/metrics", "--tls-cert", "c.pem"},
		{"gateway", "--controller", "127.0.0.1:1", "--region", "r1", "--tls-cert", "c.pem"},
	} {
		t.Run(args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "--tls-key") {
				t.Fatalf("exit %d, stderr %q; want 2 naming --tls-key", code, stderr.String())
			}
		})
	}
}

// With --insecure each command logs a warning first, then goes on (here
// to a configuration error of its own, so that nothing is started).
func TestInsecureWarns(t *testing.T) {
	for _, tc := range []struct {
		args []string
		next string // the error that follows the warning
	}{
		{[]string{"regional", "--insecure"}, "--region is required"},
		{[]string{"global", "--insecure"}, "--etcd-endpoints is required"},
		{[]string{"cellagent", "--insecure", "--vllm-url", "http://127.0.0.1:1/metrics"}, "--cell-id"},
		{[]string{"gateway", "--insecure", "--region", "r1"}, "controller"},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			out := stderr.String()
			warn := strings.Index(out, "running without TLS (--insecure)")
			if code != 2 || warn < 0 || !strings.Contains(out[warn:], tc.next) {
				t.Fatalf("exit %d, stderr %q; want the --insecure warning, then %q", code, out, tc.next)
			}
		})
	}
}

// cellagent --once opens no gRPC connection and needs neither TLS nor
// --insecure: it gets past the transport check (to its own --vllm-url
// error here).
func TestCellagentOnceNeedsNoTransport(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"cellagent", "--once"}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "--vllm-url") || strings.Contains(stderr.String(), "--insecure") {
		t.Fatalf("exit %d, stderr %q; want the --vllm-url error only", code, stderr.String())
	}
}

// Every deployed regional, global, cellagent and gateway runs with mTLS:
// none of deploy/'s command lines uses --insecure or omits --tls-cert.
func TestDeployInvocationsUseTLS(t *testing.T) {
	invs, err := deploy.Invocations(os.DirFS(filepath.Join("..", "..", "deploy")))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, inv := range invs {
		root := newRootCmd(io.Discard, io.Discard)
		cmd, rest, err := root.Find(inv.Args)
		if err != nil || cmd.Flags().Lookup("insecure") == nil {
			continue // not one of the four (TestDeployInvocationsParse checks the rest)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%s %s: %v", inv.File, inv.Where, err)
			continue
		}
		checked++
		if cmd.Flags().Changed("insecure") || !cmd.Flags().Changed("tls-cert") {
			t.Errorf("%s %s: isobar %s runs without mTLS: %q", inv.File, inv.Where, cmd.Name(), inv.Args)
		}
	}
	if checked < 4 {
		t.Errorf("checked %d invocations of regional/global/cellagent/gateway in deploy/, want at least 4", checked)
	}
}
