package optimize

import (
	"math"
	"slices"
)

// settleFrom settles the tree of start if it is dirty and, while settling
// drops edges, every tree those edges leave behind. A tree left behind is
// a piece of the tree before: its nodes keep their order (parents first),
// parents and potentials, so it needs no new walk.
func (s *solver) settleFrom(start int) {
	if !s.nd[start].dirty {
		return
	}
	demand, lamShed, shedAt := s.bfs(start)
	s.arena = append(s.arena[:0], s.order...)
	s.pieces = append(s.pieces[:0], piece{0, len(s.arena), demand, lamShed, shedAt})
	for len(s.pieces) > 0 {
		p := s.pieces[len(s.pieces)-1]
		s.pieces = s.pieces[:len(s.pieces)-1]
		s.settle(p)
	}
}

// piece is a tree to settle: its nodes, parents first, in
// arena[lo:hi], its demand and its cheapest shed node (−1: none) with the
// price cap P − pot that node sets.
type piece struct {
	lo, hi  int
	demand  float64
	lamShed float64
	shedAt  int
}

// settle moves the tree pc toward the optimum of the objective restricted
// to its edges, as far as flows stay ≥ 0; edges whose flow reaches 0
// leave the basis and the trees they leave behind are queued on s.pieces.
//
// With tree potentials pot (rtt + pot[option] = pot[source] on every
// edge), the RTT part of the cost is, up to a constant, −Σ_j pot_j·y_j, so
// the restricted optimum gives each destination the load at which its
// marginal latency is λ + pot_j, for the λ at which the loads add up to the
// tree's demand (a water-fill); a shed node caps λ at P − pot. The flows
// follow from the loads, since the edges form a tree.
func (s *solver) settle(pc piece) {
	n, m := s.n, s.m
	order := s.arena[pc.lo:pc.hi:pc.hi]
	if len(order) == 1 {
		return
	}
	s.targets(order, pc.demand, pc.lamShed, pc.shedAt)
	// Target flows: the net supply of each subtree, leaves first; the flow
	// (source → option) on v's parent edge is net[v] when v is the source
	// and −net[v] when v is the option. The loads are summed anew from
	// the flows below.
	nd := s.nd
	for k := len(order) - 1; k >= 0; k-- {
		v := order[k]
		x := &nd[v] // x.net holds its children's, from bfs's 0
		switch {
		case v < n:
			x.net += m.demand[v]
		case v < 2*n:
			x.net -= s.tg[v].y
			s.y[v-n] = 0
		default:
			x.net -= s.tg[v].y
		}
		if k > 0 {
			nd[x.par].net += x.net
		}
	}
	// Ratio test: the largest step toward the target keeping flows ≥ 0.
	// The objective is convex and the target is its minimum over a set
	// that holds the current flows, so it falls all along the step.
	// The parent edges, by position in order, for the step below.
	steps := slices.Grow(s.steps[:0], len(order))[:len(order)-1]
	s.steps = steps
	t := 1.0
	for q, v := range order[1:] {
		x := &nd[v]
		if v >= n {
			x.net = -x.net
		}
		e := &s.edges[x.psrc][x.pk]
		x0, x1 := e.x, x.net
		if x1 < x0 {
			if r := x0 / (x0 - x1); r < t {
				t = r
			}
		}
		steps[q] = edgeStep{e: e, x1: x1, zero: 1e-13 * m.demand[x.psrc], src: x.psrc}
	}
	drops := s.drops[:0]
	for _, st := range steps {
		e := st.e
		x := e.x + t*(st.x1-e.x)
		if x <= st.zero {
			x = 0
			// An edge at 0 leaves unless its target flow is positive
			// (then only another edge blocked the step, at t = 0).
			if st.x1 <= 0 {
				drops = append(drops, candidate{i: st.src, o: e.o})
			}
		}
		e.x = x
		if e.o < n {
			s.y[e.o] += x
		}
	}
	s.drops = drops
	if len(drops) > 0 {
		s.split(order, drops)
	}
}

