package paper

import (
	"context"
	"time"

	"github.com/isobar-mesh/isobar/regional/xds"
)

// The retry-storm stage's brownout: the share of requests the browned-out
// site's engines answer 503, the site (the nearest, which every
// latency-aware policy prefers), and the load over the fleet's capacity.
const (
	brownoutShare  = 0.3
	brownoutSite   = 0
	retryStormLoad = 0.9
)

// external5xx is outlier detection's consecutive_5xx counter: at
// DataPlane.Eject5xx 5xx in a row the host is ejected (see eject) — not
// under the isobar policies unless DataPlane.IsobarEject5xx.
func (f *fleet) external5xx(c int) {
	if f.spec.policy.isobar() && !f.cfg.DataPlane.IsobarEject5xx {
		return
	}
	e := f.cells[c]
	e.consec5xx++
	if e.consec5xx >= f.cfg.DataPlane.Eject5xx && f.eject(c) {
		e.consec5xx = 0
	}
}

// utilisation is the region's utilisation as its controller sees it: its
// demand — the requests that reached the ingress over the last signal
// window, as the data plane reports them — over its capacity,
// spec.capacityRPS (the bench gives the controller the fleet's measured
// capacity as its estimate); 0 (unknown) without one. It drives the
// dynamic retry budget and bounds the error-rate penalty
// (projection.PenaltyConfig.MaxLoadAfterHold), as the regional
// controller's summaries do.
func (f *fleet) utilisation() float64 {
	d := f.cfg.DataPlane
	from := f.now - d.Window
	k := 0
	for k < len(f.arrivals) && f.arrivals[k] <= from {
		k++
	}
	f.arrivals = f.arrivals[k:]
	span := min(d.Window, f.now)
	if span > 0 && f.spec.capacityRPS > 0 {
		return float64(len(f.arrivals)) / span.Seconds() / f.spec.capacityRPS
	}
	return 0
}

// dynamicBudgetPercent is the retry budget the regional controller
// publishes (regional/xds RetryBudgetAt on the default curve, its
// maximum the static budget) at utilisation u.
func (f *fleet) dynamicBudgetPercent(u float64) float64 {
	curve := xds.DefaultRetryBudgetCurve(f.cfg.DataPlane.RetryBudgetPercent)
	if f.spec.budgetCurve != nil {
		curve = *f.spec.budgetCurve
	}
	pct := xds.RetryBudgetAt(u, curve)
	f.res.budget = append(f.res.budget, budgetSample{at: f.now, utilisation: u, percent: pct})
	return pct
}

// budgetSample is the dynamic retry budget at one control-plane tick.
type budgetSample struct {
	at                   time.Duration
	utilisation, percent float64
}

// retryStorm runs baseline_mixed at retryStormLoad × the fleet's
// capacity; from the end of the warm-up on, the engines of brownoutSite
// answer 503 to brownoutShare of the requests that reach them. rr, lr and
// isobar-static-budget keep the static budget (DataPlane.RetryBudgetPercent
// of the requests in flight); isobar runs the dynamic one.
func (r *runner) retryStorm(ctx context.Context) error {
	capRPS, err := r.fleetCapacity(ctx)
	if err != nil {
		return err
	}
	pl := r.plan
	c := class("baseline_mixed")
	seed := r.seed(StageRetryStorm, 0)
	w := workload{mix: []mixPart{{c, 1}}, rps: retryStormLoad * capRPS, duration: pl.sloWarm + pl.sloDur, seed: seed}
	reqs := w.generate(r.cfg.Profile)
	faults := []fault{{at: pl.sloWarm, kind: faultBrownout, site: brownoutSite, value: brownoutShare}}
	figs := map[Policy]Figures{}
	for _, p := range stagePolicies(StageRetryStorm) {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.digestOf(StageRetryStorm, p, digest(reqs))
		spec := runSpec{policy: p, requests: reqs, faults: faults, until: w.duration + drain, seed: seed,
			capacityRPS: capRPS, dynamicBudget: p == Isobar}
		res, err := r.trialSpec(spec)
		if err != nil {
			return err
		}
		f := retryFigures(r.cfg, res, pl.sloWarm, pl.sloWarm+pl.sloDur, c.SLO)
		f["capacity_rps"], f["offered_rps"] = num(capRPS), num(retryStormLoad*capRPS)
		figs[p] = f
		r.set(StageRetryStorm, p, f)
		r.progress(StageRetryStorm, "%s: attempts/request %.3f, success %.4f, budget %.1f %%",
			p, fig(f, "attempts_per_request"), fig(f, "success"), fig(f, "retry_budget_pct_mean"))
	}
	if st, dyn := figs[IsobarStaticBudget], figs[Isobar]; st != nil && dyn != nil {
		if s := fig(st, "success"); s > 0 {
			dyn["success_vs_static"] = num(fig(dyn, "success") / s)
		}
		if a := fig(st, "attempts_per_request"); a > 0 {
			dyn["attempts_vs_static"] = num(fig(dyn, "attempts_per_request") / a)
		}
	}
	return nil
}

// retryFigures are the retry-storm figures of the measured requests:
// attempts per request (every send to an engine counts), success, TTFT
// P95 and goodput, the share of attempts the browned-out site took, and
// the retry budget in effect (the static one, or the dynamic one's mean
// and the utilisation it was computed from).
func retryFigures(cfg Config, res runResult, from, to, slo time.Duration) Figures {
	keep := arrivedIn(from, to)
	st := summarise(res.requests, keep)
	attempts, atBrown := 0, 0
	for i := range res.requests {
		q := &res.requests[i]
		if !keep(q) {
			continue
		}
		attempts += q.attempts
		for _, c := range q.tried {
			if cfg.Topology.SiteOf(c) == brownoutSite {
				atBrown++
			}
		}
	}
	good := 0
	for _, t := range st.ttft {
		if t <= slo {
			good++
		}
	}
	n := float64(max(st.n, 1))
	f := Figures{
		"requests": num(float64(st.n)), "attempts_per_request": num(float64(attempts) / n),
		"success": num(st.success), "ttft_p95_ms": ms(st.ttftP95), "goodput": num(float64(good) / n),
		"brownout_site_attempt_share": num(float64(atBrown) / float64(max(attempts, 1))),
		"retry_budget_pct_mean":       num(cfg.DataPlane.RetryBudgetPercent), "utilisation_mean": nil,
	}
	var pct, u, k float64
	for _, b := range res.budget {
		if b.at >= from && b.at < to {
			pct, u, k = pct+b.percent, u+b.utilisation, k+1
		}
	}
	if k > 0 {
		f["retry_budget_pct_mean"], f["utilisation_mean"] = num(pct/k), num(u/k)
	}
	return f
}
