package global

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/reqclass"
)

// Demand slices (issue 25): the planner plans each region's demand by
// (criticality, allowed regions), as its summary's demand_slices give it
// (none: all of demand_rps one standard, unpinned slice), with
// optimize.SolveSlices: under a shortfall sheddable demand is shed first,
// then standard, critical only when it alone exceeds what it may use; a
// pinned slice is never routed outside its allowed regions.

// planSlice is one demand slice of one model at one live ingress.
type planSlice struct {
	region int // index into live
	crit   reqclass.Criticality
	// allowed is the summary's list (sorted; nil: any); at are the live
	// regions among them (nil: any). A pinned slice none of whose regions
	// is live has nowhere (it is shed whole and not given to the solver).
	allowed []string
	at      []int
	nowhere bool
	rps     float64
	// sliced: the ingress's summary carried demand_slices (its plan then
	// carries slices).
	sliced bool
}

// key identifies the slice across cycles, for damping.
func (s planSlice) key(live []string) string {
	return live[s.region] + "|" + strconv.Itoa(int(s.crit)) + "|" + strings.Join(s.allowed, ",")
}

// modelSlices returns model's demand slices over the live regions, in
// region then summary order, and the number of allowed-region names that
// named no live region (dropped: a slice narrowed that way still never
// leaves its regions).
func modelSlices(model string, live []string, sums map[string]received) ([]planSlice, int) {
	index := make(map[string]int, len(live))
	for i, r := range live {
		index[r] = i
	}
	var out []planSlice
	dropped := 0
	for i, r := range live {
		var ms *isobarpb.ModelSummary
		for _, m := range sums[r].s.GetModels() {
			if m.GetModel() == model {
				ms = m
			}
		}
		ds := ms.GetDemandSlices()
		if len(ds) == 0 {
			out = append(out, planSlice{region: i, crit: reqclass.Standard, rps: ms.GetDemandRps()})
			continue
		}
		for _, d := range ds {
			s := planSlice{region: i, crit: reqclass.FromProto(d.GetCriticality()), rps: d.GetRps(), sliced: true}
			if len(d.GetAllowedRegions()) > 0 {
				s.allowed = slices.Clone(d.GetAllowedRegions())
				for _, a := range s.allowed {
					if j, ok := index[a]; ok {
						s.at = append(s.at, j)
					} else {
						dropped++
					}
				}
				s.nowhere = len(s.at) == 0
			}
			out = append(out, s)
		}
	}
	return out, dropped
}

// solverSlices returns the slices SolveSlices plans (those with
// somewhere to go) and, per planSlice, its index among them (−1: none).
func solverSlices(ps []planSlice) ([]optimize.Slice, []int) {
	var sl []optimize.Slice
	at := make([]int, len(ps))
	for k, s := range ps {
		at[k] = -1
		if s.nowhere {
			continue
		}
		at[k] = len(sl)
		sl = append(sl, optimize.Slice{Source: s.region, Band: int(s.crit), Allowed: s.at, RPS: s.rps})
	}
	return sl, at
}

// sliceRows is a plan per demand slice: each slice's fractions over the
// live regions and its shed, with the aggregate per region.
type sliceRows struct {
	keys []string
	fr   [][]float64
	shed []float64
	agg  optimize.Plan
}

// rowsOf lays out SolveSlices' plan per planSlice: a slice with nowhere
// to go sheds everything.
func rowsOf(ps []planSlice, live []string, at []int, sp optimize.SlicePlan) sliceRows {
	n := len(live)
	rows := sliceRows{keys: make([]string, len(ps)), fr: make([][]float64, len(ps)), shed: make([]float64, len(ps)), agg: sp.Plan}
	for k, s := range ps {
		rows.keys[k] = s.key(live)
		rows.fr[k] = make([]float64, n)
		if at[k] < 0 {
			rows.shed[k] = 1
			continue
		}
		copy(rows.fr[k], sp.Fractions[at[k]])
		rows.shed[k] = sp.Shed[at[k]]
	}
	return rows
}

