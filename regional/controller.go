package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/summary"
)

// Controller is one region's controller: the composition root that wires
// the registry, heartbeat service, xDS server, prober and HTTP endpoints.
type Controller struct {
	cfg     Config
	deps    Deps
	metrics *metrics
	reg     *Registry
	xds     *xds.Server
	grpc    *grpc.Server
	http    *http.Server
	prober  *prober
	health  *health.Server
	syncer  *syncer
	admin   *adminPolicy // nil without the HTTP listener
	own     owned        // what New made from the config; closed by Stop

	grpcLn, httpLn net.Listener

	startOnce, stopOnce sync.Once
	cancel              context.CancelFunc
	wg                  sync.WaitGroup
	serveErr            chan error
}

// New builds a controller; nothing runs until Start. It is the one
// assembly of a region: without Deps.Etcd it connects to Config.Etcd, and
// without Deps.Gossip it builds the node Config.Gossip describes
// (NewGossip); the controller owns what it made, starts the node in Start
// and closes both in Stop.
func New(cfg Config, deps Deps) (*Controller, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := cfg.WarmStart.prepareStateDir(); err != nil {
		return nil, err
	}
	deps.withDefaults()
	own, err := assemble(cfg, &deps)
	if err != nil {
		return nil, err
	}
	c, err := newController(cfg, deps)
	if err != nil {
		own.close()
		return nil, err
	}
	c.own = own
	return c, nil
}

// owned are the collaborators New made from the config, not the caller.
type owned struct {
	etcd   *clientv3.Client
	gossip *gossip.Node
}

func (o owned) close() {
	if o.gossip != nil {
		o.gossip.Stop()
	}
	if o.etcd != nil {
		_ = o.etcd.Close()
	}
}

// assemble fills deps.Etcd and deps.Gossip from the config where the
// caller gave none, and returns what it made.
func assemble(cfg Config, deps *Deps) (owned, error) {
	var own owned
	if deps.Etcd == nil && len(cfg.Etcd.Endpoints) > 0 {
		cc := cfg.Etcd
		if cc.Logger == nil {
			cc.Logger = deps.Logger
		}
		cli, err := election.NewClient(cc)
		if err != nil {
			return own, err
		}
		own.etcd, deps.Etcd = cli, cli
	}
	if deps.Gossip == nil && cfg.Gossip.Listen != "" {
		node, err := NewGossip(cfg, *deps)
		if err != nil {
			own.close()
			return owned{}, err
		}
		own.gossip, deps.Gossip = node, node
	}
	return own, nil
}

// NewGossip builds (does not start) the region's gossip member from cfg:
// role regional, cfg.Region, cfg.Global.IngressAddress advertised, bound
// to cfg.Gossip.Listen, and with TLS bound to the region's certificate.
// New calls it; a harness whose node outlives controller restarts (the
// lab) calls it itself, starts the node and passes it as Deps.Gossip.
func NewGossip(cfg Config, deps Deps) (*gossip.Node, error) {
	gc := gossip.Config{Role: gossip.RoleRegional, Region: cfg.Region, IngressAddress: cfg.Global.IngressAddress,
		Join: cfg.Gossip.Join, SecretKey: cfg.Gossip.SecretKey, Profile: cfg.Gossip.Profile, RTTSmoothing: cfg.Gossip.RTTSmoothing}
	host, port, err := net.SplitHostPort(cfg.Gossip.Listen)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip listen %q: %v", ErrInvalidConfig, cfg.Gossip.Listen, err)
	}
	if gc.BindPort, err = strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("%w: gossip listen %q: bad port", ErrInvalidConfig, cfg.Gossip.Listen)
	}
	gc.BindAddr = host
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gd := gossip.Deps{Logger: log.With("component", "gossip"), Validate: summary.Validate, WrapTransport: deps.GossipTransport}
	if cfg.TLS.Enabled() {
		sc, err := serverTLS(cfg.TLS)
		if err != nil {
			return nil, fmt.Errorf("gossip identity: %w", err)
		}
		gd.Identity = &gossip.Identity{Roots: sc.ClientCAs,
			Certificate: func() (*tls.Certificate, error) { return sc.GetCertificate(nil) }}
	}
	return gossip.New(gc, gd)
}

