package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// --trace stdout traces a gRPC call on both sides, in one trace.
func TestTracingAcrossGRPC(t *testing.T) {
	var out bytes.Buffer
	ro := &rootOpts{trace: "stdout", traceSample: 1, stderr: &out}
	tr, err := ro.tracing(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(tr.server...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, tr.dial...)...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	// GracefulStop returns once every server goroutine has finished, so the
	// server span has ended (its stats handler runs as the RPC finishes,
	// which Stop does not wait for) before the flush below.
	srv.GracefulStop()
	shutdownTracing(tr) // flushes the batch
	traces := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(out.String()))
	for dec.More() {
		var span struct {
			Name        string
			SpanKind    int
			SpanContext struct{ TraceID string }
		}
		if err := dec.Decode(&span); err != nil {
			t.Fatalf("span output is not JSON: %v\n%s", err, out.String())
		}
		traces[span.SpanContext.TraceID] = append(traces[span.SpanContext.TraceID], span.Name)
	}
	if len(traces) != 1 {
		t.Fatalf("want one trace with a client and a server span, got %v", traces)
	}
	for _, names := range traces {
		if len(names) != 2 || names[0] != "grpc.health.v1.Health/Check" {
			t.Fatalf("spans %v", names)
		}
	}
	if _, err := (&rootOpts{trace: "zipkin"}).tracing(context.Background(), "x"); err == nil {
		t.Error("unknown exporter accepted")
	}
}
