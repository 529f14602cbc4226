package global

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Server is one member of the global HA pair.
type Server struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	metrics *metrics
	store   *store
	hub     *hub
	planner *planner
	grpc    *grpc.Server
	http    *http.Server

	grpcLn, httpLn net.Listener
	id             string
	cand           *election.Candidate
	current        atomic.Pointer[election.Leadership]
	lastPlan       atomic.Pointer[isobarpb.RoutingPlan]
	seq            uint64 // owned by the leader loop

	ownedEtcd *clientv3.Client // made by New from Config.Etcd; closed by Stop

	startOnce, stopOnce sync.Once
	cancel              context.CancelFunc
	wg                  sync.WaitGroup
	errs                chan error
}

// New builds a member; nothing runs until Start. Without Deps.Etcd it
// connects to Config.Etcd, and Stop closes that client.
func New(cfg Config, deps Deps) (*Server, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	deps.withDefaults()
	owned, err := deps.connectEtcd(cfg.Etcd)
	if err != nil {
		return nil, err
	}
	g, err := newServer(cfg, deps)
	if err != nil {
		if owned != nil {
			_ = owned.Close()
		}
		return nil, err
	}
	g.ownedEtcd = owned
	return g, nil
}

// withDefaults fills the nil collaborators: the real clock, a discarding
// logger, a fresh registry.
func (d *Deps) withDefaults() {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Registerer == nil && d.Gatherer == nil {
		r := prometheus.NewRegistry()
		d.Registerer, d.Gatherer = r, r
	}
	if d.Gatherer == nil {
		if g, ok := d.Registerer.(prometheus.Gatherer); ok {
			d.Gatherer = g
		} else {
			d.Gatherer = prometheus.NewRegistry()
		}
	}
}

// connectEtcd sets d.Etcd from cc when the caller gave no client, and
// returns the client it made (nil when the caller's is used).
func (d *Deps) connectEtcd(cc election.ClientConfig) (*clientv3.Client, error) {
	if d.Etcd != nil {
		return nil, nil
	}
	if len(cc.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: an etcd client is required", ErrInvalidConfig)
	}
	if cc.Logger == nil {
		cc.Logger = d.Logger
	}
	cli, err := election.NewClient(cc)
	if err != nil {
		return nil, err
	}
	d.Etcd = cli
	return cli, nil
}

