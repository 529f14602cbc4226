package optimize

import "math"

// settleFrom settles the tree of start if it is dirty and, while settling
// drops edges, every tree those edges left behind.
func (s *solver) settleFrom(start int) {
	work := append(s.work[:0], start)
	for len(work) > 0 {
		v := work[len(work)-1]
		work = work[:len(work)-1]
		if !s.dirty[v] {
			continue
		}
		s.work = work
		s.settle(v)
		work = s.work
	}
	s.work = work
}

// settle moves the tree of start toward the optimum of the objective
// restricted to its edges, as far as flows stay ≥ 0; edges whose flow
// reaches 0 leave the basis and their ends are queued on s.work.
//
// With tree potentials pot (rtt + pot[option] = pot[source] on every
// edge), the RTT part of the cost is, up to a constant, −Σ_j pot_j·y_j, so
// the restricted optimum gives each destination the load at which its
// marginal latency is λ + pot_j, for the λ at which the loads add up to the
// tree's demand (a water-fill); a shed node caps λ at P − pot. The flows
// follow from the loads, since the edges form a tree.
func (s *solver) settle(start int) {
	n, m := s.n, s.m
	s.bfs(start)
	order := s.order
	if len(order) == 1 {
		return
	}
	var demand float64
	lamShed := math.Inf(1)
	shedAt := -1
	for _, v := range order {
		switch {
		case v < n:
			demand += m.demand[v]
		case v >= 2*n:
			if c := m.P - s.pot[v]; c < lamShed {
				lamShed, shedAt = c, v
			}
		}
	}
	s.targets(order, demand, lamShed, shedAt)
	// Target flows: the net supply of each subtree, leaves first; the flow
	// (source → option) on v's parent edge is net[v] when v is the source
	// and −net[v] when v is the option.
	for _, v := range order {
		if v < n {
			s.net[v] = m.demand[v]
		} else {
			s.net[v] = -s.tgt[v]
		}
	}
	for k := len(order) - 1; k > 0; k-- {
		v := order[k]
		s.net[s.par[v]] += s.net[v]
	}
	for _, v := range order[1:] {
		if v >= n {
			s.net[v] = -s.net[v]
		}
	}
	// Ratio test: the largest step toward the target keeping flows ≥ 0.
	// The objective is convex and the target is its minimum over a set
	// that holds the current flows, so it falls all along the step.
	t := 1.0
	for _, v := range order[1:] {
		x0, x1 := s.edges[s.psrc[v]][s.pk[v]].x, s.net[v]
		if x1 < x0 {
			if r := x0 / (x0 - x1); r < t {
				t = r
			}
		}
	}
	for _, v := range order {
		if v >= n && v < 2*n {
			s.y[v-n] = 0
		}
	}
	drops := s.drops[:0]
	for _, v := range order[1:] {
		src := s.psrc[v]
		e := &s.edges[src][s.pk[v]]
		x1 := s.net[v]
		x := e.x + t*(x1-e.x)
		if x <= 1e-13*m.demand[src] {
			x = 0
			// An edge at 0 leaves unless its target flow is positive
			// (then only another edge blocked the step, at t = 0).
			if x1 <= 0 {
				drops = append(drops, candidate{i: src, o: e.o})
			}
		}
		e.x = x
		if e.o < n {
			s.y[e.o] += x
		}
	}
	for _, d := range drops {
		s.removeEdge(d.i, d.o)
		s.work = append(s.work, d.i, s.optNode(d.i, d.o))
	}
	s.drops = drops
}

// bfs walks the tree of start (made its root), recording the visiting
// order, parents, depths, parent edges and tree potentials (pot[start] =
// 0), and clears the tree's dirty marks.
func (s *solver) bfs(start int) {
	n := s.n
	s.stamp++
	order := append(s.order[:0], start)
	s.seen[start] = s.stamp
	s.par[start] = -1
	s.depth[start] = 0
	s.pot[start] = 0
	for q := 0; q < len(order); q++ {
		v := order[q]
		s.dirty[v] = false
		d := s.depth[v] + 1
		switch {
		case v < n: // source
			for k, e := range s.edges[v] {
				w := s.optNode(v, e.o)
				if s.seen[w] != s.stamp {
					s.seen[w] = s.stamp
					s.par[w], s.depth[w] = v, d
					s.psrc[w], s.pk[w] = v, k
					s.pot[w] = s.pot[v] - s.rttTo(v, e.o)
					order = append(order, w)
				}
			}
		case v < 2*n: // destination
			j := v - n
			for _, src := range s.dsrc[j] {
				if s.seen[src] != s.stamp {
					s.seen[src] = s.stamp
					s.par[src], s.depth[src] = v, d
					s.psrc[src], s.pk[src] = src, s.findEdge(src, j)
					s.pot[src] = s.pot[v] + s.m.rtt[src][j]
					order = append(order, src)
				}
			}
		default: // shed node of source v-2n
			src := v - 2*n
			if k := s.findEdge(src, n); k >= 0 && s.seen[src] != s.stamp {
				s.seen[src] = s.stamp
				s.par[src], s.depth[src] = v, d
				s.psrc[src], s.pk[src] = src, k
				s.pot[src] = s.pot[v]
				order = append(order, src)
			}
		}
	}
	s.order = order
}

