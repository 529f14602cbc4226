package regional

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// routeSetter is where the route table in force is served from.
type routeSetter interface {
	SetRoutes(ctx context.Context, t *RouteTable) error
}

var _ routeSetter = (*Registry)(nil)

// routeKeeper owns the route table in force and the plan fence: it
// validates leaders' plans against the fence, and installs plans and
// fallback tables into the registry.
//
// Concurrency: mu serialises table changes (the leader session's plans
// and the summaries loop's fallbacks) and guards the fence; the table in
// force is an atomic pointer, read by Routes from any goroutine.
type routeKeeper struct {
	region       string
	maxClockSkew time.Duration
	reg          routeSetter
	clock        clockwork.Clock
	log          *slog.Logger
	metrics      *metrics

	table atomic.Pointer[RouteTable]
	mu    sync.Mutex // serialises table changes
	// fence is the highest plan ever applied (guarded by mu): kept
	// through fallback, and through restarts via fences when set.
	fence  *RouteTable
	fences FenceStore
}

func newRouteKeeper(cfg syncConfig, d syncDeps, log *slog.Logger) *routeKeeper {
	return &routeKeeper{
		region: cfg.Region, maxClockSkew: cfg.MaxClockSkew, reg: d.Registry,
		clock: d.Clock, log: log, metrics: d.Metrics,
	}
}

// Routes returns the route table in force (nil before any).
func (k *routeKeeper) Routes() *RouteTable { return k.table.Load() }

// planInForce reports whether a leader's plan is in force at now; when
// not, the fallback takes over.
func (k *routeKeeper) planInForce(now time.Time) bool {
	cur := k.table.Load()
	return cur != nil && cur.Source == RoutesPlan && now.Before(cur.ValidUntil)
}

// install hands t to the registry and then makes it the table in force.
// Both happen under k.mu, so the plan stream and the summaries loop, which
// both install, hand tables to the registry in the order /debug/routes
// (k.table) shows them, and a table the registry did not take (it stopped,
// or ctx ended) is never shown: /debug/routes and the table the registry
// serves from cannot disagree.
func (k *routeKeeper) install(ctx context.Context, t *RouteTable) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.reg.SetRoutes(ctx, t); err != nil {
		if ctx.Err() == nil {
			k.log.Warn("route table not installed", "err", err)
		}
		return
	}
	prev := k.table.Swap(t)
	if prev == nil || prev.Source != t.Source {
		k.log.Info("cross-region routing source changed", "source", t.Source, "epoch", t.Epoch)
	}
	k.metrics.routeSource.Reset()
	k.metrics.routeSource.WithLabelValues(t.Source).Set(1)
}

// applyPlan validates a plan against the fence and installs it, or counts
// the refusal. An applied plan raises the fence (and saves it).
func (k *routeKeeper) applyPlan(ctx context.Context, p *isobarpb.RoutingPlan) {
	now := k.clock.Now()
	k.mu.Lock()
	t, err := planTable(p, k.region, k.fence, k.planInForce(now), now, k.maxClockSkew)
	if err == nil {
		k.fence = t
	}
	k.mu.Unlock()
	k.metrics.plans.WithLabelValues(planResult(err)).Inc()
	if err != nil {
		k.log.Warn("routing plan refused", "epoch", p.GetEpoch(), "sequence", p.GetSequence(), "err", err)
		return
	}
	if k.fences != nil {
		if err := k.fences.SaveFence(Fence{Epoch: t.Epoch, Sequence: t.Sequence}); err != nil {
			k.log.Warn("plan fence not saved; after a restart this region may accept an older leader's plan", "err", err)
		}
	}
	k.metrics.planEpoch.Set(float64(t.Epoch))
	k.install(ctx, t)
}
