package extproc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	extprocpb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// Config holds the values of `isobar picker`. Zero fields take the
// documented defaults.
type Config struct {
	// Gateway configures what the picker shares with the gateway: the
	// controller and region (required), the xDS node id (default
	// "isobar-picker-" + Region), the pick (LB, Placement,
	// MaxInflightPerEndpoint), the route matching (ModelHeader, HopHeader,
	// RouteName), MaxBodyBytes (the largest request body the picker reads;
	// larger: the stream ends with ResourceExhausted), DrainTimeout (how
	// long Stop lets open streams finish), ReportInterval and the reconnect
	// backoff. Gateway.Listen serves /health and /metrics only, no OpenAI
	// API (default "127.0.0.1:9003"); Gateway.MetricsListen is not used.
	Gateway gateway.Config
	// Listen is the gRPC address ext_proc (and the gRPC health service)
	// is served on. Default "127.0.0.1:9002", the Endpoint Picker's port
	// in the Gateway API Inference Extension's examples.
	Listen string
	// TLS names the picker's mTLS server files. With them, only the
	// region's gateway identity (spiffe://isobar/gateway/<Region>) may open
	// a stream. Without them the picker serves plain text (development
	// only: any client can then steer requests).
	TLS TLSFiles
}

// TLSFiles names PEM files for a mutual-TLS server: its certificate and
// key (a server certificate: isobar certs issue --server, with a DNS or IP
// SAN for every address clients dial) and the CA bundle clients are
// verified against. All three or none.
type TLSFiles struct {
	Cert, Key, CA string
}

// Enabled reports whether any file is set.
func (t TLSFiles) Enabled() bool { return t.Cert != "" || t.Key != "" || t.CA != "" }

func (c Config) withDefaults() Config {
	if c.Gateway.NodeID == "" && c.Gateway.Region != "" {
		c.Gateway.NodeID = "isobar-picker-" + c.Gateway.Region
	}
	if c.Gateway.Listen == "" {
		c.Gateway.Listen = "127.0.0.1:9003"
	}
	c.Gateway.HealthOnly = true
	if c.Listen == "" {
		c.Listen = "127.0.0.1:9002"
	}
	return c
}

// validate checks the picker's own values; New checks the Gateway's.
func (c Config) validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("%w: Listen %q is not host:port: %v", gateway.ErrInvalidConfig, c.Listen, err)
	}
	if t := c.TLS; t.Enabled() && (t.Cert == "" || t.Key == "" || t.CA == "") {
		return fmt.Errorf("%w: TLS needs the certificate, the key and the CA bundle together (--tls-cert, --tls-key, --tls-ca)", gateway.ErrInvalidConfig)
	}
	return nil
}

// Deps holds a picker's collaborators.
type Deps struct {
	// Gateway holds those of the xDS client, the pick and the reports:
	// Clock, Logger, Registerer, Gatherer (served on /metrics), Rand, and
	// DialOptions, which must carry transport credentials for the
	// controller. Transport and DialContext are not used: Envoy, not the
	// picker, talks to the endpoints.
	Gateway gateway.Deps
	// GRPCServerOptions are added to the ext_proc server's options
	// (tracing).
	GRPCServerOptions []grpc.ServerOption
}

// extProcHeadroom is what a ProcessingRequest may carry beyond
// Config.Gateway.MaxBodyBytes of body (headers, metadata): the server's message
// size limit is their sum.
const extProcHeadroom = 1 << 20

// healthServices are the gRPC health services the picker reports, as the
// Endpoint Picker Protocol's "Health Checking" section names them:
// liveness (always serving while the process runs), readiness and the
// ext_proc service (serving once the routes, clusters and endpoints have
// arrived), and the server as a whole ("", as readiness).
var healthServices = []string{"", "readiness", extprocpb.ExternalProcessor_ServiceDesc.ServiceName}

