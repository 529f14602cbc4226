package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/gateway/prefix"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/reqclass"
)

// Gateway is an HTTP data plane that routes OpenAI-compatible requests as
// the regional controller's xDS resources say. See the package doc.
type Gateway struct {
	cfg       Config
	clock     clockwork.Clock
	log       *slog.Logger
	m         *metrics
	rep       *reporter
	balancer  balancer
	transport http.RoundTripper
	ownTr     *http.Transport // nil when Deps.Transport was given
	handler   http.Handler
	dialOpts  []grpc.DialOption
	dec       xdsclient.Decoder
	bufs      sync.Pool
	hop       hopAuth
	inflight  atomic.Int64 // completion requests held, against Config.MaxInflightRequests
	tenants   *reqclass.Tenants
	flow      *flowQueue // nil with Config.NoQueue
	// ttft is an EWMA (weight slotHoldAlpha) of send → first byte over
	// the successful attempts, every endpoint together, in nanoseconds; 0
	// until the first: what the flow-control queue is told (SetTTFT).
	ttft atomic.Int64

	tbl atomic.Pointer[table]

	cfgMu   sync.Mutex // guards in, reg, changed
	in      xdsclient.Inputs
	reg     *hostRegistry
	changed chan struct{} // closed and replaced when a new table is stored

	lifeMu  sync.Mutex
	started bool
	stopped bool
	addr    string
	srv     *http.Server
	srvDone chan struct{}
	cancel  context.CancelFunc
	conn    *grpc.ClientConn
	wg      sync.WaitGroup // subscriptions
	repDone chan struct{}
	done    chan struct{} // closed when Stop has finished
}

// New validates cfg (after applying defaults) and returns a Gateway. It
// connects and serves on Start.
func New(cfg Config, deps Deps) (*Gateway, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	deps = deps.withDefaults()
	if len(deps.DialOptions) == 0 {
		return nil, fmt.Errorf("%w: Deps.DialOptions must carry transport credentials for the controller", ErrInvalidConfig)
	}
	g := &Gateway{
		cfg: cfg, clock: deps.Clock, log: deps.Logger, dialOpts: deps.DialOptions,
		balancer: balancer{mode: cfg.LB, limit: int64(cfg.MaxInflightPerEndpoint), batchCap: !cfg.NoQueue && !cfg.HealthOnly, rand: deps.Rand, place: cfg.Placement},
		dec:      xdsclient.Decoder{ModelHeader: cfg.ModelHeader},
		reg:      newHostRegistry(),
		hop:      hopAuth{key: cfg.HopKey, skew: cfg.HopMaxSkew},
		changed:  make(chan struct{}),
		done:     make(chan struct{}),
	}
	g.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	var err error
	if cfg.LB == LBIsobar && !cfg.NoPrefixAffinity {
		if g.balancer.prefix, err = prefix.New[string](prefix.DefaultConfig()); err != nil {
			return nil, err
		}
	}
	if g.m, err = newMetrics(deps.Registerer, newStateCollector(g)); err != nil {
		return nil, err
	}
	g.m.xdsRespLimit.Set(float64(cfg.MaxXDSMessageBytes))
	g.tenants = reqclass.NewTenants(cfg.MaxTenants)
	if !cfg.NoQueue {
		if g.flow, err = newFlowQueue(cfg.Queue, g.clock, g.m.flow); err != nil {
			return nil, err
		}
	}
	g.rep = newReporter(cfg, g.clock, g.log, g.m)
	if deps.Transport != nil {
		g.transport = deps.Transport
	} else {
		g.ownTr = newTransport(cfg.MaxInflightPerEndpoint, deps.DialContext)
		g.transport = g.ownTr
	}
	mux := http.NewServeMux()
	if !cfg.HealthOnly {
		mux.HandleFunc("POST /v1/completions", g.handleGenerate)
		mux.HandleFunc("POST /v1/chat/completions", g.handleGenerate)
		mux.HandleFunc("GET /v1/models", g.handleModels)
	}
	mux.HandleFunc("GET /health", g.handleHealth)
	mux.HandleFunc("GET /debug/queue", g.handleQueue)
	if deps.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{}))
	}
	g.handler = mux
	return g, nil
}

// newTransport is the upstream transport: HTTP/1.1 keep-alive pools sized
// for the in-flight cap, no transparent compression (bodies pass through
// as they are), and the cluster's connect timeout taken from the request.
func newTransport(perHost int, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if t, ok := ctx.Value(connectTimeoutKey{}).(time.Duration); ok && t > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, t)
				defer cancel()
			}
			return dial(ctx, network, addr)
		},
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: perHost,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

