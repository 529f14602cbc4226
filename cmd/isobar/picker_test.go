package main

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocpb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// `isobar picker` refuses a bad command line with exit status 2 and a
// message naming the flag, before it listens or dials; --help describes
// the protocol it speaks.
func TestPickerFlags(t *testing.T) {
	base := []string{"picker", "--controller", "127.0.0.1:1", "--region", "r1"}
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no TLS and no --insecure", base, "--insecure"},
		{"TLS and --insecure", []string{"picker", "--controller", "127.0.0.1:1", "--region", "r1", "--tls-cert", "c.pem", "--insecure"}, "exclude each other"},
		{"incomplete TLS", append(append([]string(nil), base...), "--tls-cert", "c.pem"), "--tls-ca"},
		{"no controller", []string{"picker", "--region", "r1", "--insecure"}, "--controller"},
		{"no region", []string{"picker", "--controller", "127.0.0.1:1", "--insecure"}, "--region"},
		{"unknown lb", append(append([]string(nil), base...), "--insecure", "--lb", "weighted-random"), "use xds, rr, lr or isobar"},
		{"bad listen", append(append([]string(nil), base...), "--insecure", "--listen", "nowhere"), "Listen"},
		{"negative body limit", append(append([]string(nil), base...), "--insecure", "--max-body-bytes", "-1"), "MaxBodyBytes"},
		{"zero drain timeout", append(append([]string(nil), base...), "--insecure", "--drain-timeout", "0s"), "--drain-timeout"},
		{"argument", append(append([]string(nil), base...), "--insecure", "extra"), "takes no arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"picker", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, s := range []string{"ext_proc", "x-gateway-destination-endpoint", "envoy.lb.subset_hint", "ORIGINAL_DST",
		"failure_mode_allow", `(default "isobar")`, `(default "127.0.0.1:9002")`} {
		if !strings.Contains(stdout.String(), s) {
			t.Errorf("picker --help does not mention %s", s)
		}
	}
}

// The real binary: `isobar picker` against `isobar regional` comes up,
// answers ext_proc streams and gRPC health, and exits 0 on SIGTERM.
func TestPickerProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctrl, ctrlHTTP, listen, metrics := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	startCLI(t, "regional", "regional", "--region", "r1", "--listen", ctrl, "--metrics-listen", ctrlHTTP, "--insecure")
	waitDial(t, ctrl)
	p := startCLI(t, "picker", "picker", "--region", "r1", "--controller", ctrl, "--listen", listen,
		"--metrics-listen", metrics, "--insecure")
	waitDial(t, listen)
	conn, err := grpc.NewClient(listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"}); err != nil ||
		r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness: %v %v", r, err)
	}
	// A completion for a model no cell serves: the picker answers with
	// the gateway's own error, an immediate response.
	s, err := extprocpb.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocpb.HttpHeaders{
		EndOfStream: true, Headers: &core.HeaderMap{Headers: []*core.HeaderValue{{Key: ":method", RawValue: []byte("POST")},
			{Key: ":path", RawValue: []byte("/v1/completions")}, {Key: "x-isobar-model", RawValue: []byte("nobody")}}}}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ir := resp.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() < 400 {
		t.Fatalf("answer %v, want an immediate error", resp)
	}
	_ = s.CloseSend()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("picker did not exit on SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("picker exit status %d after SIGTERM, want 0", code)
	}
}