// Picker is `isobar picker`: the Endpoint Picker of the Gateway API
// Inference Extension for a stock Envoy, over Envoy's ext_proc. It owns a
// Gateway (the xDS subscriptions, the table, the pick, the per-address
// accounting and the reports; its HTTP listener serves only /health and
// /metrics) and a gRPC server serving ext_proc and gRPC health. See the
// package doc and docs/picker.md.
type Picker struct {
	cfg    Config
	g      *gateway.Gateway
	log    *slog.Logger
	clock  clockwork.Clock
	x      *extProc
	gs     *grpc.Server
	health *health.Server

	lifeMu  sync.Mutex
	started bool
	stopped bool
	addr    string
	cancel  context.CancelFunc
	wg      sync.WaitGroup // Serve and the readiness watch
	done    chan struct{}  // closed when Stop has finished
}

// New validates cfg (after applying defaults) and returns a Picker.
// It connects and serves on Start.
func New(cfg Config, deps Deps) (*Picker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g, err := gateway.New(cfg.Gateway, deps.Gateway)
	if err != nil {
		return nil, err
	}
	cfg.Gateway = g.Config()
	log, clock := deps.Gateway.Logger, deps.Gateway.Clock
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	m, err := newPickerMetrics(deps.Gateway.Registerer)
	if err != nil {
		return nil, err
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(min(cfg.Gateway.MaxBodyBytes+extProcHeadroom, 1<<30))),
	}
	// Keepalive and enforcement (internal/grpcbounds); Envoy's ext_proc
	// filter opens one stream per HTTP request, so a connection may carry
	// many more than the default 100.
	opts = append(opts, grpcbounds.Server{MaxConcurrentStreams: 4096}.ServerOptions(0)...)
	if cfg.TLS.Enabled() {
		tc, err := certs.ServerConfig(cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.CA)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	p := &Picker{
		cfg: cfg, g: g, log: log, clock: clock, health: health.NewServer(), done: make(chan struct{}),
		gs: grpc.NewServer(append(opts, deps.GRPCServerOptions...)...),
		x:  newExtProc(g, m, log.With("component", "picker"), clock, cfg.TLS.Enabled()),
	}
	extprocpb.RegisterExternalProcessorServer(p.gs, p.x)
	healthpb.RegisterHealthServer(p.gs, p.health)
	p.health.SetServingStatus("liveness", healthpb.HealthCheckResponse_SERVING)
	for _, s := range healthServices {
		p.health.SetServingStatus(s, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return p, nil
}

// Start connects to the controller (the Gateway's xDS subscriptions and
// reports), serves /health and /metrics on httpLn and ext_proc on ln, and
// reports ready over gRPC health once the table is ready. A second Start
// fails with gateway.ErrAlreadyStarted, a Start after Stop with gateway.ErrStopped.
func (p *Picker) Start(ctx context.Context, ln, httpLn net.Listener) error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	switch {
	case p.stopped:
		return gateway.ErrStopped
	case p.started:
		return gateway.ErrAlreadyStarted
	}
	if err := p.g.Start(ctx, httpLn); err != nil {
		return err
	}
	p.started, p.addr = true, ln.Addr().String()
	wctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	p.wg.Go(func() {
		if err := p.gs.Serve(ln); err != nil {
			p.log.Error("picker grpc server failed", "err", err)
		}
	})
	p.wg.Go(func() {
		if _, err := p.g.WaitForTable(wctx, (*xdsclient.Table).Ready); err != nil {
			return
		}
		for _, s := range healthServices {
			p.health.SetServingStatus(s, healthpb.HealthCheckResponse_SERVING)
		}
	})
	p.log.Info("picker started", "listen", p.addr, "http_listen", p.g.Addr(), "controller", p.cfg.Gateway.Controller,
		"region", p.cfg.Gateway.Region, "lb", string(p.cfg.Gateway.LB), "mtls", p.cfg.TLS.Enabled())
	return nil
}

// Addr returns the address ext_proc is served on ("" before Start).
func (p *Picker) Addr() string {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	return p.addr
}

// HTTPAddr returns the address /health and /metrics are served on (""
// before Start).
func (p *Picker) HTTPAddr() string { return p.g.Addr() }

// Table returns the configuration in use, nil before any was received.
func (p *Picker) Table() *xdsclient.Table { return p.g.Table() }

// WaitForTable blocks until cond holds for the configuration in use, ctx
// ends or the picker stops; see Gateway.WaitForTable.
func (p *Picker) WaitForTable(ctx context.Context, cond func(*xdsclient.Table) bool) (*xdsclient.Table, error) {
	return p.g.WaitForTable(ctx, cond)
}

// Stop shuts the picker down: gRPC health turns NOT_SERVING, new streams
// are refused, open streams get Config.Gateway.DrainTimeout to end (their HTTP
// requests to finish), then are cut; then the Gateway stops (final
// report, xDS streams). It is idempotent and blocks until every goroutine
// has exited.
func (p *Picker) Stop() {
	p.lifeMu.Lock()
	if p.stopped {
		p.lifeMu.Unlock()
		<-p.done
		return
	}
	p.stopped = true
	started := p.started
	p.lifeMu.Unlock()
	defer close(p.done)
	p.health.Shutdown()
	if started {
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			p.gs.GracefulStop()
		}()
		t := p.clock.NewTimer(p.cfg.Gateway.DrainTimeout)
		select {
		case <-drained:
		case <-t.Chan():
			p.log.Warn("open ext_proc streams cut at the drain timeout")
			p.gs.Stop()
			<-drained
		}
		t.Stop()
		p.cancel()
	}
	p.g.Stop()
	p.wg.Wait()
	if started {
		p.log.Info("picker stopped")
	}
}