// targets sets tgt, for every option node of the tree in order, to its load
// at the restricted optimum: each destination j at the load where its
// marginal latency is λ + pot_j, with the loads adding up to demand; the
// cheapest shed node (λ capped at P − pot) takes what the destinations do
// not.
func (s *solver) targets(order []int, demand, lamShed float64, shedAt int) {
	if !s.targetsNewton(order, demand, lamShed, shedAt) {
		s.targetsBracketed(order, demand, lamShed, shedAt)
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
			s.tgt[v] = 0
			continue
		}
		dests = append(dests, v)
		j := v - n
		y := s.y[j]
		g, h := m.srv[j].gh(y)
		s.tgt[v], s.tgh[v], s.tgp[v] = y, h, g-s.pot[v]
		if y > 0 {
			sumY += y
			sumInvH += 1 / h
			sumPOH += (g - s.pot[v]) / h
		}
	}
	s.dests = dests
	if len(dests) == 0 {
		if shedAt < 0 {
			return false
		}
		s.tgt[shedAt] = demand
		return true
	}
	// step moves every destination to its tangent estimate at λ and
	// returns the new total, Σ 1/h and Σ (price − λ)/h there, and the
	// largest relative price error before the step.
	step := func(lam float64) (sum, invH, poh, perr float64) {
		for _, v := range dests {
			srv := &m.srv[v-n]
			y, h, p := s.tgt[v], s.tgh[v], s.tgp[v]
			target := lam + s.pot[v]
			var ny float64
			switch {
			case !(target > srv.l0):
				ny = 0
			case y > 0 && h > 0:
				if e := math.Abs(p-lam) / target; e > perr {
					perr = e
				}
				ny = y + (lam-p)/h
				if top := srv.capEff * (1 - maxUtilGap); !(ny < top) {
					ny = y + (top-y)/2
				}
			default: // comes into use: search from scratch
				ny, _ = srv.loadAt(target, 0)
				perr = math.Max(perr, 1)
			}
			if ny <= 0 {
				s.tgt[v], s.tgh[v], s.tgp[v] = 0, 0, srv.l0-s.pot[v]
				continue
			}
			g, gh := srv.gh(ny)
			s.tgt[v], s.tgh[v], s.tgp[v] = ny, gh, g-s.pot[v]
			sum += ny
			invH += 1 / gh
			poh += (g - s.pot[v] - lam) / gh
		}
		return sum, invH, poh, perr
	}
	if shedAt >= 0 {
		// Does the shed node cap λ? Converge every load at λ = P − pot_S.
		var sum float64
		ok := false
		for range 60 {
			var perr float64
			sum, _, _, perr = step(lamShed)
			if perr <= newtonTolerance {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
		if sum <= demand {
			s.tgt[shedAt] = demand - sum
			return true
		}
		sumY, sumInvH, sumPOH = sum, 0, 0
		for _, v := range dests {
			if s.tgt[v] > 0 {
				sumInvH += 1 / s.tgh[v]
				sumPOH += s.tgp[v] / s.tgh[v]
			}
		}
	}
	if !(sumInvH > 0) {
		return false
	}
	lam := (demand - sumY + sumPOH) / sumInvH
	for range 60 {
		if lam >= lamShed {
			return false
		}
		sum, invH, poh, perr := step(lam)
		if perr <= newtonTolerance && math.Abs(sum-demand) <= newtonTolerance*demand {
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
		srv := &s.m.srv[v-s.n]
		y := s.tgt[v] + r
		if y < 0 || y > srv.capEff*(1-maxUtilGap) {
			continue
		}
		if s.tgt[v] == 0 && lam+s.pot[v] < srv.l0*(1-1e-12) {
			continue // not in use at this price
		}
		f := math.Inf(1)
		if s.tgh[v] > 0 {
			f = 1 / s.tgh[v]
		}
		if f > flat {
			best, flat = v, f
		}
	}
	if best >= 0 {
		s.tgt[best] += r
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
			s.tgt[v] = 0
			continue
		}
		dests = append(dests, v)
		j := v - n
		y := s.y[j]
		g, h := m.srv[j].gh(y)
		s.tgt[v], s.tgh[v], s.tgp[v] = y, h, g-s.pot[v]
		lo = math.Min(lo, m.srv[j].l0-s.pot[v])
		if y > 0 {
			sumY += y
			sumInvH += 1 / h
			sumPOH += (g - s.pot[v]) / h
		}
	}
	s.dests = dests
	if shedAt >= 0 {
		if sum, _ := s.fill(dests, lamShed); sum <= demand {
			s.tgt[shedAt] = demand - sum
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
				if a := m.srv[v-n].l0 - s.pot[v]; a > lam && a < nl {
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
		sum += s.tgt[v]
	}
	s.spreadResidue(dests, lam, demand-sum)
}

// fill sets tgt for every destination at price λ + pot, each search
// starting from the tangent at its previous target, and returns their total
// load and its derivative in λ.
func (s *solver) fill(dests []int, lam float64) (sum, deriv float64) {
	n, m := s.n, s.m
	for _, v := range dests {
		guess := s.tgt[v]
		if guess > 0 && s.tgh[v] > 0 {
			guess += (lam - s.tgp[v]) / s.tgh[v]
		}
		y, h := m.srv[v-n].loadAt(lam+s.pot[v], guess)
		s.tgt[v], s.tgh[v], s.tgp[v] = y, h, lam
		sum += y
		if y > 0 {
			deriv += 1 / h
		}
	}
	return sum, deriv
}
