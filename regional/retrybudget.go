package regional

import (
	"context"
	"maps"
	"math"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// The dynamic retry budget. Each summary (summarybuilder.go) gives, per
// model, the region's utilisation: the load its Ready cells serve
// (load_rps, the engines' measured request rate) over their capacity at
// SLO (capacity_rps, the capacity estimator's). It is the honest signal
// for retries: what the local engines carry against what they can carry
// within the SLO, not the ingress demand (which includes what the plan
// sheds or sends to other regions). The registry turns it into each
// model's retry budget along xds.DefaultRetryBudgetCurve with the
// static budget (Config.XDS.RetryBudgetPercent) as its maximum, rounded to
// whole percent so that a utilisation that wobbles does not push xDS
// every summary. Without summaries (no etcd and no gossip) and with
// Config.StaticRetryBudget, every model keeps the static budget.

// utilisation is the load over capacity of each model of sm: 0 with
// neither, 1 (saturated) with load and no capacity.
func utilisation(sm *isobarpb.RegionSummary) map[string]float64 {
	out := make(map[string]float64, len(sm.GetModels()))
	for _, m := range sm.GetModels() {
		load, capRPS := m.GetLoadRps(), m.GetCapacityRps()
		switch {
		case capRPS > 0:
			out[m.GetModel()] = load / capRPS
		case load > 0:
			out[m.GetModel()] = 1
		default:
			out[m.GetModel()] = 0
		}
	}
	return out
}

// retryBudget is the published budget at utilisation u for a static
// budget of maxPercent: the curve's value rounded to whole percent (kept
// as is where rounding would leave (0, maxPercent]).
func retryBudget(u, maxPercent float64) float64 {
	b := xds.RetryBudgetAt(u, xds.DefaultRetryBudgetCurve(maxPercent))
	if q := math.Round(b); q > 0 && q <= maxPercent {
		return q
	}
	return b
}

// SetUtilisation hands the registry the region's utilisation per model
// (load over capacity); the next push carries the retry budgets it gives
// when they changed. Ignored with Config.StaticRetryBudget. The registry
// owns u after a nil return.
func (r *Registry) SetUtilisation(ctx context.Context, u map[string]float64) error {
	if u == nil {
		u = map[string]float64{}
	}
	return r.send(ctx, message{util: u})
}

// applyUtilisation recomputes the retry budgets and reports whether they
// changed (then the next cycle pushes).
func (r *Registry) applyUtilisation(u map[string]float64) bool {
	if r.cfg.StaticRetryBudget {
		return false
	}
	next := make(map[string]float64, len(u))
	for m, v := range u {
		next[m] = retryBudget(v, r.cfg.XDS.RetryBudgetPercent)
	}
	if maps.Equal(next, r.budgets) {
		return false
	}
	r.budgets, r.routesNew = next, true
	return true
}

// reportRetryBudgets sets isobar_regional_retry_budget_percent from the
// state being offered: each model's budget, the static one where it has
// none.
func (r *Registry) reportRetryBudgets(st xds.State) {
	r.metrics.retryBudget.Reset()
	for _, m := range st.Models {
		b := m.RetryBudgetPercent
		if b == 0 {
			b = r.cfg.XDS.RetryBudgetPercent
		}
		r.metrics.retryBudget.WithLabelValues(m.Name).Set(b)
	}
}

// SetPoolUtilisation hands the registry each model's pool utilisation
// (its load over the capacity of its Ready cells, penalised ones
// included): the bound on what an error-rate penalty may hold out
// (projection.PenaltyConfig.MaxLoadAfterHold). The registry owns u after a
// nil return.
func (r *Registry) SetPoolUtilisation(ctx context.Context, u map[string]float64) error {
	if u == nil {
		u = map[string]float64{}
	}
	return r.send(ctx, message{pool: u})
}