// Handler returns the gateway's HTTP handler (the routes Start serves).
func (g *Gateway) Handler() http.Handler { return g.handler }

// Start connects to the controller (xDS subscriptions to clusters,
// endpoints and routes; the report stream) and serves HTTP on ln. ctx
// bounds the background work; call Stop to shut down. A second Start
// fails with ErrAlreadyStarted, a Start after Stop with ErrStopped.
func (g *Gateway) Start(ctx context.Context, ln net.Listener) error {
	g.lifeMu.Lock()
	defer g.lifeMu.Unlock()
	switch {
	case g.stopped:
		return ErrStopped
	case g.started:
		return ErrAlreadyStarted
	}
	conn, err := grpc.NewClient(g.cfg.Controller, append(g.dialOpts, g.cfg.Keepalive.DialOption())...)
	if err != nil {
		return fmt.Errorf("gateway: controller %s: %w", g.cfg.Controller, err)
	}
	g.started, g.conn, g.addr = true, conn, ln.Addr().String()
	bctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	node := &core.Node{Id: g.cfg.NodeID, UserAgentName: xdsclient.UserAgent}
	for i, typ := range []string{resource.ClusterType, resource.EndpointType, resource.RouteType} {
		label := xdsclient.TypeLabels[i]
		sub := &xdsclient.Subscription{
			TypeURL: typ, Label: label, Node: node, Conn: conn, Clock: g.clock, Log: g.log,
			Min: g.cfg.MinBackoff, Max: g.cfg.MaxBackoff,
			Apply: func(rs []*anypb.Any, version string) error { return g.apply(i, rs, version) },
			Connected: func(up bool) {
				v := 0.0
				if up {
					v = 1
				}
				g.m.xdsConnected.WithLabelValues(label).Set(v)
			},
			MaxMsg: g.cfg.MaxXDSMessageBytes,
			Size:   func(n int, tooLarge bool) { g.xdsSize(label, n, tooLarge) },
			Delta:  g.cfg.XDSDelta && typ == resource.EndpointType,
		}
		if sub.Delta {
			// The delta client keeps the assignments decoded and applies a
			// change in O(changed) (xdsclient delta_apply.go); the map is
			// new on each call and its slices are only read here.
			sub.ApplyDecoded = func(as map[string][]xdsclient.Endpoint, _ []string, version string) error {
				return g.applyInputs(i, decodedInputs{assignments: as}, version, len(as))
			}
			sub.Refused = func(error) { g.m.xdsNacks.WithLabelValues(label).Inc() }
		}
		g.wg.Go(func() { sub.Run(bctx) })
	}
	g.repDone = make(chan struct{})
	go func() {
		defer close(g.repDone)
		g.rep.run(bctx, conn)
	}()
	// ReadTimeout covers headers and body; handleGenerate lifts it once the
	// body is in (a streamed answer is bounded by its route's timeout).
	g.srv = &http.Server{Handler: g.handler, ReadHeaderTimeout: g.cfg.ReadHeaderTimeout, ReadTimeout: g.cfg.ReadTimeout,
		IdleTimeout: g.cfg.IdleTimeout, ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)}
	g.srvDone = make(chan struct{})
	go func() {
		defer close(g.srvDone)
		if err := g.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.log.Error("gateway http server failed", "err", err)
		}
	}()
	g.log.Info("gateway started", "listen", g.addr, "controller", g.cfg.Controller, "region", g.cfg.Region, "lb", string(g.cfg.LB))
	if len(g.cfg.HopKey) == 0 {
		g.log.Info("no hop key: requests forwarded from other regions are served as client traffic (shed, counted, forwarded again); give every region's gateways the same --hop-key-file to serve them as forwarded")
	}
	return nil
}

// xdsSize records the size of a response of type label, or a stream broken
// by one above the limit, and warns when one nears the limit.
func (g *Gateway) xdsSize(label string, n int, tooLarge bool) {
	if tooLarge {
		g.m.xdsTooLarge.WithLabelValues(label).Inc()
		return
	}
	g.m.xdsRespBytes.WithLabelValues(label).Set(float64(n))
	if float64(n) > xdsNearLimitFraction*float64(g.cfg.MaxXDSMessageBytes) {
		g.m.xdsNearLimit.WithLabelValues(label).Inc()
		g.log.Warn("xds response near the receive limit; raise --xds-max-cells (and the controller's --max-cells) before the region grows past it",
			"type", label, "bytes", n, "limit_bytes", g.cfg.MaxXDSMessageBytes)
	}
}

// Addr returns the address Start listens on ("" before Start).
func (g *Gateway) Addr() string {
	g.lifeMu.Lock()
	defer g.lifeMu.Unlock()
	return g.addr
}