// newController wires the registry, the gRPC services, the syncer and
// the HTTP endpoints.
func newController(cfg Config, deps Deps) (*Controller, error) {
	log := deps.Logger.With("region", cfg.Region)
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	xs, err := newXDSServer(cfg, deps, log)
	if err != nil {
		return nil, err
	}
	reg, err := newRegistry(cfg, deps.Clock, log, m, xs.Push)
	if err != nil {
		return nil, err
	}
	if deps.Gossip != nil {
		reg.regionRTT = deps.Gossip.RTT // remote localities' round trips
		g := deps.Gossip
		reg.regionIngress = func() map[string]string { return gossipIngress(g.Summaries(), cfg.Region) }
	}
	wm, err := newWarmMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	reg.useWarmMetrics(wm)
	// With cross-region routing the first push also waits for a route
	// table (a plan, or the fallback built once the cells are back).
	reg.warm.needRoutes = deps.Etcd != nil || deps.Gossip != nil
	if deps.Registerer != nil {
		if err := deps.Registerer.Register(newCellCollector(reg.View, func() float64 {
			return float64(deps.Clock.Now().UnixNano()) / 1e9
		})); err != nil {
			return nil, fmt.Errorf("regional: register cell metrics: %w", err)
		}
	}
	c := &Controller{cfg: cfg, deps: deps, metrics: m, reg: reg, xds: xs, health: health.NewServer(), serveErr: make(chan error, 2)}
	if c.grpc, err = c.newGRPCServer(log); err != nil {
		return nil, err
	}
	c.prober = &prober{
		interval: cfg.ProbeInterval, spread: cfg.ProbeInterval / 2, timeout: cfg.ProbeTimeout, max: cfg.ProbeMaxPerRound,
		steady: uint64(cfg.ProbeSteadyInterval / cfg.ProbeInterval),
		view:   reg.View, submit: reg.submitProbes,
		dial: deps.Dialer, clock: deps.Clock, log: log, metrics: m,
	}
	if err := c.newSyncer(log); err != nil {
		return nil, err
	}
	if err := c.newHTTPServer(log); err != nil {
		return nil, err
	}
	return c, nil
}

func newXDSServer(cfg Config, deps Deps, log *slog.Logger) (*xds.Server, error) {
	xdeps := xds.Deps{Logger: log, Registerer: deps.Registerer, Clock: deps.Clock}
	if cfg.TLS.Enabled() {
		xdeps.Authorize = func(ctx context.Context) error {
			err := gatewayPeer(ctx, cfg.Region)
			if err != nil {
				err = fmt.Errorf("%w (peer %s)", err, peerName(ctx))
			}
			return err
		}
	}
	xs, err := xds.NewServer(cfg.XDS, xdeps)
	if err != nil {
		return nil, fmt.Errorf("regional: xds: %w", err)
	}
	return xs, nil
}

