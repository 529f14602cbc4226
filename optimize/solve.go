package optimize

import (
	"cmp"
	"math"
	"slices"
)

// Solve returns the plan that minimises the total expected latency of p
// (see the package doc for the objective, the method and its gap). It
// returns an error wrapping ErrInvalidProblem when p does not validate.
//
// The plan's cost never exceeds the local-only plan's. Solve is pure and
// safe for concurrent use.
func Solve(p Problem) (Plan, error) {
	if err := p.Validate(); err != nil {
		return Plan{}, err
	}
	return solveModel(p.withDefaults(), true), nil
}

// solveModel is Solve on a valid problem with its defaults applied; with
// clustered false it prices every source by a full scan (the tests compare
// the two: the plans must be identical).
func solveModel(q Problem, clustered bool) Plan {
	m := compile(q)
	s := newBareSolver(&m)
	if clustered && m.n >= pricerFrom {
		// The pricer reads only m, which start does not change: build it
		// meanwhile, on a goroutine joined before the first pricing.
		var pr *pricer
		built := make(chan struct{})
		go func() {
			defer close(built)
			pr = newPricer(&m)
		}()
		s.start()
		<-built
		s.pr, m.pr = pr, pr
	} else {
		s.start()
	}
	rounds, stalled := 0, 0
	last := math.Inf(1)
	resettled := false
	for {
		obj, gap := s.price()
		if gap <= q.Tolerance*obj || rounds >= q.MaxIterations {
			break
		}
		if len(s.cands) == 0 {
			// Nothing to enter, yet a gap: some tree is not at its
			// optimum (rounding). Settle everything once more.
			if resettled {
				break
			}
			resettled = true
			s.settleAll()
			continue
		}
		// Stop when rounds no longer lower the objective: the duality gap
		// can stay above the tolerance when an improving option's marginal
		// latency is flat at zero load (large K), where the improvement is
		// below what float64 loads can express.
		if obj >= last*(1-stallTolerance) {
			if stalled++; stalled >= stallRounds {
				break
			}
		} else {
			stalled = 0
		}
		last = obj
		rounds++
		s.pivotRound()
	}
	pl := s.plan()
	pl.Iterations = rounds
	m.finish(&pl)
	if !(pl.CostMs <= s.local) {
		// Only rounding can get here (every step is a descent step); the
		// local-only plan is then at least as good.
		local := m.localOnly()
		local.Iterations = rounds
		return local
	}
	return pl
}

// The solver is a primal network simplex for this convex problem, on a
// bipartite graph. Node ids: source i is i, destination j is n+j, and each
// source i has its own shed node 2n+i (a destination with the constant
// marginal cost P that only i uses; one per source keeps sources that shed
// out of each other's components). An option o of source i is a
// destination index j in [0, n), or n for its shed node.
//
// The basis is the set of edges; it is always a forest. Every source with
// demand has at least one edge, its edges' flows add up to its demand, and
// y[j] is the sum of the flows into destination j, below capacity. Flows
// are ≥ 0; an edge may carry 0 only between entering and the next settle.
//
// A round prices every source against the current marginal latencies,
// then enters the improving edges (pivotRound): an edge joining two trees
// is added; an edge closing a cycle pushes flow around it (which changes
// RTT only, not load) until a tree edge empties and leaves. Then every tree
// touched is settled: moved to the optimum of the objective restricted to
// its edges (a water-fill on the tree potentials), as far as flows stay
// ≥ 0. Edges that empty leave the basis.

type edge struct {
	o   int     // option: destination index, or n for the source's shed node
	x   float64 // flow, requests/s
	rtt float64 // RTT of the edge (0 to the shed node)
}

// node is a node's place in the rooted forest over all 3n nodes (settle
// rebuilds it per tree; pivots keep it current) and its settle state.
type node struct {
	pot   float64 // tree potential: rtt + pot[option] = pot[source]
	net   float64 // subtree net supply, then target flow of the parent edge
	par   int     // parent (-1 at a root)
	depth int
	seen  int  // visit stamp
	psrc  int  // source of the edge to the parent
	pk    int  // index of that edge in edges[psrc]
	dirty bool // the node's tree changed since it was last settled
}

