package regional

import (
	"context"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/capacity"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/residency"
)

// GlobalConfig configures this region's part in cross-region routing.
type GlobalConfig struct {
	// ElectionPrefix where the global leader is found in etcd. Default
	// election.DefaultPrefix ("/isobar/global/election/").
	ElectionPrefix string
	// Keepalive of the Sync stream's connection to the leader: a leader
	// that vanished without closing is noticed within Time + Timeout
	// (internal/grpcbounds defaults: 10 s + 5 s).
	Keepalive grpcbounds.Client
	// SummaryInterval between summaries (to the leader and to gossip).
	// Default 1 s.
	SummaryInterval time.Duration
	// NominalCellRPS is the cold-start prior of one healthy cell's
	// capacity at SLO (requests/s): a cell starts there and moves to what
	// its engine shows as measurements arrive (Capacity, package
	// regional/capacity); either is scaled down by the cell's outlier
	// penalty. Default 1.3 (the 70B-AWQ profile's knee).
	NominalCellRPS float64
	// Capacity tunes the capacity estimator (TTFT SLO, smoothing,
	// evidence); its PriorRPS is NominalCellRPS. Zero fields take the
	// estimator's defaults.
	Capacity capacity.Config
	// IngressAddress (IP:port) is where other regions send traffic for
	// this one; advertised in the summary.
	IngressAddress string
	// DefaultEngineLatencyMs is the low-load latency used until cells
	// report a TTFT. Default 300.
	DefaultEngineLatencyMs float64
	// NearestRTT is how many measured RTTs the summary lists, nearest
	// first; the global estimates the rest from the region's gossip
	// coordinate (summary.RTTMatrix). Default summary.DefaultNearestRTT
	// (8); at most summary.MaxNearestRTT; negative lists every region (the
	// summary then grows with the regions, as before issue 26).
	NearestRTT int
	// FallbackSummaryTTL: gossiped summaries older than this are ignored by
	// the fallback. Default 10 s.
	FallbackSummaryTTL time.Duration
	// BackoffMin/Max bound the jittered reconnect backoff. Defaults 100 ms
	// and 5 s.
	BackoffMin, BackoffMax time.Duration
	// DemandTau is the time constant of the demand reported for planning
	// (an exponentially weighted mean of the measured rate, each sample
	// clipped to a Poisson upper bound above the estimate; see
	// demandSmoother). Default 30 s; negative turns smoothing off.
	DemandTau time.Duration
	// Fallback optimiser parameters (the global's defaults). LocalFill: a
	// region's demand stays home while under LocalFill·capacity·Headroom
	// (0: optimize.DefaultLocalFill).
	Headroom, Beta, K, ShedPenaltyMs, LocalFill float64
}

func (g *GlobalConfig) withDefaults() {
	if g.ElectionPrefix == "" {
		g.ElectionPrefix = election.DefaultPrefix
	}
	if g.SummaryInterval == 0 {
		g.SummaryInterval = time.Second
	}
	if g.NominalCellRPS == 0 {
		g.NominalCellRPS = capacity.DefaultPriorRPS
	}
	g.Capacity.PriorRPS = g.NominalCellRPS
	g.Capacity = g.Capacity.WithDefaults()
	if g.DemandTau == 0 {
		g.DemandTau = 30 * time.Second
	}
	if g.DefaultEngineLatencyMs == 0 {
		g.DefaultEngineLatencyMs = 300
	}
	if g.FallbackSummaryTTL == 0 {
		g.FallbackSummaryTTL = 10 * time.Second
	}
	if g.BackoffMin == 0 {
		g.BackoffMin = 100 * time.Millisecond
	}
	if g.BackoffMax == 0 {
		g.BackoffMax = 5 * time.Second
	}
	m := optimize.Model{Headroom: g.Headroom, Beta: g.Beta, K: g.K, ShedPenaltyMs: g.ShedPenaltyMs}.WithDefaults()
	g.Headroom, g.Beta, g.K, g.ShedPenaltyMs = m.Headroom, m.Beta, m.K, m.ShedPenaltyMs
}

// gossiper is what the region needs from its gossip node. Each part of
// the syncer declares the slice of it that it uses.
type gossiper interface {
	summaryGossip
	peerSource
}

// summaryGossip takes this region's summary for gossip.
type summaryGossip interface {
	SetLocalSummary(*isobarpb.RegionSummary) error
}

// settledSignal is closed once the region's cells are back after a start
// (Registry.Settled, warmstart.go).
type settledSignal interface {
	settledC() <-chan struct{}
}

var (
	_ gossiper      = (*gossip.Node)(nil)
	_ settledSignal = (*Registry)(nil)
)

// syncConfig holds the values the syncer runs with.
type syncConfig struct {
	Global GlobalConfig
	// Region is this region's name.
	Region string
	// MTLS: this controller runs with TLS, so the global leader must be
	// reached over mTLS too.
	MTLS bool
	// MaxClockSkew tolerated on a plan's issue time (Limits.MaxClockSkew).
	MaxClockSkew time.Duration
	// DataPlaneWindow: the window of the data planes' demand reports,
	// which the demand smoother's clipping takes as its sample span.
	DataPlaneWindow time.Duration
	// Residency maps the data planes' residency sets to regions for the
	// summary's demand slices (nil: none).
	Residency *residency.Config
	// FleetRegions: Config.FleetRegions.
	FleetRegions []string
}