func newServer(cfg Config, deps Deps) (*Server, error) {
	g := &Server{
		cfg: cfg, deps: deps, log: deps.Logger.With("global", cfg.Name), metrics: newMetrics(),
		store: newStore(), hub: newHub(deps.Clock.Now), planner: newPlanner(cfg.Plan), errs: make(chan error, 2),
	}
	skew := newSkewWatch(cfg.Limits, g.log)
	if err := g.metrics.register(deps.Registerer); err != nil {
		return nil, err
	}
	if err := registerAll(deps.Registerer, skew.counter, newSkewCollector(g.store)); err != nil {
		return nil, err
	}
	var opts []grpc.ServerOption
	if cfg.TLSCert != "" {
		tc, err := serverTLS(cfg.TLSCert, cfg.TLSKey, cfg.TLSCA)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	// Keepalive, ping enforcement, streams per connection and the receive
	// cap (internal/grpcbounds).
	opts = append(opts, cfg.Keepalive.ServerOptions(cfg.Limits.MaxRecvMsgBytes)...)
	opts = append(opts, deps.GRPCServerOptions...)
	g.grpc = grpc.NewServer(opts...)
	isobarpb.RegisterGlobalControlServer(g.grpc, &syncService{
		lead: g, store: g.store, hub: g.hub, allowed: allowlist(cfg.Regions), mtls: cfg.TLSCert != "",
		limits: cfg.Limits, regionTTL: cfg.RegionTTL, skew: skew,
		clock: deps.Clock, log: g.log, metrics: g.metrics,
	})
	if cfg.HTTPListen != "-" || deps.HTTPListener != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("GET /debug/plan", g.servePlan)
		mux.HandleFunc("GET /debug/regions", g.serveRegions)
		g.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	return g, nil
}

// allowlist is the set of regions, nil (any region) when empty.
func allowlist(regions []string) map[string]bool {
	if len(regions) == 0 {
		return nil
	}
	allowed := map[string]bool{}
	for _, r := range regions {
		allowed[r] = true
	}
	return allowed
}

// Start listens, serves and campaigns. A second Start returns an error.
func (g *Server) Start(ctx context.Context) error {
	err := errors.New("global: already started")
	g.startOnce.Do(func() { err = g.start(ctx) })
	return err
}

func (g *Server) start(ctx context.Context) error {
	var err error
	if g.grpcLn = g.deps.GRPCListener; g.grpcLn == nil {
		if g.grpcLn, err = net.Listen("tcp", g.cfg.Listen); err != nil {
			return fmt.Errorf("global: listen %s: %w", g.cfg.Listen, err)
		}
	}
	if g.http != nil {
		if g.httpLn = g.deps.HTTPListener; g.httpLn == nil {
			if g.httpLn, err = net.Listen("tcp", g.cfg.HTTPListen); err != nil {
				_ = g.grpcLn.Close()
				return fmt.Errorf("global: listen %s: %w", g.cfg.HTTPListen, err)
			}
		}
	}
	adv := g.cfg.Advertise
	if adv == "" {
		adv = g.grpcLn.Addr().String()
	}
	g.id = g.cfg.Name + "@" + adv
	g.cand, err = election.NewCandidate(g.deps.Etcd, election.Config{Prefix: g.cfg.ElectionPrefix, ID: g.id, TTL: g.cfg.LeaseTTL},
		election.Deps{Logger: g.log, Clock: g.deps.Clock, Registerer: g.deps.Registerer})
	if err != nil {
		return err
	}
	ctx, g.cancel = context.WithCancel(ctx)
	g.wg.Go(func() {
		if err := g.grpc.Serve(g.grpcLn); err != nil {
			g.errs <- fmt.Errorf("global: grpc: %w", err)
		}
	})
	if g.http != nil {
		g.wg.Go(func() {
			if err := g.http.Serve(g.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				g.errs <- fmt.Errorf("global: http: %w", err)
			}
		})
	}
	g.wg.Go(func() {
		if err := g.cand.Run(ctx, g.lead); err != nil && ctx.Err() == nil {
			g.errs <- err
		}
	})
	g.log.Info("global controller started", "id", g.id, "grpc", g.grpcLn.Addr().String())
	return nil
}

// Stop resigns (a planned hand-off), closes streams and joins everything.
// Idempotent.
func (g *Server) Stop() {
	g.stopOnce.Do(func() {
		g.startOnce.Do(func() {})
		defer g.closeEtcd()
		if g.cancel == nil {
			return
		}
		g.cancel() // ends the term: Run resigns before returning
		stopped := make(chan struct{})
		go func() { g.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-g.deps.Clock.After(5 * time.Second):
			g.grpc.Stop()
			<-stopped
		}
		if g.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = g.http.Shutdown(ctx)
			cancel()
		}
		g.wg.Wait()
	})
}

// closeEtcd closes the client New made (none when the caller gave one).
func (g *Server) closeEtcd() {
	if g.ownedEtcd != nil {
		_ = g.ownedEtcd.Close()
	}
}

// Err yields fatal serve errors.
func (g *Server) Err() <-chan error { return g.errs }

// Addr is the gRPC address.
func (g *Server) Addr() string { return g.grpcLn.Addr().String() }

// HTTPAddr is the metrics/debug address ("" when disabled).
func (g *Server) HTTPAddr() string {
	if g.httpLn == nil {
		return ""
	}
	return g.httpLn.Addr().String()
}

// ID is the election value: name@advertised-address.
func (g *Server) ID() string { return g.id }

// IsLeader reports whether this member leads now.
func (g *Server) IsLeader() bool { return g.term() != nil }

// LastPlan is the last plan this member published (nil if none).
func (g *Server) LastPlan() *isobarpb.RoutingPlan { return g.lastPlan.Load() }

func (g *Server) term() <-chan struct{} {
	if l := g.current.Load(); l != nil {
		select {
		case <-l.Done:
			return nil
		default:
			return l.Done
		}
	}
	return nil
}

func (g *Server) leaderHint() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	id, _, err := election.Leader(ctx, g.deps.Etcd, g.cfg.ElectionPrefix)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return id
}

// LeaderAddress extracts the gRPC address from an election value.
func LeaderAddress(id string) (string, bool) {
	i := strings.LastIndexByte(id, '@')
	if i < 0 || i == len(id)-1 {
		return "", false
	}
	return id[i+1:], true
}

// planWriteTimeout is the least time a fenced plan write may take.
const planWriteTimeout = 2 * time.Second

