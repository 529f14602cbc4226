package global

import (
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/summary"
)

// minRoute: fractions below this are dropped from a plan (and the rest
// renormalised) so plans stay sparse.
const minRoute = 1e-4

// planner turns region summaries into routing plans. It keeps the previous
// optimum per model for damping. Not safe for concurrent use: owned by the
// leader loop.
type planner struct {
	cfg  PlanConfig
	prev map[string]prevPlan
	// verdicts holds, per model and region, the last verdict explained
	// (optimize.Explanation.Verdict), to report changes only.
	verdicts map[string]map[string]string
}

type prevPlan struct {
	regions []string
	demand  []float64
	plan    optimize.Plan // the aggregate per region
	rows    sliceRows     // per demand slice
}

// planStats describes one planning cycle.
type planStats struct {
	live, stale int
	models      int
	costMs      map[string]float64
	localOnlyMs map[string]float64
	// changes are the regions whose verdict (local, spill, shed, ...)
	// changed for a model this cycle, with the reason.
	changes []verdictChange
	// unknownAllowed counts the allowed-region names of demand slices
	// that named no live region (dropped from their slice; see
	// modelSlices).
	unknownAllowed int
}

// verdictChange is one region's new verdict for one model, as
// optimize.ExplainLocalFirst gives it for the solver's target plan.
type verdictChange struct {
	model, region, verdict, reason string
}

func newPlanner(cfg PlanConfig) *planner {
	return &planner{cfg: cfg, prev: map[string]prevPlan{}, verdicts: map[string]map[string]string{}}
}

// plan solves every model over the live regions and returns the full plan
// (without leader, epoch and sequence, which the caller sets).
func (pl *planner) plan(now time.Time, sums map[string]received, regionTTL, planTTL time.Duration) (*isobarpb.RoutingPlan, planStats) {
	st := planStats{costMs: map[string]float64{}, localOnlyMs: map[string]float64{}}
	var live []string
	for r, rc := range sums {
		if now.Sub(rc.at) <= regionTTL {
			live = append(live, r)
		} else {
			st.stale++
		}
	}
	slices.Sort(live)
	st.live = len(live)
	out := &isobarpb.RoutingPlan{IssuedAt: timestamppb.New(now), ValidUntil: timestamppb.New(now.Add(planTTL))}
	for _, r := range live {
		if a := sums[r].s.GetIngressAddress(); a != "" {
			out.Ingress = append(out.Ingress, &isobarpb.RegionIngress{Region: r, Address: a})
		}
	}
	models := map[string]bool{}
	for _, r := range live {
		for _, m := range sums[r].s.GetModels() {
			models[m.GetModel()] = true
		}
	}
	names := make([]string, 0, len(models))
	for m := range models {
		names = append(names, m)
	}
	slices.Sort(names)
	st.models = len(names)
	rtt := rttMatrix(live, sums)
	for _, model := range names {
		out.Plans = append(out.Plans, pl.planModel(model, live, sums, rtt, &st)...)
	}
	for m := range pl.prev {
		if !models[m] {
			delete(pl.prev, m)
			delete(pl.verdicts, m)
		}
	}
	return out, st
}