// newGRPCServer serves heartbeats, data-plane reports, xDS and health on
// one server.
func (c *Controller) newGRPCServer(log *slog.Logger) (*grpc.Server, error) {
	cfg, deps, reg := c.cfg, c.deps, c.reg
	// Keepalive, ping enforcement, streams per connection and the receive
	// cap (internal/grpcbounds); heartbeats are held to MaxMessageBytes by
	// heartbeatCodec before decoding, everything else to MaxRecvMsgBytes.
	// Everything this server reads is small (heartbeats, reports, xDS
	// requests): static windows, no BDP pings (grpcbounds.SmallMessages).
	opts := append(cfg.Keepalive.ServerOptions(cfg.Limits.MaxRecvMsgBytes), newHeartbeatCodec(),
		grpc.MaxSendMsgSize(cfg.Limits.maxSendMsgBytes()))
	opts = append(opts, grpcbounds.SmallMessages()...)
	if cfg.TLS.Enabled() {
		tc, err := serverTLS(cfg.TLS)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	gs := grpc.NewServer(append(opts, deps.GRPCServerOptions...)...)
	hbs := newHeartbeatService(cfg, reg, deps.Clock, log, c.metrics)
	isobarpb.RegisterCellRegistryServer(gs, hbs)
	isobarpb.RegisterDataPlaneServer(gs, &dataPlaneService{region: cfg.Region, reg: reg, clock: deps.Clock, log: log, metrics: c.metrics, mtls: cfg.TLS.Enabled()})
	c.xds.Register(gs)
	healthpb.RegisterHealthServer(gs, c.health)
	return gs, nil
}

// newSyncer sets up cross-region routing when etcd or gossip is there.
func (c *Controller) newSyncer(log *slog.Logger) error {
	cfg, deps := c.cfg, c.deps
	if deps.Etcd == nil && deps.Gossip == nil {
		return nil
	}
	if deps.Etcd != nil && len(deps.GlobalDialOptions) == 0 {
		return fmt.Errorf("%w: GlobalDialOptions must carry transport credentials", ErrInvalidConfig)
	}
	c.syncer = newSyncer(syncConfigOf(cfg), syncDeps{
		Registry: c.reg, Etcd: deps.Etcd, Gossip: deps.Gossip, Demand: deps.Demand,
		DialOptions: deps.GlobalDialOptions, Clock: deps.Clock, Log: log, Metrics: c.metrics,
	})
	fence := deps.PlanFence
	if fence == nil && cfg.WarmStart.StateDir != "" {
		fence = FileFence{Path: filepath.Join(cfg.WarmStart.StateDir, planFenceFile)}
	}
	if fence != nil {
		return c.syncer.useFences(fence)
	}
	return nil
}

// newHTTPServer sets up /metrics, the debug pages and the drain API,
// unless the HTTP listener is disabled.
func (c *Controller) newHTTPServer(log *slog.Logger) error {
	cfg, deps := c.cfg, c.deps
	if cfg.HTTPListen == "-" && deps.HTTPListener == nil {
		return nil
	}
	admin, err := newAdminPolicy(cfg.AdminToken, cfg.TLS.Enabled(), deps.Registerer)
	if err != nil {
		return err
	}
	c.admin = admin
	c.http = &http.Server{
		Handler:           newHTTPHandler(c.reg, c.Routes, cfg.Score, deps.Gatherer, admin),
		ReadHeaderTimeout: 5 * time.Second,
	}
	if cfg.TLS.Enabled() {
		// The debug pages and the drain API over TLS with the
		// controller's own certificate; a client certificate is
		// verified when given (an operator identity authorises, see
		// adminPolicy) and not required, so a client without one gets
		// a 401 that says what to present, and scrapers of /metrics
		// need only the CA.
		tc, err := serverTLS(cfg.TLS)
		if err != nil {
			return err
		}
		tc.ClientAuth = tls.VerifyClientCertIfGiven
		c.http.TLSConfig = tc
	} else if admin.open() {
		log.Warn("debug pages and drain API open to anyone who reaches the HTTP listener: set --tls-cert/--tls-key/--tls-ca (operator identities) or --admin-token-file",
			"http_listen", cfg.HTTPListen)
	}
	return nil
}

// Start listens and serves. It returns once the listeners are bound; a
// second Start returns an error.
func (c *Controller) Start(ctx context.Context) error {
	err := errors.New("regional: controller already started")
	c.startOnce.Do(func() { err = c.start(ctx) })
	return err
}

func (c *Controller) start(ctx context.Context) error {
	var err error
	if c.own.gossip != nil {
		if err := c.own.gossip.Start(ctx); err != nil {
			return err
		}
	}
	if c.grpcLn = c.deps.GRPCListener; c.grpcLn == nil {
		if c.grpcLn, err = net.Listen("tcp", c.cfg.Listen); err != nil {
			return fmt.Errorf("regional: listen %s: %w", c.cfg.Listen, err)
		}
	}
	if c.http != nil {
		if c.httpLn = c.deps.HTTPListener; c.httpLn == nil {
			if c.httpLn, err = net.Listen("tcp", c.cfg.HTTPListen); err != nil {
				_ = c.grpcLn.Close()
				return fmt.Errorf("regional: listen %s: %w", c.cfg.HTTPListen, err)
			}
		}
	}
	ctx, c.cancel = context.WithCancel(ctx)
	if err := c.reg.Start(ctx); err != nil {
		return err
	}
	c.wg.Go(func() { c.prober.run(ctx) })
	if c.syncer != nil {
		c.wg.Go(func() { c.syncer.summaries(ctx) })
		if c.deps.Etcd != nil {
			c.wg.Go(func() { c.syncer.run(ctx) })
		}
	}
	c.wg.Go(func() {
		if err := c.grpc.Serve(c.grpcLn); err != nil {
			c.serveErr <- fmt.Errorf("regional: grpc: %w", err)
		}
	})
	if c.http != nil {
		c.wg.Go(func() {
			serve := c.http.Serve
			if c.http.TLSConfig != nil {
				serve = func(ln net.Listener) error { return c.http.ServeTLS(ln, "", "") }
			}
			if err := serve(c.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				c.serveErr <- fmt.Errorf("regional: http: %w", err)
			}
		})
	}
	c.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	c.deps.Logger.Info("regional controller started", "region", c.cfg.Region, "grpc", c.grpcLn.Addr().String(), "http", c.HTTPAddr())
	return nil
}

// Stop shuts down gracefully: health NOT_SERVING, streams closed, loops
// joined. Idempotent; blocks until everything has exited.
func (c *Controller) Stop() {
	c.stopOnce.Do(func() {
		c.startOnce.Do(func() {}) // a Stop before Start leaves nothing to join
		defer c.own.close()
		if c.cancel == nil {
			c.xds.Stop()
			return
		}
		c.health.Shutdown()
		c.cancel()
		// xDS streams only end when the xDS server stops; stop it first so
		// GracefulStop does not wait for them.
		c.xds.Stop()
		stopped := make(chan struct{})
		go func() { c.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-c.deps.Clock.After(5 * time.Second):
			c.grpc.Stop()
			<-stopped
		}
		if c.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = c.http.Shutdown(ctx)
			cancel()
		}
		c.reg.Stop()
		c.wg.Wait()
	})
}