// Stop shuts the gateway down: it stops accepting connections, lets
// in-flight requests finish for up to Config.DrainTimeout (then closes
// them), sends a final report, ends the xDS and report streams and waits
// for every goroutine. It is idempotent and blocks until done.
func (g *Gateway) Stop() {
	g.lifeMu.Lock()
	if g.stopped {
		g.lifeMu.Unlock()
		<-g.done
		return
	}
	g.stopped = true
	started := g.started
	g.lifeMu.Unlock()
	defer close(g.done)
	if !started {
		return
	}
	ctx, cancel := clockwork.WithTimeout(context.Background(), g.clock, g.cfg.DrainTimeout)
	if err := g.srv.Shutdown(ctx); err != nil {
		g.log.Warn("in-flight requests cut at the drain timeout", "err", err)
		_ = g.srv.Close()
	}
	cancel()
	<-g.srvDone
	// The final report, bounded by one report interval.
	close(g.rep.flush)
	t := g.clock.NewTimer(g.cfg.ReportInterval)
	select {
	case <-g.repDone:
	case <-t.Chan():
	}
	t.Stop()
	g.cancel()
	<-g.repDone
	g.wg.Wait()
	_ = g.conn.Close()
	if g.ownTr != nil {
		g.ownTr.CloseIdleConnections()
	}
	g.log.Info("gateway stopped")
}

// Table returns the configuration in use, nil before any was received.
func (g *Gateway) Table() *xdsclient.Table {
	if t := g.tbl.Load(); t != nil {
		return t.view
	}
	return nil
}

// WaitForTable blocks until cond holds for the configuration in use, ctx
// ends (ctx.Err()) or the gateway stops (ErrStopped).
func (g *Gateway) WaitForTable(ctx context.Context, cond func(*xdsclient.Table) bool) (*xdsclient.Table, error) {
	for {
		g.cfgMu.Lock()
		ch := g.changed
		g.cfgMu.Unlock()
		t := g.Table()
		if t != nil && cond(t) {
			return t, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return t, ctx.Err()
		case <-g.done:
			return t, ErrStopped
		}
	}
}

// apply is the subscriptions' callback: decode and validate the response of
// type index i, then rebuild the table. An error NACKs the response.
func (g *Gateway) apply(i int, rs []*anypb.Any, version string) error {
	label := xdsclient.TypeLabels[i]
	var err error
	var in decodedInputs
	switch label {
	case "cluster":
		in.clusters, err = g.dec.DecodeClusters(rs)
	case "endpoint":
		in.assignments, err = xdsclient.DecodeAssignments(rs)
	default:
		in.routes, err = g.dec.DecodeRoutes(rs)
	}
	if err != nil {
		g.m.xdsNacks.WithLabelValues(label).Inc()
		return err
	}
	return g.applyInputs(i, in, version, len(rs))
}

// decodedInputs is one xDS type's decoded resources: the field of its
// type is set.
type decodedInputs struct {
	clusters    map[string]*xdsclient.ClusterPolicy
	assignments map[string][]xdsclient.Endpoint
	routes      map[string]*xdsclient.RouteConfig
}

// applyInputs installs the decoded resources of type i (n of them) at
// version and rebuilds the table.
func (g *Gateway) applyInputs(i int, in decodedInputs, version string, n int) error {
	label := xdsclient.TypeLabels[i]
	clusters := in.clusters
	defer g.offer(0) // new endpoints may take queued requests (after the unlock)
	g.cfgMu.Lock()
	defer g.cfgMu.Unlock()
	switch label {
	case "cluster":
		g.in.Clusters = clusters
	case "endpoint":
		g.in.Assignments = in.assignments
	default:
		g.in.Routes = in.routes
	}
	g.in.Versions[i] = xdsclient.TypeVersion{Version: version, At: g.clock.Now()}
	old := g.tbl.Load()
	if label == "cluster" {
		for name, p := range clusters {
			if p.LBFallbackFrom != "" {
				g.m.lbFallbacks.Inc()
				g.log.Warn("cluster load balancing policy not known; using ROUND_ROBIN, Envoy's default",
					"cluster", name, "pushed", p.LBFallbackFrom)
			}
		}
	}
	t := buildTable(&g.in, g.cfg.RouteName, g.cfg.Region, g.reg, &g.balancer, g.clock.Now())
	g.tbl.Store(t)
	if old != nil {
		for l := range old.labels {
			if _, ok := t.labels[l]; !ok {
				g.m.forgetEndpoint(l)
			}
		}
	}
	close(g.changed)
	g.changed = make(chan struct{})
	g.m.xdsUpdates.WithLabelValues(label).Inc()
	g.log.Debug("xds update applied", "type", label, "version", version, "resources", n)
	return nil
}