// lead runs one term: plan every cycle until the term or ctx ends.
func (g *Server) lead(ctx context.Context, l *election.Leadership) error {
	g.current.Store(l)
	g.seq = 0
	g.metrics.leader.Set(1)
	g.metrics.epoch.Set(float64(l.Epoch))
	g.log.Info("leading", "epoch", l.Epoch)
	defer func() {
		g.current.Store(nil)
		g.hub.clear()
		g.metrics.leader.Set(0)
		g.metrics.epoch.Set(0)
		g.log.Info("term ended", "epoch", l.Epoch)
	}()
	t := g.deps.Clock.NewTicker(g.cfg.CycleInterval)
	defer t.Stop()
	for {
		if err := g.cycle(ctx, l); errors.Is(err, election.ErrNotLeader) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.Done:
			return nil
		case <-t.Chan():
		}
	}
}

// cycle plans, writes the plan to etcd under the fence and publishes it.
func (g *Server) cycle(ctx context.Context, l *election.Leadership) error {
	start := time.Now() // wall time for the cost metric only
	now := g.deps.Clock.Now()
	plan, st := g.planner.plan(now, g.store.snapshot(), g.cfg.RegionTTL, g.cfg.PlanTTL)
	g.metrics.solve.Observe(time.Since(start).Seconds())
	for _, c := range st.changes {
		g.log.Info("plan verdict changed", "model", c.model, "region", c.region, "verdict", c.verdict, "why", c.reason)
	}
	g.metrics.regions.WithLabelValues("live").Set(float64(st.live))
	g.metrics.regions.WithLabelValues("stale").Set(float64(st.stale))
	g.metrics.unknownAllowed.Add(float64(st.unknownAllowed))
	g.seq++
	plan.LeaderId, plan.Epoch, plan.Sequence = g.id, uint64(l.Epoch), g.seq
	b, err := proto.Marshal(plan)
	if err != nil {
		return err
	}
	// etcd may be slow (a loaded machine, a distant quorum): give the
	// fenced write at least planWriteTimeout, however short the cycle.
	wctx, cancel := context.WithTimeout(ctx, max(g.cfg.CycleInterval, planWriteTimeout))
	err = election.FencedPut(wctx, g.deps.Etcd, l, g.cfg.PlanKey, string(b))
	cancel()
	switch {
	case errors.Is(err, election.ErrNotLeader):
		g.metrics.planWrites.WithLabelValues("fenced").Inc()
		g.log.Warn("plan write fenced off: no longer the leader", "epoch", l.Epoch)
		return err
	case err != nil:
		// etcd unreachable: without the fence we cannot know we still lead,
		// so publish nothing; regions keep the last plan.
		g.metrics.planWrites.WithLabelValues("error").Inc()
		g.log.Warn("plan write failed; not publishing", "err", err)
		return nil
	}
	g.metrics.planWrites.WithLabelValues("ok").Inc()
	g.metrics.planSequence.Set(float64(g.seq))
	g.lastPlan.Store(plan)
	g.hub.publish(plan)
	return nil
}

func (g *Server) servePlan(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	p := g.lastPlan.Load()
	if p == nil {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": "no plan published by this member", "leader": g.IsLeader()})
		return
	}
	b, _ := protojson.MarshalOptions{Multiline: true}.Marshal(p)
	_, _ = w.Write(b)
}

// RegionStatus is one region as the leader sees it (GET /debug/regions);
// the shape is debugapi's, the contract statusview reads.
type RegionStatus = debugapi.RegionStatus

// Regions lists the summaries held, sorted by region, with their age.
func (g *Server) Regions() []RegionStatus {
	now := g.deps.Clock.Now()
	sums := g.store.snapshot()
	out := make([]RegionStatus, 0, len(sums))
	for r, rc := range sums {
		age := now.Sub(rc.at)
		out = append(out, RegionStatus{Region: r, AgeSeconds: age.Seconds(), Live: age <= g.cfg.RegionTTL,
			Sequence: rc.s.GetSequence(), Models: len(rc.s.GetModels()), Ingress: rc.s.GetIngressAddress(),
			ClockSkewSeconds: skewOf(rc).Seconds(), ClockSkewed: skewOf(rc) > g.cfg.Limits.MaxClockSkew || -skewOf(rc) > g.cfg.Limits.MaxClockSkew})
	}
	slices.SortFunc(out, func(a, b RegionStatus) int { return strings.Compare(a.Region, b.Region) })
	return out
}

func (g *Server) serveRegions(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"leader": g.IsLeader(), "regions": g.Regions()})
}

// Run starts a member and serves until ctx ends or serving fails.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	g, err := New(cfg, deps)
	if err != nil {
		return err
	}
	if err := g.Start(ctx); err != nil {
		return err
	}
	defer g.Stop()
	select {
	case <-ctx.Done():
		return nil
	case err := <-g.Err():
		return err
	}
}

func serverTLS(cert, key, ca string) (*tls.Config, error) {
	return certs.ServerConfig(cert, key, ca)
}