// target is an option node's target in a settle. For a destination, it is
// also where Newton's method starts the next time: with ok set, (y, p +
// pot, h) is a point where G' and G″ were evaluated.
type target struct {
	y   float64 // load (an option node's)
	h   float64 // destination: G″ at y
	p   float64 // destination: price G' − pot at y
	i   float64 // destination: 1/G″ at y (0 when not in use)
	q   float64 // destination: G‴/(2G″³) at y, the load's curvature in price
	pot float64 // destination: the potential p was priced at
	ok  bool
}

// srcEdge is edge k of source i, as listed at its destination.
type srcEdge struct{ i, k int32 }

// candidate is an edge worth entering: source i's option o, saving the
// relative marginal cost r.
type candidate struct {
	i, o int
	r    float64
}

type solver struct {
	m     *model
	n     int
	edges [][]edge    // per source: its basis edges
	dsrc  [][]srcEdge // per destination: the edges into it
	y     []float64   // per destination: load
	mu    []float64   // per destination: marginal latency at y (pricing)
	cands []candidate

	// Per node: its place in the rooted forest and its settle state, and
	// the settle's targets; one record per node keeps a tree walk's
	// accesses to a node in one cache line.
	nd []node
	tg []target

	// Union-find over the trees, valid within a pivot round.
	uf     []int
	ufSize []int

	stamp int // visit stamp of the last tree walk

	// pr prices large problems (nil below pricerFrom regions).
	pr *pricer
	// local is the local-only plan's CostMs (set by start).
	local float64

	// scratch
	order   []int
	pending []int
	path    []int
	down    []int
	dests   []int
	drops   []candidate
	steps   []edgeStep
	arena   []int   // settleFrom: the trees to settle, nodes in order
	pieces  []piece // settleFrom: the trees in arena still to settle
}

func newSolver(m *model) *solver {
	s := newBareSolver(m)
	if m.n >= pricerFrom {
		s.pr = newPricer(m)
		m.pr = s.pr
	}
	return s
}

// newBareSolver is newSolver without the pricer.
func newBareSolver(m *model) *solver {
	n := m.n
	s := &solver{
		m: m, n: n,
		edges:  make([][]edge, n),
		dsrc:   make([][]srcEdge, n),
		y:      make([]float64, n),
		mu:     make([]float64, n),
		nd:     make([]node, 3*n),
		tg:     make([]target, 3*n),
		uf:     make([]int, 3*n),
		ufSize: make([]int, 3*n),
	}
	for v := range s.nd {
		s.nd[v].par = -1
	}
	return s
}

// optNode returns the node id of source i's option o.
func (s *solver) optNode(i, o int) int {
	if o == s.n {
		return 2*s.n + i
	}
	return s.n + o
}

// edgeEnds returns (source, option) of the edge between nodes a and b.
func (s *solver) edgeEnds(a, b int) (int, int) {
	if a >= s.n {
		a, b = b, a
	}
	if b >= 2*s.n {
		return a, s.n
	}
	return a, b - s.n
}

// rttTo returns the RTT from source i to option o (0 to its shed node).
func (s *solver) rttTo(i, o int) float64 {
	if o == s.n {
		return 0
	}
	return s.m.rtt[i][o]
}

func (s *solver) findEdge(i, o int) int {
	for k, e := range s.edges[i] {
		if e.o == o {
			return k
		}
	}
	return -1
}

func (s *solver) addEdge(i, o int, x float64) {
	if o < s.n {
		s.dsrc[o] = append(s.dsrc[o], srcEdge{int32(i), int32(len(s.edges[i]))})
		s.y[o] += x
	}
	s.edges[i] = append(s.edges[i], edge{o: o, x: x, rtt: s.rttTo(i, o)})
}

