package optimize

import "math"

// rowTolerance is how far a plan row (fractions plus shed) may sum from 1,
// and how negative a share may be, before Cost calls the plan invalid.
const rowTolerance = 1e-6

// Plan is a routing plan for one Problem.
type Plan struct {
	// Fractions[i][j] is the share of region i's demand served at region j.
	// Row i and Shed[i] sum to 1 for every up region i. A down region's row
	// and shed are all zero. Solve gives a region with no demand the row a
	// new request would take (its cheapest option at the plan's loads).
	Fractions [][]float64
	// Shed[i] is the share of region i's demand shed at its ingress.
	Shed []float64
	// Load[j] is the load the plan puts on region j (requests/s).
	Load []float64
	// CostMs is the objective divided by the total demand of up regions:
	// the mean expected ms per request, RTT plus engine latency, a shed
	// request counted at ShedPenaltyMs. 0 when there is no demand; +Inf for
	// a plan that is invalid for its problem.
	CostMs float64
	// Iterations is the number of solver rounds that produced the plan (0
	// for LocalOnly; see the package doc).
	Iterations int
	// Gap is the Frank-Wolfe duality gap of the plan, in the units of
	// CostMs: CostMs minus the optimum is at most Gap.
	Gap float64
}

// model is a Problem compiled for evaluation: defaults applied, one server
// per region, the up regions' demand.
type model struct {
	n      int
	srv    []server
	demand []float64 // 0 for down regions
	downs  []bool
	rtt    [][]float64
	P      float64
	total  float64 // Σ demand of up regions
	pr     *pricer // prices the duality gap when set (see Solve)
}

func compile(p Problem) model {
	p = p.withDefaults()
	n := len(p.Regions)
	m := model{n: n, srv: make([]server, n), demand: make([]float64, n), downs: make([]bool, n), rtt: p.RTTms, P: p.ShedPenaltyMs}
	for i, r := range p.Regions {
		m.srv[i] = newServer(r, p)
		m.downs[i] = r.Down
		if d, _, _ := r.resolved(); !r.Down {
			m.demand[i] = d
			m.total += d
		}
	}
	return m
}

// reachable reports whether traffic from i may be served at j.
func (m *model) reachable(i, j int) bool {
	return m.srv[j].usable && !math.IsInf(m.rtt[i][j], 1)
}

// evaluation is a plan checked against a model.
type evaluation struct {
	load  []float64
	obj   float64 // Σ x·(rtt+L) + P·Σ shed, in ms·rps
	gap   float64 // Frank-Wolfe duality gap, in ms·rps
	valid bool
}

// evaluate checks pl against m and computes its loads, objective and
// duality gap. An invalid plan (wrong shape, bad numbers, rows not summing
// to 1, routes to an unusable or unreachable region, loads at or above
// capacity) has valid = false and obj = +Inf.
func (m *model) evaluate(fr [][]float64, shed []float64) evaluation {
	return m.check(fr, shed, true)
}