// split removes the dropped edges of the tree whose nodes are order and
// queues the trees they leave on s.pieces, each with its nodes in the
// order they have in order.
func (s *solver) split(order []int, drops []candidate) {
	n, m, nd := s.n, s.m, s.nd
	// Number the trees with visit stamps: the root's tree base, the tree
	// below dropped edge k base+1+k.
	base := s.stamp + 1
	s.stamp += 1 + len(drops)
	nd[order[0]].seen = base
	for k, d := range drops {
		a, b := d.i, s.optNode(d.i, d.o)
		if nd[b].par != a {
			a, b = b, a
		}
		nd[b].seen = base + 1 + k // b hangs below the dropped edge
		nd[b].par = -1
		s.removeEdge(d.i, d.o)
	}
	first := len(s.pieces)
	for range 1 + len(drops) {
		s.pieces = append(s.pieces, piece{lamShed: math.Inf(1), shedAt: -1})
	}
	pcs := s.pieces[first:]
	// Each node's tree (its parent's, parents coming first), and each
	// tree's size (in hi for now), demand and cheapest shed node.
	for _, v := range order {
		x := &nd[v]
		if x.seen < base {
			x.seen = nd[x.par].seen
		}
		pc := &pcs[x.seen-base]
		pc.hi++
		switch {
		case v < n:
			pc.demand += m.demand[v]
		case v >= 2*n:
			if c := m.P - x.pot; c < pc.lamShed {
				pc.lamShed, pc.shedAt = c, v
			}
		}
	}
	// Lay the trees out in the arena one after the other.
	at := len(s.arena)
	for k := range pcs {
		size := pcs[k].hi
		pcs[k].lo, pcs[k].hi = at, at // hi: where the next node goes
		at += size
	}
	s.arena = slices.Grow(s.arena, at-len(s.arena))[:at]
	for _, v := range order {
		x := &nd[v]
		pc := &pcs[x.seen-base]
		s.arena[pc.hi] = v
		pc.hi++
		x.dirty, x.net = false, 0
	}
}

// edgeStep is a tree edge in a settle's step: the edge (of source src)
// and its target flow.
type edgeStep struct {
	e    *edge
	x1   float64
	zero float64 // flows at most this are 0
	src  int
}

// bfs walks the tree of start (made its root), recording the visiting
// order, parents, depths, parent edges and tree potentials (pot[start] =
// 0), and clears the tree's dirty marks. It returns the tree's demand and
// its cheapest shed node (−1: none) with its price cap P − pot.
func (s *solver) bfs(start int) (demand, lamShed float64, shedAt int) {
	n, m, nd := s.n, s.m, s.nd
	lamShed, shedAt = math.Inf(1), -1
	s.stamp++
	stamp := s.stamp
	order := append(s.order[:0], start)
	nd[start].seen = stamp
	nd[start].par = -1
	nd[start].depth = 0
	nd[start].pot = 0
	nd[start].net = 0
	for q := 0; q < len(order); q++ {
		v := order[q]
		x := &nd[v]
		x.dirty = false
		d := x.depth + 1
		switch {
		case v < n: // source
			demand += m.demand[v]
			for k, e := range s.edges[v] {
				w := s.optNode(v, e.o)
				if y := &nd[w]; y.seen != stamp {
					y.seen, y.par, y.depth = stamp, v, d
					y.psrc, y.pk = v, k
					y.pot, y.net = x.pot-e.rtt, 0
					order = append(order, w)
				}
			}
		case v < 2*n: // destination
			for _, r := range s.dsrc[v-n] {
				src := int(r.i)
				if y := &nd[src]; y.seen != stamp {
					k := int(r.k)
					y.seen, y.par, y.depth = stamp, v, d
					y.psrc, y.pk = src, k
					y.pot, y.net = x.pot+s.edges[src][k].rtt, 0
					order = append(order, src)
				}
			}
		default: // shed node of source v-2n
			if c := m.P - x.pot; c < lamShed {
				lamShed, shedAt = c, v
			}
			src := v - 2*n
			if y := &nd[src]; y.seen != stamp {
				if k := s.findEdge(src, n); k >= 0 {
					y.seen, y.par, y.depth = stamp, v, d
					y.psrc, y.pk = src, k
					y.pot, y.net = x.pot, 0
					order = append(order, src)
				}
			}
		}
	}
	s.order = order
	return demand, lamShed, shedAt
}