// syncConfigOf takes the syncer's values from the controller's config.
func syncConfigOf(cfg Config) syncConfig {
	return syncConfig{
		Global: cfg.Global, Region: cfg.Region, MTLS: cfg.TLS.Enabled(),
		MaxClockSkew: cfg.Limits.MaxClockSkew, DataPlaneWindow: cfg.DataPlaneWindow, Residency: cfg.Residency,
		FleetRegions: cfg.FleetRegions,
	}
}

// utilisationSink takes the region's utilisation per model, from which
// the retry budgets follow (retrybudget.go).
type utilisationSink interface {
	SetUtilisation(ctx context.Context, u map[string]float64) error
	SetPoolUtilisation(ctx context.Context, u map[string]float64) error
}

var _ utilisationSink = (*Registry)(nil)

// syncDeps are the syncer's collaborators.
type syncDeps struct {
	// Registry serves the route table and is summarised.
	Registry *Registry
	// Etcd finds the global leader (nil: no leader session).
	Etcd *clientv3.Client
	// Gossip spreads the summary and reports peers (nil: none).
	Gossip gossiper
	// Demand reports the ingress demand per model (nil: the view's).
	Demand func() map[string]float64
	// DialOptions dial the global leader.
	DialOptions []grpc.DialOption
	// Clock (nil: the real clock), Log (nil: discard) and Metrics.
	Clock   clockwork.Clock
	Log     *slog.Logger
	Metrics *metrics
}

// syncer connects the region to the global leader. It composes four
// parts, each owning its own state: the summary builder (summaries of the
// registry's view), the fallback planner (local-first routing from the
// gossiped summaries), the route keeper (the table in force and the plan
// fence, under its mutex) and the leader session (leader lookup and the
// Sync stream).
//
// Goroutines: run (the leader session) and summaries (summary building,
// gossip, fallback), both owned by the controller's ctx.
type syncer struct {
	interval time.Duration
	settled  settledSignal
	gossip   summaryGossip // nil: no gossip
	util     utilisationSink
	watch    *residencyWatch
	peers    peerSource // nil: no gossip
	clock    clockwork.Clock
	log      *slog.Logger

	summary *summaryBuilder
	planner *fallbackPlanner
	routes  *routeKeeper
	leader  *leaderSession
}

func newSyncer(cfg syncConfig, d syncDeps) *syncer {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	log := d.Log.With("component", "globalsync")
	s := &syncer{
		interval: cfg.Global.SummaryInterval, settled: d.Registry, util: d.Registry, clock: d.Clock, log: log,
		summary: newSummaryBuilder(cfg, d, log),
		planner: newFallbackPlanner(cfg, d),
		routes:  newRouteKeeper(cfg, d, log),
	}
	if d.Gossip != nil {
		s.gossip, s.peers = d.Gossip, d.Gossip
	}
	s.watch = newResidencyWatch(cfg.Residency, cfg.Region, cfg.FleetRegions, d.Metrics)
	s.leader = newLeaderSession(cfg, d, s.summary, s.routes, log)
	return s
}

// observeRegions shows the residency watch the gossip peers and the
// route table in force.
func (s *syncer) observeRegions() {
	if len(s.watch.named) == 0 {
		return
	}
	var peers []string
	if s.peers != nil {
		for r := range s.peers.Summaries() {
			peers = append(peers, r)
		}
	}
	s.watch.observe(peers, s.routes.Routes())
}

// Routes returns the route table in force (nil before any).
func (s *syncer) Routes() *RouteTable { return s.routes.Routes() }

// useFences makes the syncer keep its plan fence in st, starting from
// what st holds. Call before the syncer runs.
func (s *syncer) useFences(st FenceStore) error { return s.routes.useFences(st) }

// run keeps a Sync session with the current leader.
func (s *syncer) run(ctx context.Context) { s.leader.run(ctx) }

// summaries builds a summary every interval, gossips it, and switches to
// the fallback when the plan has expired.
func (s *syncer) summaries(ctx context.Context) {
	t := s.clock.NewTicker(s.interval)
	defer t.Stop()
	for {
		// A starting controller holds back until its cells are back
		// (Registry.Settled, warmstart.go): a summary or a fallback built
		// from the cells that reconnected first would tell the leader and
		// the gossip peers the region has lost capacity, and route on it.
		select {
		case <-ctx.Done():
			return
		case <-s.settled.settledC(): // closed once; the first summary follows at once
		}
		now := s.clock.Now()
		sm, pool := s.summary.buildPools(now)
		if s.gossip != nil {
			if err := s.gossip.SetLocalSummary(sm); err != nil {
				s.log.Warn("summary not gossiped", "err", err)
			}
		}
		if err := s.util.SetUtilisation(ctx, utilisation(sm)); err != nil && ctx.Err() == nil {
			s.log.Warn("utilisation not handed to the registry; retry budgets keep their last values", "err", err)
		}
		if err := s.util.SetPoolUtilisation(ctx, pool); err != nil && ctx.Err() == nil {
			s.log.Warn("pool utilisation not handed to the registry; penalties keep the last bound", "err", err)
		}
		if !s.routes.planInForce(now) {
			s.routes.install(ctx, s.planner.plan(now, sm))
		}
		s.observeRegions()
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}
