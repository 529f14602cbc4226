package optimize

import (
	"math"
	"slices"
	"strconv"
)

// Routing, SolveSlices' second phase: the admitted demand placed as
// SolveLocalFirst places demand.
//
// Slices of one source with the same Allowed set share one route (a
// routeGroup): the source's unconstrained slices are the source region
// itself; a constrained set becomes a virtual source region of the
// residual problem, with no capacity, the source's engine latency, and
// the source's RTT row toward its allowed regions (+Inf toward the rest
// and toward the other virtual regions), so no solver step can place it
// outside them. The local stage treats the source as every group's home:
// the source keeps min(home demand, fill·capacity·headroom) at home, the
// home demand being its groups' that may stay there, pinned groups first
// (see shareHome). Solve places the rest, as in SolveLocalFirstFills.

// routeGroup is the admitted demand of one source's slices with one
// Allowed set.
type routeGroup struct {
	source  int
	allowed []int // nil: any region
	node    int   // its region in the residual problem
	members []int // slice indexes
	demand  float64
	local   float64 // served at home in the local stage
}

// home reports whether g may be served at its source.
func (g *routeGroup) home() bool {
	return g.allowed == nil || slices.Contains(g.allowed, g.source)
}

// routeSlices routes the admitted demand of every slice (q has its
// defaults, fills are resolved) and builds the SlicePlan.
func routeSlices(q Problem, sl []Slice, admitted, fills []float64) SlicePlan {
	n := len(q.Regions)
	groups := routeGroups(q, sl, admitted)
	res, anyResidual := residualSlices(q, groups, fills)
	var rp Plan
	if anyResidual {
		rp = solveModel(res, true)
	}
	out := newSlicePlan(len(sl), n)
	out.Plan = newPlan(n)
	fr := make([]float64, n)
	for g := range groups {
		gr := &groups[g]
		if q.Regions[gr.source].Down {
			continue
		}
		shed := groupRow(q, res, rp, anyResidual, gr, fr)
		chargeShed(sl, admitted, gr, shed, fr, out)
		if g < n && q.Regions[g].DemandRPS < MinValue {
			// A source without demand: the row a new request takes.
			copy(out.Plan.Fractions[g], fr)
			out.Plan.Shed[g] = shed
		}
	}
	aggregate(q, sl, &out)
	// As in SolveLocalFirstFills, the gap is the residual solve's.
	out.Plan.Gap = 0
	if anyResidual {
		out.Plan.Iterations, out.Plan.Gap = rp.Iterations, rp.Gap
	}
	return out
}

// routeGroups returns one group per region (its unconstrained slices,
// node i) then one per constrained (source, Allowed) of an up source, in
// slice order.
func routeGroups(q Problem, sl []Slice, admitted []float64) []routeGroup {
	n := len(q.Regions)
	groups := make([]routeGroup, n, n+8)
	for i := range n {
		groups[i] = routeGroup{source: i, node: i}
	}
	index := map[string]int{}
	for k, s := range sl {
		g := s.Source
		if s.Allowed != nil && !q.Regions[s.Source].Down {
			key := allowedKey(s.Allowed) + "@" + strconv.Itoa(s.Source)
			at, ok := index[key]
			if !ok {
				at = len(groups)
				index[key] = at
				allowed := slices.Clone(s.Allowed)
				slices.Sort(allowed)
				groups = append(groups, routeGroup{source: s.Source, allowed: allowed, node: at})
			}
			g = at
		}
		groups[g].members = append(groups[g].members, k)
		groups[g].demand += admitted[k]
	}
	return groups
}

// residualSlices runs the local stage (setting each group's local) and
// returns the residual problem of the rest: the n regions with their
// residual capacity and unconstrained demand, then one virtual region per
// constrained group; anyResidual reports whether any demand is left.
func residualSlices(q Problem, groups []routeGroup, fills []float64) (Problem, bool) {
	n := len(q.Regions)
	homeDem := make([]float64, n)
	for g := range groups {
		if groups[g].home() {
			homeDem[groups[g].source] += groups[g].demand
		}
	}
	res := q
	res.Regions = make([]Region, len(groups))
	copy(res.Regions, q.Regions)
	byHome := make([]float64, n)
	for i, r := range q.Regions {
		res.Regions[i].DemandRPS = 0
		if !r.Down && r.CapacityRPS >= MinValue && homeDem[i] >= MinValue {
			l := math.Min(homeDem[i], fills[i]*r.CapacityRPS*q.Headroom)
			res.Regions[i].CapacityRPS = math.Max(0, r.CapacityRPS-l/q.Headroom)
			byHome[i] = l
		}
	}
	shareHome(groups, byHome)
	equaliseLatencies(res.Regions[:n])
	anyResidual := false
	for g := range groups {
		gr := &groups[g]
		rest := 0.0
		if !q.Regions[gr.source].Down {
			rest = math.Max(0, gr.demand-gr.local)
		}
		if g >= n {
			src := q.Regions[gr.source]
			res.Regions[g] = Region{Name: src.Name, EngineLatencyMs: src.EngineLatencyMs}
		}
		res.Regions[g].DemandRPS = rest
		if rest >= MinValue {
			anyResidual = true
		}
	}
	if len(groups) > n {
		res.RTTms = virtualRTT(q.RTTms, groups)
	}
	return res, anyResidual
}