// removeEdge drops the edge (its flow must be 0) and marks both ends dirty.
func (s *solver) removeEdge(i, o int) {
	k := s.findEdge(i, o)
	last := len(s.edges[i]) - 1
	moved := s.edges[i][last]
	s.edges[i][k] = moved
	s.edges[i] = s.edges[i][:last]
	if o < s.n {
		d := s.dsrc[o]
		for at, r := range d {
			if int(r.i) == i {
				d[at] = d[len(d)-1]
				s.dsrc[o] = d[:len(d)-1]
				break
			}
		}
	}
	if k != last {
		// The last edge moved to k: so must its entry at its destination,
		// and the record of the node it is the parent edge of.
		if moved.o < s.n {
			for at, r := range s.dsrc[moved.o] {
				if int(r.i) == i {
					s.dsrc[moved.o][at].k = int32(k)
					break
				}
			}
		}
		for _, v := range [2]int{i, s.optNode(i, moved.o)} {
			if x := &s.nd[v]; x.psrc == i && x.pk == last {
				x.pk = k
			}
		}
	}
	s.nd[i].dirty = true
	s.nd[s.optNode(i, o)].dirty = true
}

// start builds a basic starting plan close to the optimum and settles it:
// pool all capacity (ignoring RTT) to find each region's load at a common
// marginal latency λ ≤ P; serve each source locally up to its region's
// pooled load; send the excess to the nearest regions with pooled room
// left; shed what remains. Every allocation exhausts a source's excess or
// a region's room, so the edges form a forest.
func (s *solver) start() {
	lam, room := s.pooledMargin()
	s.fillNearest(lam, room)
	s.settleAll()
	s.startLocalIfCheaper()
}

// pooledMargin is the largest marginal latency λ (at most P) at which the
// regions' pooled load, each region loaded to λ, stays within the demand,
// with each region's room at λ.
func (s *solver) pooledMargin() (lam float64, room []float64) {
	n, m := s.n, s.m
	room = make([]float64, n)
	// pooled sets every region's room to its load at marginal latency λ
	// and returns their total and its derivative in λ.
	pooled := func(lam float64) (sum, deriv float64) {
		for j := range n {
			if m.srv[j].usable {
				var h float64
				room[j], h = m.srv[j].loadAt(lam, room[j])
				sum += room[j]
				if room[j] > 0 && h > 0 {
					deriv += 1 / h
				}
			}
		}
		return sum, deriv
	}
	lam = m.P
	if sum, deriv := pooled(m.P); sum > m.total {
		// The largest λ whose pooled load stays within the demand, by a
		// bracketed Newton search (the pooled load is increasing in λ).
		lo, hi := 0.0, m.P
		for range 100 {
			next := lam + (m.total-sum)/deriv
			if !(next > lo && next < hi) {
				next = lo + (hi-lo)/2
			}
			lam = next
			sum, deriv = pooled(lam)
			if sum <= m.total {
				lo = lam
			} else {
				hi = lam
			}
			if hi-lo <= 1e-9*hi || math.Abs(sum-m.total) <= 1e-12*m.total {
				break
			}
		}
		if sum > m.total {
			lam = lo
			pooled(lo)
		}
	}
	return lam, room
}

// fillNearest serves each region's demand at home as far as its room
// allows, then at the nearest region with room while that beats shedding
// at the margin λ, and sheds the rest.
func (s *solver) fillNearest(lam float64, room []float64) {
	n, m := s.n, s.m
	excess := make([]float64, n)
	for i := range n {
		d := m.demand[i]
		if d == 0 {
			continue
		}
		local := math.Min(d, room[i])
		if local > 0 {
			s.addEdge(i, i, local)
			room[i] -= local
		}
		excess[i] = d - local
	}
	for i := range n {
		for excess[i] > 0 {
			// The nearest region with room, if serving there beats
			// shedding at the margin.
			nearest, at := m.P-lam, -1
			for j, r := range m.rtt[i] {
				if room[j] > 0 && r < nearest {
					nearest, at = r, j
				}
			}
			if at < 0 {
				break
			}
			a := math.Min(excess[i], room[at])
			if k := s.findEdge(i, at); k >= 0 {
				s.edges[i][k].x += a
				s.y[at] += a
			} else {
				s.addEdge(i, at, a)
			}
			excess[i] -= a
			room[at] -= a
			if room[at] <= 1e-12*m.srv[at].capEff {
				room[at] = 0
			}
		}
		if excess[i] > 0 {
			s.addEdge(i, n, excess[i])
		}
	}
}