// planModel solves one model's demand slices over the live regions,
// damped toward its previous plan, and returns its per-ingress plans; it
// records the model's cost and verdict changes in st.
func (pl *planner) planModel(model string, live []string, sums map[string]received, rtt [][]float64, st *planStats) []*isobarpb.ModelPlan {
	ps, dropped := modelSlices(model, live, sums)
	st.unknownAllowed += dropped
	sl, at := solverSlices(ps)
	prob := pl.problem(model, live, sums, rtt)
	sp, err := optimize.SolveSlicesFills(prob, sl, pl.fills(model, live))
	if err != nil {
		return nil // validated input cannot fail; a model without a solution gets no plan
	}
	// The plan's demands are the slices' (demand_rps within the
	// summary's tolerance; a slice with nowhere to go is not planned).
	for i := range prob.Regions {
		prob.Regions[i].DemandRPS = 0
	}
	for _, s := range sl {
		if s.RPS >= optimize.MinValue {
			prob.Regions[s.Source].DemandRPS += s.RPS
		}
	}
	target := rowsOf(ps, live, at, sp)
	pl.noteVerdicts(model, prob, target.agg, st)
	chosen := target
	demand := make([]float64, len(live))
	for i := range live {
		demand[i] = prob.Regions[i].DemandRPS
	}
	if prev, ok := pl.prev[model]; ok && comparable(prev, live, demand) {
		chosen = dampSlices(prob, ps, prev.rows, target, pl.cfg.DampStep)
	}
	pl.prev[model] = prevPlan{regions: live, demand: demand, plan: chosen.agg, rows: chosen}
	st.costMs[model] = optimize.Cost(prob, chosen.agg)
	st.localOnlyMs[model] = optimize.Cost(prob, optimize.LocalOnly(prob))
	return ingressPlans(model, live, prob, ps, chosen)
}

// ingressPlans builds one ModelPlan per live ingress: routes and shed are
// the unpinned standard slice's (the aggregate row where the ingress has
// none), for readers that know no slices; slices carry every slice of an
// ingress whose summary gave demand_slices.
func ingressPlans(model string, live []string, prob optimize.Problem, ps []planSlice, chosen sliceRows) []*isobarpb.ModelPlan {
	var plans []*isobarpb.ModelPlan
	for i, r := range live {
		sliced := slices.ContainsFunc(ps, func(s planSlice) bool { return s.region == i && s.sliced })
		var mp *isobarpb.ModelPlan
		switch {
		case prob.Regions[i].DemandRPS <= 0 && prob.Regions[i].CapacityRPS > 0:
			// No demand: nothing to split. Demand that appears before
			// the next cycle is served locally, never shed on a share
			// computed for no traffic (its slices say where a pinned
			// request may go).
			mp = &isobarpb.ModelPlan{Model: model, IngressRegion: r, Routes: []*isobarpb.Route{{Destination: r, Fraction: 1}}}
		case prob.Regions[i].DemandRPS <= 0 && !sliced:
			continue
		default:
			fr, shed := chosen.agg.Fractions[i], chosen.agg.Shed[i]
			for k, s := range ps {
				if s.region == i && s.sliced && s.crit == reqclass.Standard && s.allowed == nil && s.rps >= optimize.MinValue {
					fr, shed = chosen.fr[k], chosen.shed[k]
				}
			}
			mp = modelPlan(model, r, live, fr, shed)
		}
		for k, s := range ps {
			if s.region == i && s.sliced {
				mp.Slices = append(mp.Slices, slicePlan(s, live, chosen.fr[k], chosen.shed[k]))
			}
		}
		plans = append(plans, mp)
	}
	return plans
}

// problem is model's routing problem over the live regions' summaries.
func (pl *planner) problem(model string, live []string, sums map[string]received, rtt [][]float64) optimize.Problem {
	prob := optimize.Problem{
		Regions: make([]optimize.Region, len(live)), RTTms: rtt, Headroom: pl.cfg.Headroom,
		Beta: pl.cfg.Beta, K: pl.cfg.K, ShedPenaltyMs: pl.cfg.ShedPenaltyMs,
	}
	for i, r := range live {
		reg := optimize.Region{Name: r}
		for _, m := range sums[r].s.GetModels() {
			if m.GetModel() == model {
				reg.DemandRPS, reg.CapacityRPS, reg.EngineLatencyMs = m.GetDemandRps(), m.GetCapacityRps(), m.GetEngineLatencyMs()
			}
		}
		if reg.EngineLatencyMs <= 0 {
			reg.EngineLatencyMs = 300
		}
		prob.Regions[i] = reg
	}
	return prob
}