// shareHome shares each region's local capacity, home[i], between the
// groups of source i that may stay home: the pinned groups first, those
// with the fewest allowed regions first (they have the fewest places to
// go), then the unconstrained one, whose excess may go anywhere.
func shareHome(groups []routeGroup, home []float64) {
	n := len(home)
	order := make([]int, 0, len(groups)-n)
	for g := n; g < len(groups); g++ {
		if groups[g].home() {
			order = append(order, g)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(groups[a].allowed) - len(groups[b].allowed) })
	for _, g := range order {
		gr := &groups[g]
		gr.local = math.Min(gr.demand, home[gr.source])
		home[gr.source] -= gr.local
	}
	for i := range n {
		groups[i].local = math.Min(groups[i].demand, home[i])
	}
}

// virtualRTT extends rtt with one row and column per constrained group:
// its source's RTT to its allowed regions, +Inf to the rest and to the
// other virtual regions, 0 to itself.
func virtualRTT(rtt [][]float64, groups []routeGroup) [][]float64 {
	n, N := len(rtt), len(groups)
	inf := math.Inf(1)
	out := make([][]float64, N)
	flat := make([]float64, N*N)
	for i := range out {
		out[i] = flat[i*N : (i+1)*N : (i+1)*N]
	}
	for i := range n {
		copy(out[i], rtt[i])
	}
	for v := n; v < N; v++ {
		row := out[v]
		for j := range N {
			row[j], out[j][v] = inf, inf
		}
		row[v] = 0
		for _, j := range groups[v].allowed {
			row[j] = rtt[groups[v].source][j]
			out[j][v] = row[j]
		}
	}
	return out
}

// groupRow writes group gr's row over the real regions into fr and
// returns its shed share, as SolveLocalFirstFills builds a row.
func groupRow(q, res Problem, rp Plan, anyResidual bool, gr *routeGroup, fr []float64) float64 {
	n := len(q.Regions)
	clear(fr)
	d, src := gr.demand, gr.source
	switch {
	case d < MinValue:
		return idleRow(q, rp, anyResidual, gr, fr)
	case gr.local >= d || !anyResidual || res.Regions[gr.node].DemandRPS < MinValue:
		if gr.local > 0 {
			fr[src] = gr.local / d
		}
		return 1 - fr[src]
	}
	rd := res.Regions[gr.node].DemandRPS
	for j := range n {
		fr[j] = rp.Fractions[gr.node][j] * rd / d
	}
	fr[src] += gr.local / d
	return rp.Shed[gr.node] * rd / d
}

// idleRow is the row a new request of a group without demand would take:
// home when home may and can serve it, else the residual plan's cheapest
// option (or, without a residual plan, the nearest allowed region that
// can serve), else shed.
func idleRow(q Problem, rp Plan, anyResidual bool, gr *routeGroup, fr []float64) float64 {
	src := gr.source
	if gr.home() && q.Regions[src].CapacityRPS >= MinValue {
		fr[src] = 1
		return 0
	}
	if anyResidual {
		copy(fr, rp.Fractions[gr.node][:len(fr)])
		return rp.Shed[gr.node]
	}
	best, at := math.Inf(1), -1
	for j, r := range q.Regions {
		ok := gr.allowed == nil || slices.Contains(gr.allowed, j)
		if ok && !r.Down && r.CapacityRPS >= MinValue && q.RTTms[src][j] < best {
			best, at = q.RTTms[src][j], j
		}
	}
	if at < 0 {
		return 1
	}
	fr[at] = 1
	return 0
}

// chargeShed writes the rows of gr's slices into out: the group's route
// (fr, shed) for what each slice keeps of its admitted demand, after the
// shed the routing solve added is taken from the highest band first (in
// proportion to the admitted demand within a band).
func chargeShed(sl []Slice, admitted []float64, gr *routeGroup, shed float64, fr []float64, out SlicePlan) {
	kept := make([]float64, len(gr.members))
	for m, k := range gr.members {
		kept[m] = admitted[k]
	}
	lost := shed * gr.demand
	for b := MaxBands - 1; b >= 0 && lost > 0; b-- {
		var sum float64
		for m, k := range gr.members {
			if sl[k].Band == b {
				sum += kept[m]
			}
		}
		if sum <= 0 {
			continue
		}
		take := math.Min(lost, sum)
		for m, k := range gr.members {
			if sl[k].Band == b {
				kept[m] *= 1 - take/sum
			}
		}
		lost -= take
	}
	served := 1 - shed
	for m, k := range gr.members {
		d := sliceRPS(sl[k])
		switch {
		case d == 0 && served > 0:
			// No demand: a new request takes the group's routes.
			for j, f := range fr {
				out.Fractions[k][j] = f / served
			}
		case d == 0:
			out.Shed[k] = 1
		case served <= 0 || kept[m] <= 0:
			out.Shed[k] = 1
		default:
			w := math.Min(1, kept[m]/d)
			for j, f := range fr {
				out.Fractions[k][j] = w * f / served
			}
			out.Shed[k] = 1 - w
		}
	}
}

// aggregate fills out.Plan's rows of sources with demand (each the
// slices' rows weighted by their demand), then its Load and CostMs on q.
func aggregate(q Problem, sl []Slice, out *SlicePlan) {
	pl := &out.Plan
	for k, s := range sl {
		d := q.Regions[s.Source].DemandRPS
		if q.Regions[s.Source].Down || d < MinValue {
			continue
		}
		w := sliceRPS(s) / d
		row := pl.Fractions[s.Source]
		for j, f := range out.Fractions[k] {
			row[j] += w * f
		}
		pl.Shed[s.Source] += w * out.Shed[k]
	}
	m := compile(q)
	m.finish(pl)
}
