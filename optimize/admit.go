package optimize

import (
	"math"
	"slices"
)

// Admission, SolveSlices' first phase: how much of each slice is served
// at all, band by band.
//
// Each region j can serve servable[j] requests/s: what the local-first
// solve loads it with before its marginal latency reaches the shed
// penalty (its local fill, then the residual capacity's load at the
// penalty). Slices of one band that may use the same reachable regions
// form a group; a group is one node of a bipartite flow network (groups
// → the regions they may use → the sink, each region's edge capped at
// servable[j]). Bands are admitted in order, 0 first: the admitted demand
// of the bands before stays in the network (it may move between its
// regions), so a band only ever takes what the bands before it left.
// Within a band, progressive filling: the largest common share t of every
// open group's demand that the network can carry (Newton's method on the
// minimum cut, see fill), then the groups that cannot grow past t (no
// augmenting path from them to the sink) are frozen at t, and the rest go
// on; the result is max-min fair between the band's groups, and slices in
// one group get the same share.

// admitGroup is slices of one band that may use the same regions.
type admitGroup struct {
	band    int
	regions []int // reachable, allowed, servable regions
	demand  float64
	members []int // slice indexes
	amount  float64
}

// admit returns the admitted demand of every slice (requests/s). q has
// its defaults; fills are resolved.
func admit(q Problem, sl []Slice, fills []float64) []float64 {
	caps := servable(q, sl, fills)
	groups := admitGroups(q, sl, caps)
	net := newAdmitNet(len(q.Regions), groups, caps)
	for b := range MaxBands {
		var open []int
		for g := range groups {
			if groups[g].band == b && groups[g].demand > 0 && len(groups[g].regions) > 0 {
				open = append(open, g)
			}
		}
		net.fill(groups, open)
	}
	out := make([]float64, len(sl))
	for _, g := range groups {
		if g.demand <= 0 {
			continue
		}
		share := min(1, g.amount/g.demand)
		for _, k := range g.members {
			out[k] = share * sliceRPS(sl[k])
		}
	}
	return out
}

// servable returns what each region can serve before it sheds: its local
// fill of the demand that may stay home, plus the load at which the
// residual capacity's marginal latency reaches the shed penalty (the
// residual solve's engine latencies equalised as SolveLocalFirst's are).
func servable(q Problem, sl []Slice, fills []float64) []float64 {
	n := len(q.Regions)
	home := make([]float64, n)
	for _, s := range sl {
		if allows(s, s.Source) {
			home[s.Source] += sliceRPS(s)
		}
	}
	res := slices.Clone(q.Regions)
	local := make([]float64, n)
	for j, r := range q.Regions {
		if r.Down || r.CapacityRPS < MinValue {
			continue
		}
		if home[j] >= MinValue {
			local[j] = math.Min(home[j], fills[j]*r.CapacityRPS*q.Headroom)
			res[j].CapacityRPS = math.Max(0, r.CapacityRPS-local[j]/q.Headroom)
		}
	}
	equaliseLatencies(res)
	caps := make([]float64, n)
	for j, r := range res {
		if r.Down || q.Regions[j].CapacityRPS < MinValue {
			continue
		}
		srv := newServer(r, q)
		caps[j] = local[j] + srv.loadAtMarginal(q.ShedPenaltyMs)
	}
	return caps
}

// admitGroups groups the slices of up sources with demand by band and the
// set of regions they may use (allowed, reachable from the source, able
// to serve), in slice order.
func admitGroups(q Problem, sl []Slice, caps []float64) []admitGroup {
	n := len(q.Regions)
	index := map[string]int{}
	var groups []admitGroup
	bits := make([]byte, (n+7)/8+1)
	for k, s := range sl {
		d := sliceRPS(s)
		if q.Regions[s.Source].Down || d == 0 {
			continue
		}
		clear(bits)
		bits[0] = byte(s.Band)
		row := q.RTTms[s.Source]
		usable := func(j int) bool { return caps[j] > 0 && !math.IsInf(row[j], 1) }
		if s.Allowed == nil {
			for j := range n {
				if usable(j) {
					bits[1+j/8] |= 1 << (j % 8)
				}
			}
		} else {
			for _, j := range s.Allowed {
				if usable(j) {
					bits[1+j/8] |= 1 << (j % 8)
				}
			}
		}
		g, ok := index[string(bits)]
		if !ok {
			g = len(groups)
			index[string(bits)] = g
			var regions []int
			for j := range n {
				if bits[1+j/8]&(1<<(j%8)) != 0 {
					regions = append(regions, j)
				}
			}
			groups = append(groups, admitGroup{band: s.Band, regions: regions})
		}
		groups[g].demand += d
		groups[g].members = append(groups[g].members, k)
	}
	return groups
}

