package regional

import (
	"time"
)

// A mass TTL expiry: when a large share of a region's live cells pass
// their TTL in the same sweep, the likelier cause is this controller, not
// the cells: a process stalled past the TTL (CPU throttling, a VM pause,
// a stop signal), or too overloaded to read the heartbeats already sent.
// Failing them all would empty the region's data plane of cells that are
// serving. So the sweep holds them (they keep their state and weight)
// while at least Config.MassExpiry.Fraction of the live cells, and at
// least massExpiryMinCells, are past their TTL, for at most
// Config.MassExpiry.Hold; cells whose heartbeats resume are simply live
// again, and what is still expired when the hold ends is failed.
//
// Others do likewise. Kubernetes's node lifecycle controller treats a zone
// as unhealthy when at least unhealthyZoneThreshold (0.55 by default, and
// no fewer than 3 nodes) of its nodes are NotReady, and then slows or
// stops evictions (pkg/controller/nodelifecycle/config/types.go); Envoy
// balances over every host of a cluster, ignoring health, once fewer
// than the panic threshold (50 % by default) are healthy
// (docs/root/intro/arch_overview/upstream/load_balancing/panic_threshold.rst).
// isobar's hold is bounded: a broken stream still makes a cell suspect
// (weight 0) at once, and the data plane still ejects an endpoint that
// refuses connections, so a real correlated death costs at most the hold
// in TTL failures.

// massExpiryMinCells is the fewest cells past their TTL at once that can
// make a mass expiry: one or two silent cells are failed as usual however
// small the region.
const massExpiryMinCells = 3

// massExpiry is a mass expiry in progress (registry goroutine only).
type massExpiry struct {
	since time.Time // when it began; zero: none
	spent bool      // held for Hold already: its cells are being failed
	held  int       // cells held by the last sweep
}

// holdMassExpiry reports whether the sweep at now holds its expired cells
// (expired of live are past their TTL) rather than failing them, and keeps
// the hold's state, log and metrics.
func (r *Registry) holdMassExpiry(now time.Time, expired, live int) bool {
	cfg := r.cfg.MassExpiry
	m := &r.mass
	mass := cfg.Hold > 0 && expired >= massExpiryMinCells && float64(expired) >= cfg.Fraction*float64(live)
	switch {
	case !mass:
		if !m.since.IsZero() && !m.spent {
			r.log.Info("mass TTL expiry over: heartbeats are back", "held_for", now.Sub(m.since).Round(time.Millisecond))
		}
		*m = massExpiry{}
	case m.since.IsZero():
		m.since = now
		r.metrics.massExpiries.Inc()
		r.log.Warn("most cells passed their TTL at once: more likely this controller stalled or fell behind reading heartbeats than the cells died; holding them",
			"expired", expired, "live", live, "hold", cfg.Hold)
	case now.Sub(m.since) >= cfg.Hold:
		if !m.spent {
			r.log.Warn("mass TTL expiry held for its whole bound; failing the cells still silent",
				"expired", expired, "live", live, "held_for", now.Sub(m.since).Round(time.Millisecond))
		}
		m.spent, mass = true, false
	}
	if mass {
		m.held = expired
	} else {
		m.held = 0
	}
	r.metrics.ttlHeld.Set(float64(m.held))
	return mass
}