// dampSlices moves prev a step of the way to target, slice by slice (a
// convex combination of two rows that are both 0 outside a slice's
// allowed regions, so the mix is too), with dampToward's exceptions: a
// slice prev does not have takes the target's row, and the target is
// taken outright when the mix sheds more than the target in any slice,
// is within minRoute of it everywhere, or is not a valid plan for prob
// (the aggregate, weighted by the slices' demand: a region loaded to
// capacity by a sudden demand change). Without demand_slices every
// region has one slice and this is the damping of the plans before them,
// bit for bit.
//
// optimize.Damp is not used: it keeps a plan no dearer than the previous
// one and than local-only in the latency model, so it holds on to a
// latency-cheaper spill the local-first target has dropped (a region
// would never come back home) and falls back to local-only shedding
// where the modelled marginal latency passes the shed penalty, even with
// room elsewhere. Local-first trades modelled latency for locality on
// purpose; the damping here only spreads a change over a few cycles.
func dampSlices(prob optimize.Problem, ps []planSlice, prev, target sliceRows, step float64) sliceRows {
	n := len(prob.Regions)
	old := make(map[string]int, len(prev.keys))
	for k, key := range prev.keys {
		old[key] = k
	}
	mixed := sliceRows{keys: target.keys, fr: make([][]float64, len(target.fr)), shed: make([]float64, len(target.fr))}
	near := true
	for k := range target.fr {
		p, ok := old[target.keys[k]]
		mixed.fr[k] = slices.Clone(target.fr[k])
		mixed.shed[k] = target.shed[k]
		if !ok || len(prev.fr[p]) != n {
			continue
		}
		for j := range n {
			mixed.fr[k][j] = prev.fr[p][j] + step*(target.fr[k][j]-prev.fr[p][j])
			near = near && math.Abs(mixed.fr[k][j]-target.fr[k][j]) < minRoute
		}
		mixed.shed[k] = prev.shed[p] + step*(target.shed[k]-prev.shed[p])
		if mixed.shed[k] > target.shed[k]+minRoute {
			return target
		}
		near = near && math.Abs(mixed.shed[k]-target.shed[k]) < minRoute
	}
	if near {
		return target
	}
	mixed.agg = aggregateRows(prob, ps, mixed)
	cost := optimize.Cost(prob, mixed.agg)
	if math.IsInf(cost, 0) || math.IsNaN(cost) {
		return target
	}
	mixed.agg.CostMs = cost
	return mixed
}

// aggregateRows is the per-region plan of the slice rows: each region's
// row the slices' rows weighted by their demand (prob's demands are the
// slices' sums), with the loads.
func aggregateRows(prob optimize.Problem, ps []planSlice, rows sliceRows) optimize.Plan {
	n := len(prob.Regions)
	agg := optimize.Plan{Fractions: make([][]float64, n), Shed: make([]float64, n), Load: make([]float64, n)}
	for i := range n {
		agg.Fractions[i] = make([]float64, n)
	}
	for k, s := range ps {
		d := prob.Regions[s.region].DemandRPS
		if s.nowhere || d <= 0 || s.rps < optimize.MinValue {
			continue
		}
		w := s.rps / d // 1 exactly for a region's only slice: today's rows
		for j, f := range rows.fr[k] {
			agg.Fractions[s.region][j] += w * f
		}
		agg.Shed[s.region] += w * rows.shed[k]
	}
	for i := range n {
		for j := range n {
			agg.Load[j] += agg.Fractions[i][j] * prob.Regions[i].DemandRPS
		}
	}
	return agg
}

// slicePlan turns one slice's row into its SlicePlan: negligible routes
// dropped and the rest renormalised with the shed to add up to 1; a row
// with nothing left sheds everything (a pinned slice never falls back to
// home, which may not be among its regions); a share outside the slice's
// live allowed regions is shed.
func slicePlan(s planSlice, live []string, fr []float64, shed float64) *isobarpb.SlicePlan {
	sp := &isobarpb.SlicePlan{Criticality: s.crit.Proto(), AllowedRegions: slices.Clone(s.allowed)}
	// A share outside the slice's regions (the solver never plans one)
	// is shed, never routed: residency before everything.
	for j, f := range fr {
		if f > 0 && s.at != nil && !slices.Contains(s.at, j) {
			shed += f
		}
	}
	keep := func(j int) bool { return s.at == nil || slices.Contains(s.at, j) }
	var ok bool
	if sp.Routes, sp.Shed, ok = routeRow(live, fr, shed, keep); !ok {
		sp.Routes, sp.Shed = nil, 1
	}
	return sp
}
