package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"google.golang.org/grpc"
)

// tracing is the OpenTelemetry set-up of one process: a tracer provider
// (no global registration) and the gRPC options that trace every RPC.
type tracing struct {
	server   []grpc.ServerOption
	dial     []grpc.DialOption
	shutdown func(context.Context) error
}

// tracing builds the process's tracing from --trace, --otlp-endpoint and
// --trace-sample. With --trace none it returns no options.
func (o *rootOpts) tracing(ctx context.Context, service string) (*tracing, error) {
	t := &tracing{shutdown: func(context.Context) error { return nil }}
	var exp sdktrace.SpanExporter
	var err error
	switch o.trace {
	case "", "none":
		return t, nil
	case "stdout":
		exp, err = stdouttrace.New(stdouttrace.WithWriter(o.stderr))
	case "otlp":
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.otlpEndpoint)}
		if o.otlpInsecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		return nil, usageError{fmt.Errorf("--trace %q: want none, stdout or otlp", o.trace)}
	}
	if err != nil {
		return nil, fmt.Errorf("--trace %s: %w", o.trace, err)
	}
	if o.traceSample < 0 || o.traceSample > 1 {
		return nil, usageError{fmt.Errorf("--trace-sample %v: want a fraction in [0,1]", o.traceSample)}
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.traceSample))),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("isobar-"+service))),
	)
	prop := propagation.TraceContext{}
	t.server = []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop)))}
	t.dial = []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop)))}
	t.shutdown = tp.Shutdown
	return t, nil
}

// shutdownTracing flushes buffered spans, bounded.
func shutdownTracing(t *tracing) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.shutdown(ctx)
}