// check is evaluate, computing the duality gap only when withGap is set.
func (m *model) check(fr [][]float64, shed []float64, withGap bool) evaluation {
	ev := evaluation{load: make([]float64, m.n), obj: math.Inf(1), gap: math.Inf(1)}
	if len(fr) != m.n || len(shed) != m.n {
		return ev
	}
	var shedTotal float64
	var rttCost float64
	// With the gap: the destinations each row uses, row i's from
	// used[rowAt[i]] to used[rowAt[i+1]], for the gap's second pass.
	var used []int32
	var rowAt []int
	if withGap {
		rowAt = make([]int, m.n+1)
	}
	for i := range m.n {
		if len(fr[i]) != m.n {
			return ev
		}
		if withGap {
			rowAt[i] = len(used)
		}
		if m.isDown(i) {
			continue
		}
		sum := shed[i]
		if !(shed[i] >= -rowTolerance && shed[i] <= 1+rowTolerance) {
			return ev
		}
		for j, f := range fr[i] {
			if math.IsNaN(f) || f < -rowTolerance || f > 1+rowTolerance {
				return ev
			}
			if f > 0 && !m.reachable(i, j) {
				return ev
			}
			sum += f
			if f > 0 {
				x := f * m.demand[i]
				ev.load[j] += x
				rttCost += x * m.rtt[i][j]
				if withGap {
					used = append(used, int32(j))
				}
			}
		}
		if math.Abs(sum-1) > rowTolerance {
			return ev
		}
		shedTotal += math.Max(shed[i], 0) * m.demand[i]
	}
	if withGap {
		rowAt[m.n] = len(used)
	}
	obj := rttCost + m.P*shedTotal
	for j := range m.n {
		if ev.load[j] > 0 && ev.load[j] >= m.srv[j].capEff {
			return ev
		}
		obj += m.srv[j].total(ev.load[j])
	}
	if !withGap {
		ev.obj, ev.valid = obj, true
		return ev
	}
	gap := m.gapOf(fr, shed, ev.load, used, rowAt)
	ev.obj, ev.gap, ev.valid = obj, math.Max(gap, 0), true
	return ev
}

// gapOf is check's duality gap of a valid plan with per-region load:
// what each source pays at the loads' marginal latencies over what its
// cheapest option would cost. Row i uses the destinations
// used[rowAt[i]:rowAt[i+1]].
func (m *model) gapOf(fr [][]float64, shed, load []float64, used []int32, rowAt []int) float64 {
	mu := make([]float64, m.n)
	for j := range m.n {
		mu[j] = m.marginalOf(j, load[j])
	}
	if m.pr != nil {
		m.pr.load(mu)
	}
	var gap float64
	for i := range m.n {
		d := m.demand[i]
		if d == 0 {
			continue
		}
		var best float64
		if m.pr != nil {
			best, _ = m.pr.cheapest(i, m.P)
		} else {
			best, _ = m.cheapest(i, mu)
		}
		cost := math.Max(shed[i], 0) * m.P
		for _, j := range used[rowAt[i]:rowAt[i+1]] {
			cost += fr[i][j] * (m.rtt[i][j] + mu[j])
		}
		gap += d * (cost - best)
	}
	return gap
}

// isDown reports whether region i is down (it is then no source and no
// destination).
func (m *model) isDown(i int) bool { return m.downs[i] }

// marginalOf returns the marginal latency of destination j at load y, +Inf
// when j cannot serve.
func (m *model) marginalOf(j int, y float64) float64 {
	if !m.srv[j].usable {
		return math.Inf(1)
	}
	return m.srv[j].marginal(y)
}

// cheapest returns the cheapest marginal cost of a request from i,
// min(P, min_j rtt_ij + mu_j), and its option (-1: shed).
func (m *model) cheapest(i int, mu []float64) (float64, int) {
	row := m.rtt[i]
	mu = mu[:len(row)]
	// Four independent running minima, then the exact argmin among them:
	// this loop is the solver's pricing hot path.
	b0, b1, b2, b3 := m.P, m.P, m.P, m.P
	a0, a1, a2, a3 := -1, -1, -1, -1
	j := 0
	for ; j+4 <= len(row); j += 4 {
		if c := row[j] + mu[j]; c < b0 {
			b0, a0 = c, j
		}
		if c := row[j+1] + mu[j+1]; c < b1 {
			b1, a1 = c, j+1
		}
		if c := row[j+2] + mu[j+2]; c < b2 {
			b2, a2 = c, j+2
		}
		if c := row[j+3] + mu[j+3]; c < b3 {
			b3, a3 = c, j+3
		}
	}
	for ; j < len(row); j++ {
		if c := row[j] + mu[j]; c < b0 {
			b0, a0 = c, j
		}
	}
	best, at := b0, a0
	for _, c := range [...]struct {
		b float64
		a int
	}{{b1, a1}, {b2, a2}, {b3, a3}} {
		if c.b < best || (c.b == best && c.a >= 0 && (at < 0 || c.a < at)) {
			best, at = c.b, c.a
		}
	}
	return best, at
}