// startLocalIfCheaper replaces the start by the local-only plan when that
// is cheaper.
func (s *solver) startLocalIfCheaper() {
	n, m := s.n, s.m
	// Start from the local-only plan instead when that is cheaper, so
	// that the solver, which only descends, never ends above it.
	s.local = m.localCost()
	if s.objective() > s.local*m.total {
		for i := range n {
			for len(s.edges[i]) > 0 {
				e := s.edges[i][len(s.edges[i])-1]
				s.edges[i][len(s.edges[i])-1].x = 0
				if e.o < n {
					s.y[e.o] -= e.x
				}
				s.removeEdge(i, e.o)
			}
		}
		clear(s.y)
		for i := range n {
			d := m.demand[i]
			if d == 0 {
				continue
			}
			served := m.localServed(i)
			if served > 0 {
				s.addEdge(i, i, served)
			}
			if d-served > 0 {
				s.addEdge(i, n, d-served)
			}
		}
		s.settleAll()
	}
}

// settleAll settles every tree.
func (s *solver) settleAll() {
	for i := range s.n {
		s.nd[i].dirty = s.m.demand[i] > 0
	}
	for i := range s.n {
		s.settleFrom(i)
	}
}

// objective returns F for the current flows, in ms·rps.
func (s *solver) objective() float64 {
	n, m := s.n, s.m
	var obj float64
	for j := range n {
		obj += m.srv[j].total(s.y[j])
	}
	for i := range n {
		for _, e := range s.edges[i] {
			obj += e.x * s.rttTo(i, e.o)
			if e.o == n {
				obj += e.x * m.P
			}
		}
	}
	return obj
}

// price computes every destination's marginal latency, the objective and
// the Frank-Wolfe duality gap (both in ms·rps), and collects in s.cands,
// for each source, its cheapest option when that is cheaper than an option
// it uses.
func (s *solver) price() (obj, gap float64) {
	n, m := s.n, s.m
	for j := range n {
		s.mu[j] = m.marginalOf(j, s.y[j])
		obj += m.srv[j].total(s.y[j])
	}
	s.cands = s.cands[:0]
	if s.pr != nil {
		s.pr.load(s.mu)
	}
	if n < parallelPricing {
		o, g := s.priceRows(0, n, &s.cands)
		return obj + o, math.Max(gap+g, 0)
	}
	// Rows are independent: price the two halves at once, then merge in
	// row order, so the result does not depend on the scheduling.
	half := n / 2
	var o2, g2 float64
	var c2 []candidate
	done := make(chan struct{})
	go func() {
		defer close(done)
		o2, g2 = s.priceRows(half, n, &c2)
	}()
	o1, g1 := s.priceRows(0, half, &s.cands)
	<-done
	s.cands = append(s.cands, c2...)
	return obj + o1 + o2, math.Max(gap+g1+g2, 0)
}

// parallelPricing: from this many regions on, pricing runs on two
// goroutines (joined before price returns).
const parallelPricing = 256

// priceRows prices sources [lo, hi): their objective share, their part of
// the duality gap, and the improving options, appended to cands. It reads
// the solver's state and writes only cands.
func (s *solver) priceRows(lo, hi int, cands *[]candidate) (obj, gap float64) {
	n, m := s.n, s.m
	for i := lo; i < hi; i++ {
		d := m.demand[i]
		if d == 0 {
			continue
		}
		var used, worst float64
		for _, e := range s.edges[i] {
			c := m.P
			if e.o < n {
				c = e.rtt + s.mu[e.o]
				obj += e.x * e.rtt
			} else {
				obj += e.x * m.P
			}
			used += e.x * c
			if e.x > 0 {
				worst = max(worst, c)
			}
		}
		var best float64
		var at int
		if s.pr != nil {
			best, at = s.pr.cheapest(i, m.P)
		} else {
			best, at = m.cheapest(i, s.mu)
		}
		gap += used - d*best
		if best < worst*(1-enterTolerance) {
			if at < 0 {
				at = n
			}
			if s.findEdge(i, at) < 0 {
				*cands = append(*cands, candidate{i, at, (worst - best) / worst})
			}
		}
	}
	return obj, gap
}

// The solver gives up after stallRounds rounds in a row that lower the
// objective by less than stallTolerance (relative).
const (
	stallTolerance = 1e-13
	stallRounds    = 3
)