// admitNet is the admission flow network: the source node 0, one node per
// group (1..G), one per region (G+1..G+n), the sink G+n+1.
type admitNet struct {
	f      flowNet
	groups int
	sink   int
	supply []int   // per group: its edge from the source
	total  float64 // every group's demand
}

func newAdmitNet(n int, groups []admitGroup, caps []float64) *admitNet {
	G := len(groups)
	a := &admitNet{groups: G, sink: G + n + 1, supply: make([]int, G)}
	a.f.init(G + n + 2)
	for _, g := range groups {
		a.total += g.demand
	}
	total := a.total
	for g, gr := range groups {
		a.supply[g] = a.f.add(0, 1+g, 0)
		for _, j := range gr.regions {
			a.f.add(1+g, 1+G+j, total)
		}
	}
	for j, c := range caps {
		if c > 0 {
			a.f.add(1+G+j, a.sink, c)
		}
	}
	return a
}

// carries sets every group's supply (the open ones at share t of their
// demand, the rest at their amount) and reports whether the network
// carries it all.
func (a *admitNet) carries(groups []admitGroup, open []int, t float64) bool {
	var want float64
	for g := range groups {
		a.f.cap[a.supply[g]] = groups[g].amount
	}
	for _, g := range open {
		a.f.cap[a.supply[g]] = t * groups[g].demand
	}
	for g := range groups {
		want += a.f.cap[a.supply[g]]
	}
	got := a.f.maxFlow(0, a.sink, 1e-12*want)
	return got >= want-(1e-9*want+MinValue)
}

// fill admits the open groups of one band by progressive filling; the
// groups of the bands before keep their amounts. Each level is found by
// Newton's method on the minimum cut (as for parametric max-flow): when
// the network does not carry the open groups at share t, the groups A on
// the source side of a minimum cut and the regions R there bound it, t·(A's
// open demand) + (A's fixed amounts) ≤ Σ_R servable, so t drops to where
// that cut is tight and the flow is tried again; the cuts strictly
// shrink, so a few max-flows find the level.
func (a *admitNet) fill(groups []admitGroup, open []int) {
	lo := 0.0
	for len(open) > 0 {
		t := 1.0
		for range 64 {
			if a.carries(groups, open, t) {
				break
			}
			next, ok := a.cutShare(groups, open)
			if !ok || !(next < t) || t <= lo {
				t = lo
				a.carries(groups, open, t)
				break
			}
			t = max(next, lo)
		}
		for _, g := range open {
			groups[g].amount = min(t, 1) * groups[g].demand
		}
		if t >= 1 {
			return
		}
		reach := a.f.reachesSink(a.sink, 1e-9*a.total+MinValue)
		rest := open[:0:0]
		for _, g := range open {
			if reach[1+g] {
				rest = append(rest, g)
			}
		}
		if len(rest) == len(open) {
			return // nothing bottlenecked within float resolution: stop at t
		}
		open, lo = rest, t
	}
}

// cutShare returns, after a max-flow that did not carry every supply, the
// share t of the open groups' demand at which the minimum cut found is
// tight; ok is false when the cut holds no open group.
func (a *admitNet) cutShare(groups []admitGroup, open []int) (float64, bool) {
	side := a.f.fromSource(0, 1e-12*a.total)
	isOpen := make(map[int]bool, len(open))
	for _, g := range open {
		isOpen[g] = true
	}
	var demand, fixed, room float64
	for g := range groups {
		if !side[1+g] {
			continue
		}
		if isOpen[g] {
			demand += groups[g].demand
		} else {
			fixed += groups[g].amount
		}
	}
	for e := a.f.head[a.sink]; e >= 0; e = a.f.next[e] {
		if r := a.f.to[e]; side[r] {
			room += a.f.cap[e^1]
		}
	}
	if demand <= 0 {
		return 0, false
	}
	return max(0, (room-fixed)/demand), true
}