// perRequest divides a total in ms·rps by the total demand.
func (m *model) perRequest(v float64) float64 {
	if m.total == 0 {
		return 0
	}
	return v / m.total
}

// Cost evaluates pl on p: the mean expected ms per request (see
// Plan.CostMs). It ignores pl.Load and pl.CostMs and works from the
// fractions and p's current demand, so it also prices an old plan on a new
// problem. A plan that is invalid for p (wrong shape, bad numbers, a row
// not summing to 1, a route to a down, zero-capacity or unreachable region,
// a load at or above capacity·headroom) costs +Inf, and so does any plan
// on an invalid p.
func Cost(p Problem, pl Plan) float64 {
	if p.Validate() != nil {
		return math.Inf(1)
	}
	m := compile(p)
	ev := m.evaluate(pl.Fractions, pl.Shed)
	if !ev.valid {
		return math.Inf(1)
	}
	return m.perRequest(ev.obj)
}

// newPlan allocates an n-region plan.
func newPlan(n int) Plan {
	fr := make([][]float64, n)
	flat := make([]float64, n*n)
	for i := range fr {
		fr[i] = flat[i*n : (i+1)*n : (i+1)*n]
	}
	return Plan{Fractions: fr, Shed: make([]float64, n), Load: make([]float64, n)}
}

// finish fills pl's Load, CostMs and Gap from an evaluation on m.
func (m *model) finish(pl *Plan) {
	ev := m.evaluate(pl.Fractions, pl.Shed)
	copy(pl.Load, ev.load)
	pl.CostMs = math.Inf(1)
	pl.Gap = math.Inf(1)
	if ev.valid {
		pl.CostMs = m.perRequest(ev.obj)
		pl.Gap = m.perRequest(ev.gap)
	}
}

// LocalOnly returns the plan in which every up region serves its own demand
// and nothing crosses regions: region i serves min(d_i, y_i) where y_i is
// the load at which its marginal latency reaches ShedPenaltyMs (just below
// capacity·headroom: serving more costs more than shedding, and serving
// c·h exactly would cost +Inf in this model), and sheds the rest. A region
// with no capacity sheds all its demand. p must be valid (see Validate);
// an invalid p gives a plan whose CostMs is +Inf.
func LocalOnly(p Problem) Plan {
	n := len(p.Regions)
	pl := newPlan(n)
	if p.Validate() != nil {
		pl.CostMs, pl.Gap = math.Inf(1), math.Inf(1)
		return pl
	}
	m := compile(p)
	return m.localOnly()
}

// localServed returns how much of region i's demand the local-only plan
// serves at i.
func (m *model) localServed(i int) float64 {
	if m.isDown(i) {
		return 0
	}
	return math.Min(m.demand[i], m.srv[i].loadAtMarginal(m.P))
}

// localOnly builds the local-only plan of a valid model.
func (m *model) localOnly() Plan {
	pl := newPlan(m.n)
	for i := range m.n {
		if m.isDown(i) {
			continue
		}
		d := m.demand[i]
		served := m.localServed(i)
		switch {
		case d == 0 && m.srv[i].usable:
			pl.Fractions[i][i] = 1
		case d == 0 || served <= 0:
			pl.Shed[i] = 1
		default:
			pl.Fractions[i][i] = served / d
			pl.Shed[i] = 1 - pl.Fractions[i][i]
		}
	}
	m.finish(&pl)
	return pl
}

// localCost returns the local-only plan's CostMs without building it.
func (m *model) localCost() float64 {
	var obj float64
	for i := range m.n {
		if m.isDown(i) {
			continue
		}
		served := m.localServed(i)
		obj += m.srv[i].total(served) + m.P*(m.demand[i]-served)
	}
	return m.perRequest(obj)
}