// enterTolerance is the relative saving below which an option is not
// worth a pivot.
const enterTolerance = 1e-12

// pivotRound enters the candidates, biggest relative saving first (each is
// checked again against the basis as it is by then), and settles every
// tree they touched.
func (s *solver) pivotRound() {
	s.enterAll()
	s.settlePending()
}

// enterAll enters the candidates, biggest relative saving first.
func (s *solver) enterAll() {
	slices.SortFunc(s.cands, func(a, b candidate) int { return cmp.Compare(b.r, a.r) })
	s.unionInit()
	for _, c := range s.cands {
		s.enter(c.i, c.o)
	}
}

// settlePending settles every tree the entered edges touched.
func (s *solver) settlePending() {
	for _, v := range s.pending {
		s.settleFrom(v)
	}
	s.pending = s.pending[:0]
}

// enter brings option o of source i into the basis if it is still cheaper,
// at the current loads, than an option i uses. Loads do not change while
// edges enter (an edge joining two trees enters empty, a cycle push keeps
// every load), so the marginal latencies of the pricing still hold.
func (s *solver) enter(i, o int) {
	if s.findEdge(i, o) >= 0 {
		return
	}
	var worst float64
	for _, e := range s.edges[i] {
		if e.x > 0 {
			worst = max(worst, e.rtt+s.muOf(e.o))
		}
	}
	if !(s.rttTo(i, o)+s.muOf(o) < worst*(1-enterTolerance)) {
		return
	}
	on := s.optNode(i, o)
	if ri, ro := s.find(i), s.find(on); ri != ro {
		// Joins two trees: hang the smaller under the other through the
		// new edge, which gets its flow when the tree is settled.
		if s.ufSize[ri] < s.ufSize[ro] {
			s.reroot(i, on, s.rttTo(i, o))
			s.uf[ri] = ro
			s.ufSize[ro] += s.ufSize[ri]
		} else {
			s.reroot(on, i, s.rttTo(i, o))
			s.uf[ro] = ri
			s.ufSize[ri] += s.ufSize[ro]
		}
		s.addEdge(i, o, 0)
		s.nd[i].dirty = true
		s.pending = append(s.pending, i)
		return
	}
	// The edge closes a cycle: i → on, then the tree path back from on to
	// i. Pushing θ around it changes no load, only RTT, by θ·delta, where
	// delta is the edge's reduced RTT against the tree potentials: no
	// path walk for the edges that would not pay.
	if !(s.rttTo(i, o)+s.nd[on].pot-s.nd[i].pot < 0) {
		return
	}
	// Along the path the edges at even positions lose θ (on gains θ from
	// i, so the source feeding on along the tree sends θ less, and so on).
	path := s.treePath(on, i)
	delta := s.rttTo(i, o)
	theta := math.Inf(1)
	block := -1
	for k := 0; k+1 < len(path); k++ {
		src, opt := s.edgeEnds(path[k], path[k+1])
		e := &s.edges[src][s.findEdge(src, opt)]
		if k%2 == 0 {
			delta -= e.rtt
			if e.x < theta {
				theta, block = e.x, k
			}
		} else {
			delta += e.rtt
		}
	}
	if !(delta < 0) || block < 0 {
		return
	}
	for k := 0; k+1 < len(path); k++ {
		src, opt := s.edgeEnds(path[k], path[k+1])
		e := &s.edges[src][s.findEdge(src, opt)]
		sign := 1.0
		if k%2 == 0 {
			sign = -1
		}
		e.x += sign * theta
		if opt < s.n {
			s.y[opt] += sign * theta
		}
	}
	// The blocking edge leaves. The side of it away from the root holds
	// exactly one end of the entering edge; re-hang it from the other end.
	ba, bb := path[block], path[block+1]
	bs, bo := s.edgeEnds(ba, bb)
	s.edges[bs][s.findEdge(bs, bo)].x = 0
	s.removeEdge(bs, bo)
	if s.nd[ba].par == bb { // ba is below: its side holds on
		s.reroot(on, i, s.rttTo(i, o))
	} else {
		s.reroot(i, on, s.rttTo(i, o))
	}
	s.addEdge(i, o, theta)
	s.nd[i].dirty = true
	s.pending = append(s.pending, i)
}