// Err returns a channel that yields a fatal serve error.
func (c *Controller) Err() <-chan error { return c.serveErr }

// Addr is the gRPC (heartbeat + xDS) address.
func (c *Controller) Addr() string {
	if c.grpcLn == nil {
		return ""
	}
	return c.grpcLn.Addr().String()
}

// HTTPAddr is the metrics/debug address ("" when disabled).
func (c *Controller) HTTPAddr() string {
	if c.httpLn == nil {
		return ""
	}
	return c.httpLn.Addr().String()
}

// Registry exposes the registry (views, drain) to the lab and tests.
func (c *Controller) Registry() *Registry { return c.reg }

// Routes returns the cross-region route table in force (nil without
// global routing).
func (c *Controller) Routes() *RouteTable {
	if c.syncer == nil {
		return nil
	}
	return c.syncer.Routes()
}

// XDSVersion returns the last xDS version pushed.
func (c *Controller) XDSVersion() string { return c.reg.pub.Version() }

// Run starts a controller and serves until ctx ends or serving fails.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	c, err := New(cfg, deps)
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer c.Stop()
	select {
	case <-ctx.Done():
		return nil
	case err := <-c.Err():
		return err
	}
}

func serverTLS(f TLSFiles) (*tls.Config, error) {
	return certs.ServerConfig(f.Cert, f.Key, f.CA)
}

// ClientDialOptions returns gRPC dial options for this region's outbound
// connections (to the global leader): mTLS with the region's certificate
// when f is set, plaintext otherwise. The leader's identity is checked on
// the Sync stream (a global identity only), where a refusal is counted.
func ClientDialOptions(f TLSFiles, opts ...certs.Option) ([]grpc.DialOption, error) {
	if !f.Enabled() {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	tc, err := certs.ClientConfig(f.Cert, f.Key, f.CA, "", opts...)
	if err != nil {
		return nil, err
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, nil
}

// ControllerDialOptions returns dial options for a client of region's
// controller (a gateway): as ClientDialOptions, and with mTLS the
// handshake fails unless the server's certificate is the regional
// controller identity spiffe://isobar/region/<region>, so no other
// certificate of the CA (another region's controller, say) can serve the
// gateway forged routes.
func ControllerDialOptions(f TLSFiles, region string) ([]grpc.DialOption, error) {
	return ClientDialOptions(f, certs.WithPeer(ControllerIdentity(region)))
}

// ControllerIdentity is the check (for certs.WithPeer) that a server is
// region's controller.
func ControllerIdentity(region string) func(certs.Identity) error {
	return func(id certs.Identity) error {
		if id.Kind != certs.KindRegion || id.Name != region {
			return fmt.Errorf("%w: want the controller of region %s (spiffe://isobar/region/%s)", ErrWrongController, region, region)
		}
		return nil
	}
}

// ErrWrongController: a client of a region's controller reached a server
// whose certificate is not that controller's identity.
var ErrWrongController = errors.New("regional: server is not this region's controller")