// noteVerdicts records in st each region whose local-first verdict for
// model changed since the last plan.
func (pl *planner) noteVerdicts(model string, prob optimize.Problem, target optimize.Plan, st *planStats) {
	ex, err := optimize.ExplainLocalFirst(prob, pl.cfg.LocalFill, target)
	if err != nil {
		return
	}
	seen := pl.verdicts[model]
	if seen == nil {
		seen = map[string]string{}
		pl.verdicts[model] = seen
	}
	for _, e := range ex {
		if seen[e.Region] != e.Verdict {
			seen[e.Region] = e.Verdict
			st.changes = append(st.changes, verdictChange{model: model, region: e.Region, verdict: e.Verdict, reason: e.Reason})
		}
	}
}

// maxHysteresisFill caps a local fill raised by the hysteresis band: at
// 1 the home region would be planned at capacity·headroom itself.
const maxHysteresisFill = 0.97

// fills returns each live region's local fill share for model: LocalFill
// for a region that spilled or shed in the previous plan, LocalFill plus
// the hysteresis band for one that kept its demand home (or is new), so a
// region hovering at its threshold does not flap.
func (pl *planner) fills(model string, live []string) []float64 {
	out := make([]float64, len(live))
	prev, havePrev := pl.prev[model]
	if havePrev && !slices.Equal(prev.regions, live) {
		havePrev = false
	}
	for i := range live {
		out[i] = pl.cfg.LocalFill
		if pl.cfg.LocalFillBand <= 0 {
			continue
		}
		spilling := havePrev && (prev.plan.Fractions[i][i] < 1-minRoute || prev.plan.Shed[i] >= minRoute)
		if !spilling {
			out[i] = min(max(pl.cfg.LocalFill, maxHysteresisFill), pl.cfg.LocalFill+pl.cfg.LocalFillBand)
		}
	}
	return out
}

// comparable reports whether damping toward the new optimum makes sense:
// the same regions, and no region whose demand just appeared (a row
// planned for no demand says nothing about how to split real demand).
func comparable(prev prevPlan, regions []string, demand []float64) bool {
	if !slices.Equal(prev.regions, regions) {
		return false
	}
	for i, d := range demand {
		if d > 0 && prev.demand[i] <= 0 {
			return false
		}
	}
	return true
}

// modelPlan drops negligible routes and renormalises so routes + shed sum
// to exactly 1; a row with nothing left routes home.
func modelPlan(model, ingress string, regions []string, fr []float64, shed float64) *isobarpb.ModelPlan {
	mp := &isobarpb.ModelPlan{Model: model, IngressRegion: ingress}
	var ok bool
	if mp.Routes, mp.Shed, ok = routeRow(regions, fr, shed, nil); !ok {
		mp.Routes, mp.Shed = []*isobarpb.Route{{Destination: ingress, Fraction: 1}}, 0
	}
	return mp
}

// routeRow is one plan row as routes: the shares of at least minRoute to
// regions[j] (only j that keep allows, when keep is not nil) and the shed
// (0 below minRoute), renormalised to add up to exactly 1; ok is false
// when nothing is left to renormalise.
func routeRow(regions []string, fr []float64, shed float64, keep func(j int) bool) (routes []*isobarpb.Route, outShed float64, ok bool) {
	if shed < minRoute {
		shed = 0
	}
	var sum float64
	for j, f := range fr {
		if f >= minRoute && (keep == nil || keep(j)) {
			routes = append(routes, &isobarpb.Route{Destination: regions[j], Fraction: f})
			sum += f
		}
	}
	if sum+shed <= 0 {
		return nil, 0, false
	}
	scale := 1 / (sum + shed)
	for _, r := range routes {
		r.Fraction *= scale
	}
	return routes, shed * scale, true
}

// rttMatrix builds the symmetric RTT matrix (ms) the leader plans with
// from the regions' latest summaries: summary.RTTMatrix, the one place
// that decides between a pair's measured RTT (mean of both directions when
// both listed it, one when only one did: a region lists its nearest peers)
// and the estimate from the two regions' network coordinates; +Inf
// (unreachable) when neither is known.
func rttMatrix(regions []string, sums map[string]received) [][]float64 {
	list := make([]*isobarpb.RegionSummary, len(regions))
	for i, r := range regions {
		list[i] = sums[r].s
	}
	return summary.RTTMatrix(regions, list, nil)
}