// targets sets tgt, for every option node of the tree in order, to its load
// at the restricted optimum: each destination j at the load where its
// marginal latency is λ + pot_j, with the loads adding up to demand; the
// cheapest shed node (λ capped at P − pot) takes what the destinations do
// not.
func (s *solver) targets(order []int, demand, lamShed float64, shedAt int) {
	if !s.targetsNewton(order, demand, lamShed, shedAt) {
		s.targetsBracketed(order, demand, lamShed, shedAt)
		// Its targets are no evaluated points to start from.
		for _, v := range s.dests {
			s.tg[v].ok = false
		}
	}
}

// newtonTolerance is the relative accuracy of the water-fill: of every
// destination's marginal latency against λ + pot, and of the loads' sum.
const newtonTolerance = 1e-13

// targetsNewton computes the targets by Newton's method on the whole system
// (every destination's load and λ at once): each step moves every load
// along its tangent to the current λ, evaluates the marginal there, and
// moves λ so that the tangents add up to the demand. G' is convex, so a
// load overshoots only upward, where it is held below capacity. It reports
// false when it has not converged, leaving the work to targetsBracketed.
func (s *solver) targetsNewton(order []int, demand, lamShed float64, shedAt int) bool {
	n, m := s.n, s.m
	dests := s.dests[:0]
	var sumY, sumInvH, sumPOH float64
	for _, v := range order {
		switch {
		case v < n:
			continue
		case v >= 2*n:
			s.tg[v].y = 0
			continue
		}
		dests = append(dests, v)
		// Start from the point where the destination's marginal was last
		// evaluated (its previous target, usually nearer the new one
		// than its load), or from its load.
		j := v - n
		tv := &s.tg[v]
		pot := s.nd[v].pot
		if tv.ok {
			tv.p = (tv.p + tv.pot) - pot
		} else {
			g, h, t := m.srv[j].ght(s.y[j])
			tv.y, tv.h, tv.p, tv.ok = s.y[j], h, g-pot, true
			tv.i, tv.q = 0, 0
			if tv.y > 0 && h > 0 {
				tv.i = 1 / h
				tv.q = t * tv.i * tv.i * tv.i / 2
			}
		}
		tv.pot = pot
		if tv.y > 0 && tv.h > 0 {
			sumY += tv.y
			sumInvH += tv.i
			sumPOH += tv.p * tv.i
		}
	}
	s.dests = dests
	if len(dests) == 0 {
		if shedAt < 0 {
			return false
		}
		s.tg[shedAt].y = demand
		return true
	}
	if shedAt >= 0 {
		// Does the shed node cap λ? Converge every load at λ = P − pot_S.
		var sum float64
		ok := false
		for range 60 {
			var conv bool
			if sum, _, _, conv = s.newtonStep(dests, lamShed); conv {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
		if sum <= demand {
			s.tg[shedAt].y = demand - sum
			return true
		}
		sumY, sumInvH, sumPOH = sum, 0, 0
		for _, v := range dests {
			if s.tg[v].y > 0 {
				sumInvH += 1 / s.tg[v].h
				sumPOH += s.tg[v].p / s.tg[v].h
			}
		}
	}
	if !(sumInvH > 0) {
		return false
	}
	lam := (demand - sumY + sumPOH) / sumInvH
	lam += s.curvature(dests, lam, sumInvH)
	for range 60 {
		if lam >= lamShed {
			return false
		}
		sum, invH, poh, conv := s.newtonStep(dests, lam)
		if conv && math.Abs(sum-demand) <= newtonTolerance*demand {
			s.spreadResidue(dests, lam, demand-sum)
			return true
		}
		if !(invH > 0) {
			return false
		}
		lam += (demand - sum + poh) / invH
	}
	return false
}

// newtonStep moves every destination of dests to its tangent estimate at
// λ and returns the new total, Σ 1/h and Σ (price − λ)/h there, and
// whether the loads it leaves are converged at λ: every price within
// newtonTolerance of λ + pot.
func (s *solver) newtonStep(dests []int, lam float64) (sum, invH, poh float64, ok bool) {
	ok = true
	n, srvs, tg := s.n, s.m.srv, s.tg
	for _, v := range dests {
		srv := &srvs[v-n]
		tv := &tg[v]
		y, p := tv.y, tv.p
		target := lam + tv.pot
		var ny float64
		switch {
		case !(target > srv.l0):
			ny = 0
		case y > 0 && tv.h > 0:
			// The load at price λ to second order: δ = e/G″ − q·e².
			e := lam - p
			d := e * tv.i
			if c := tv.q * e * e; math.Abs(c) <= 0.5*math.Abs(d) {
				d -= c
			}
			ny = y + d
			if top := srv.capEff * (1 - maxUtilGap); !(ny < top) {
				ny = y + (top-y)/2
			}
		default: // comes into use: search from scratch
			ny, _ = srv.loadAt(target, 0)
		}
		if ny <= 0 {
			tv.y, tv.h, tv.i, tv.q, tv.p = 0, 0, 0, 0, srv.l0-tv.pot
			if target > srv.l0 {
				ok = false // belongs in use
			}
			continue
		}
		g, h, t3 := srv.ght(ny)
		np := g - tv.pot
		ih := 1 / h
		tv.y, tv.h, tv.i, tv.p = ny, h, ih, np
		tv.q = t3 * ih * ih * ih / 2
		if math.Abs(np-lam) > newtonTolerance*target {
			ok = false
		}
		sum += ny
		invH += ih
		poh += (np - lam) * ih
	}
	return sum, invH, poh, ok
}

// curvature returns the correction to λ, found by the destinations'
// tangents at their points, that their second-order terms call for: with
// e = λ − p and δ(e) = e/G″ − q·e², the loads add up to the demand at
// λ + ε for ε ≈ Σ q·e² / (Σ 1/G″ − 2·Σ q·e). 0 when that is not a number.
func (s *solver) curvature(dests []int, lam, sumInvH float64) float64 {
	var num, qe float64
	for _, v := range dests {
		if tv := &s.tg[v]; tv.y > 0 && tv.h > 0 {
			e := lam - tv.p
			num += tv.q * e * e
			qe += tv.q * e
		}
	}
	eps := num / (sumInvH - 2*qe)
	if math.IsNaN(eps) || math.IsInf(eps, 0) {
		return 0
	}
	return eps
}

// spreadResidue puts what the destinations' loads miss of the demand, r,
// on the destination in use at price λ (λ + pot reaches its no-load
// marginal) whose load is the least sensitive to it: the flattest marginal
// latency (largest 1/G″). Besides rounding, r can be real when λ sits where
// a destination comes into use with a marginal that is flat at zero load
// (large K), or where one is so flat that its load is ill-determined: its
// load then jumps with λ below float64 resolution, and it must take r.
func (s *solver) spreadResidue(dests []int, lam, r float64) {
	best, flat := -1, -1.0
	for _, v := range dests {
		tv := &s.tg[v]
		f := math.Inf(1)
		if tv.h > 0 {
			f = 1 / tv.h
		}
		if !(f > flat) {
			continue // not flatter than the best so far
		}
		srv := &s.m.srv[v-s.n]
		if y := tv.y + r; y < 0 || y > srv.capEff*(1-maxUtilGap) {
			continue
		}
		if tv.y == 0 && lam+s.nd[v].pot < srv.l0*(1-1e-12) {
			continue // not in use at this price
		}
		best, flat = v, f
	}
	if best >= 0 {
		s.tg[best].y += r
		s.tg[best].ok = false // no longer where G' was evaluated
	}
}

// targetsBracketed computes the targets by a bracketed Newton search on λ
// with every load solved exactly at each λ: slower than targetsNewton, but
// it always converges.
func (s *solver) targetsBracketed(order []int, demand, lamShed float64, shedAt int) {
	n, m := s.n, s.m
	dests := s.dests[:0]
	lo := math.Inf(1)
	var sumY, sumInvH, sumPOH float64
	for _, v := range order {
		switch {
		case v < n:
			continue
		case v >= 2*n:
			s.tg[v].y = 0
			continue
		}
		dests = append(dests, v)
		j := v - n
		y := s.y[j]
		g, h := m.srv[j].gh(y)
		s.tg[v].y, s.tg[v].h, s.tg[v].p = y, h, g-s.nd[v].pot
		lo = math.Min(lo, m.srv[j].l0-s.nd[v].pot)
		if y > 0 {
			sumY += y
			sumInvH += 1 / h
			sumPOH += (g - s.nd[v].pot) / h
		}
	}
	s.dests = dests
	if shedAt >= 0 {
		if sum, _ := s.fill(dests, lamShed); sum <= demand {
			s.tg[shedAt].y = demand - sum
			return
		}
	}
	if len(dests) == 0 {
		return // unreachable: a tree without destinations has a shed node
	}
	hi := lamShed
	lam := lo
	if sumInvH > 0 {
		lam = (demand - sumY + sumPOH) / sumInvH
	}
	if !(lam > lo) {
		lam = lo
	}
	if lam >= hi {
		lam = lo + (hi-lo)/2
	}
	for range 400 {
		sum, deriv := s.fill(dests, lam)
		f := sum - demand
		if f < 0 {
			lo = lam
		} else {
			hi = lam
		}
		if math.Abs(f) <= 1e-14*demand || hi-lo <= 1e-15*math.Abs(lam) {
			break
		}
		var nl float64
		if deriv > 0 {
			nl = lam - f/deriv
		} else {
			// Nothing serves at this price yet: go just past the next
			// destination's no-load marginal.
			nl = math.Inf(1)
			for _, v := range dests {
				if a := m.srv[v-n].l0 - s.nd[v].pot; a > lam && a < nl {
					nl = a
				}
			}
			nl += 1e-9 * math.Max(1, math.Abs(nl))
		}
		if !(nl > lo && nl < hi) {
			if math.IsInf(hi, 1) {
				nl = lo + math.Max(1, 2*math.Abs(lo))
			} else {
				nl = lo + (hi-lo)/2
			}
		}
		lam = nl
	}
	var sum float64
	for _, v := range dests {
		sum += s.tg[v].y
	}
	s.spreadResidue(dests, lam, demand-sum)
}

// fill sets tgt for every destination at price λ + pot, each search
// starting from the tangent at its previous target, and returns their total
// load and its derivative in λ.
func (s *solver) fill(dests []int, lam float64) (sum, deriv float64) {
	n, m := s.n, s.m
	for _, v := range dests {
		guess := s.tg[v].y
		if guess > 0 && s.tg[v].h > 0 {
			guess += (lam - s.tg[v].p) / s.tg[v].h
		}
		y, h := m.srv[v-n].loadAt(lam+s.nd[v].pot, guess)
		s.tg[v].y, s.tg[v].h, s.tg[v].p = y, h, lam
		sum += y
		if y > 0 {
			deriv += 1 / h
		}
	}
	return sum, deriv
}