// Run is the composition root of `isobar picker`: it serves ext_proc
// on cfg.Listen and /health and /metrics on cfg.Gateway.Listen until ctx
// ends, then stops gracefully. A nil deps.Gateway.Registerer gets a fresh
// registry with the Go and process collectors, served on /metrics.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if deps.Gateway.Registerer == nil {
		reg, err := promreg.NewRuntime()
		if err != nil {
			return fmt.Errorf("extproc: register runtime metrics: %w", err)
		}
		deps.Gateway.Registerer, deps.Gateway.Gatherer = reg, reg
	}
	p, err := New(cfg, deps)
	if err != nil {
		return err
	}
	cfg = p.cfg
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: picker listen %s: %w", cfg.Listen, err)
	}
	hln, err := net.Listen("tcp", cfg.Gateway.Listen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("gateway: picker listen %s: %w", cfg.Gateway.Listen, err)
	}
	if err := p.Start(ctx, ln, hln); err != nil {
		ln.Close()
		hln.Close()
		return err
	}
	<-ctx.Done()
	p.Stop()
	return nil
}

// pickerMetrics are the picker's own metrics; the Gateway's
// (isobar_gateway_*) count the rest.
type pickerMetrics struct {
	streams      prometheus.Gauge
	streamErrors *prometheus.CounterVec // reason
	decisions    *prometheus.CounterVec // result
}

// Label values, created up front so that every series exists at zero.
var (
	pickerErrorReasons = []string{"forbidden", "malformed", "out_of_order", "too_large", "unsupported_mode"}
	pickerResults      = []string{"picked", "passthrough", "not_found", "unavailable", "shed", "saturated"}
)

func newPickerMetrics(reg prometheus.Registerer) (*pickerMetrics, error) {
	m := &pickerMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_picker_open_streams",
			Help: "ext_proc streams open (each an HTTP request the proxy is processing).",
		}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_picker_stream_errors_total",
			Help: "ext_proc streams the picker closed with an error, by reason: forbidden (PermissionDenied: not this region's gateway identity), malformed and out_of_order (InvalidArgument), too_large (ResourceExhausted: body over --max-body-bytes), unsupported_mode (InvalidArgument).",
		}, []string{"reason"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_picker_decisions_total",
			Help: "Requests the picker answered, by result: picked (an endpoint named), passthrough (not a completion request: unchanged), not_found (404: no route), unavailable (503: no configuration, cluster or eligible endpoint, or the circuit breaker open), shed (the route's shed share), saturated (429: every endpoint at its in-flight limit).",
		}, []string{"result"}),
	}
	for _, r := range pickerErrorReasons {
		m.streamErrors.WithLabelValues(r)
	}
	for _, r := range pickerResults {
		m.decisions.WithLabelValues(r)
	}
	if reg != nil {
		if err := promreg.Register(reg, m.streams, m.streamErrors, m.decisions); err != nil {
			return nil, fmt.Errorf("gateway: register picker metrics: %w", err)
		}
	}
	return m, nil
}