// muOf returns the marginal cost of option o at the pricing's loads.
func (s *solver) muOf(o int) float64 {
	if o == s.n {
		return s.m.P
	}
	return s.mu[o]
}

// treePath returns the tree path from a to b (a first), walking parent
// pointers up from both to their common ancestor.
func (s *solver) treePath(a, b int) []int {
	up, down := s.path[:0], s.down[:0]
	for s.nd[a].depth > s.nd[b].depth {
		up = append(up, a)
		a = s.nd[a].par
	}
	for s.nd[b].depth > s.nd[a].depth {
		down = append(down, b)
		b = s.nd[b].par
	}
	for a != b {
		up = append(up, a)
		down = append(down, b)
		a, b = s.nd[a].par, s.nd[b].par
	}
	up = append(up, a)
	for k := len(down) - 1; k >= 0; k-- {
		up = append(up, down[k])
	}
	s.path, s.down = up, down
	return up
}

// reroot makes e the root of its tree and hangs that tree under p, a node
// of another tree, through an edge of RTT r (the caller adds the edge),
// fixing the parents, depths and potentials of e's whole tree: they shift
// by a constant so that the new edge satisfies rtt + pot[option] =
// pot[source].
func (s *solver) reroot(e, p int, r float64) {
	n, nd := s.n, s.nd
	s.stamp++
	stamp := s.stamp
	nd[e].par = p
	nd[e].depth = nd[p].depth + 1
	shift := nd[p].pot - r - nd[e].pot // e is the option node
	if e < n {
		shift = nd[p].pot + r - nd[e].pot
	}
	nd[e].seen = stamp
	nd[p].seen = stamp // never walk into p's tree
	q := append(s.order[:0], e)
	for k := 0; k < len(q); k++ {
		v := q[k]
		x := &nd[v]
		x.pot += shift
		d := x.depth + 1
		switch {
		case v < n:
			for _, ed := range s.edges[v] {
				w := s.optNode(v, ed.o)
				if y := &nd[w]; y.seen != stamp {
					y.seen, y.par, y.depth = stamp, v, d
					q = append(q, w)
				}
			}
		case v < 2*n:
			for _, r := range s.dsrc[v-n] {
				w := int(r.i)
				if y := &nd[w]; y.seen != stamp {
					y.seen, y.par, y.depth = stamp, v, d
					q = append(q, w)
				}
			}
		default:
			w := v - 2*n
			if y := &nd[w]; y.seen != stamp && s.findEdge(w, n) >= 0 {
				y.seen, y.par, y.depth = stamp, v, d
				q = append(q, w)
			}
		}
	}
	s.order = q
}

// unionInit starts a union-find over the current trees.
func (s *solver) unionInit() {
	for v := range s.uf {
		s.uf[v] = v
		s.ufSize[v] = 1
	}
	for i := range s.n {
		for _, e := range s.edges[i] {
			a, b := s.find(i), s.find(s.optNode(i, e.o))
			if a != b {
				s.uf[b] = a
				s.ufSize[a] += s.ufSize[b]
			}
		}
	}
}

func (s *solver) find(v int) int {
	for s.uf[v] != v {
		s.uf[v] = s.uf[s.uf[v]]
		v = s.uf[v]
	}
	return v
}

// plan turns the flows into fractions. A source without demand gets its
// cheapest option at the final loads.
func (s *solver) plan() Plan {
	n, m := s.n, s.m
	pl := newPlan(n)
	for j := range n {
		s.mu[j] = m.marginalOf(j, s.y[j])
	}
	for i := range n {
		if m.isDown(i) {
			continue
		}
		if m.demand[i] == 0 {
			if _, at := m.cheapest(i, s.mu); at >= 0 {
				pl.Fractions[i][at] = 1
			} else {
				pl.Shed[i] = 1
			}
			continue
		}
		var sum float64
		for _, e := range s.edges[i] {
			sum += e.x
		}
		for _, e := range s.edges[i] {
			if e.o == n {
				pl.Shed[i] = e.x / sum
			} else {
				pl.Fractions[i][e.o] = e.x / sum
			}
		}
	}
	return pl
}
