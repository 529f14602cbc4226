package optimize

import "math"

// DampInfo says what Damp did.
type DampInfo struct {
	// Step is the weight of the target in the damped plan (damped =
	// (1−Step)·prev + Step·target, row by row): the requested step, more
	// when that would leave the plan costlier than the local-only plan, 0
	// when moving would not lower the cost.
	Step float64
	// Reset[i] is true where the previous plan's row for source i could not
	// be used on the current problem and the target's row was taken
	// instead: the row was malformed, routed to a region that is now down,
	// unreachable or without capacity, or fed a region the previous plan
	// would now load to capacity·headroom or beyond.
	Reset []bool
	// LocalTarget is true when the target itself was unusable on the
	// problem (malformed, infeasible, or costlier than the local-only plan)
	// and the local-only plan was used as the target instead.
	LocalTarget bool
}

// Damp moves the previous plan toward the target by a bounded step, so
// that the global loop converges instead of oscillating: each fraction of
// each row moves by at most step (0 < step ≤ 1; step ≥ 1 takes the
// target, step ≤ 0 keeps the previous plan). See DampWithInfo for the
// exceptions, which exist so that the damped plan is always feasible for
// p, never costs more than the previous plan evaluated on p, and never
// costs more than the local-only plan.
func Damp(p Problem, prev, target Plan, step float64) Plan {
	pl, _ := DampWithInfo(p, prev, target, step)
	return pl
}

// DampWithInfo is Damp, also reporting what it did. The damped plan is
// the row-wise convex combination (1−α)·prev + α·target, α = step, with
// three exceptions:
//   - a source whose previous row cannot be used on p (see
//     DampInfo.Reset) takes the target's row outright;
//   - when the combination would cost more than the local-only plan, α is
//     raised (bisection) to the smallest value for which it does not;
//   - when the combination would cost more than the previous plan (the
//     target is no better than where the plan already is), α is 0.
//
// The objective is convex and loads are linear in the fractions, so every
// combination of two feasible plans is feasible and costs at most the
// dearer of the two. The result carries its own Load, CostMs and Gap on p
// and the target's Iterations. p must be valid; an invalid p returns a
// copy of the target.
func DampWithInfo(p Problem, prev, target Plan, step float64) (Plan, DampInfo) {
	if p.Validate() != nil {
		return clonePlan(target), DampInfo{Step: 1}
	}
	m := compile(p.withDefaults())
	n := m.n
	info := DampInfo{Reset: make([]bool, n)}
	// Costs within costSlack (relative) count as equal: two evaluations of
	// the same plan may differ in the last bits.
	localCost := m.localCost() * (1 + costSlack)

	tgt := target
	if ev := m.check(tgt.Fractions, tgt.Shed, false); !ev.valid || m.perRequest(ev.obj) > localCost {
		tgt = m.localOnly()
		info.LocalTarget = true
	}
	base := m.dampBase(prev, tgt, info.Reset)
	mixed := newPlan(n)
	alpha := m.dampStep(&mixed, base, tgt, step, localCost)
	mix(&mixed, base, tgt, alpha)
	for i := range n {
		if m.isDown(i) {
			clear(mixed.Fractions[i])
			mixed.Shed[i] = 0
		}
	}
	info.Step = alpha
	mixed.Iterations = target.Iterations
	m.finish(&mixed)
	return mixed, info
}

// dampBase is the previous plan, row by row, as far as it is usable on m;
// the other rows are the target's, and reset marks them.
func (m *model) dampBase(prev, tgt Plan, reset []bool) Plan {
	n := m.n
	base := newPlan(n)
	shapeOK := len(prev.Fractions) == n && len(prev.Shed) == n
	for i := range n {
		if m.isDown(i) {
			continue
		}
		if shapeOK && m.usableRow(i, prev.Fractions[i], prev.Shed[i]) {
			normaliseRow(base.Fractions[i], &base.Shed[i], prev.Fractions[i], prev.Shed[i])
		} else {
			reset[i] = true
			copy(base.Fractions[i], tgt.Fractions[i])
			base.Shed[i] = tgt.Shed[i]
		}
	}
	// Sources feeding a region the base would load to capacity take the
	// target's row, until no region is overloaded (all target rows at
	// worst, which are feasible).
	for m.resetOverloaded(base, tgt, reset) {
		// again, with the rows just reset
	}
	return base
}

// resetOverloaded gives every source feeding a region that base loads to
// capacity the target's row, and reports whether any row changed.
func (m *model) resetOverloaded(base, tgt Plan, reset []bool) bool {
	n := m.n
	load := make([]float64, n)
	for i := range n {
		for j, f := range base.Fractions[i] {
			if f > 0 {
				load[j] += f * m.demand[i]
			}
		}
	}
	changed := false
	for j := range n {
		if load[j] == 0 || load[j] < m.srv[j].capEff*(1-maxUtilGap) {
			continue
		}
		for i := range n {
			if !reset[i] && base.Fractions[i][j] > 0 && m.demand[i] > 0 {
				reset[i] = true
				copy(base.Fractions[i], tgt.Fractions[i])
				base.Shed[i] = tgt.Shed[i]
				changed = true
			}
		}
	}
	return changed
}

// dampStep is the α of the combination of base and tgt: step clamped to
// [0, 1], raised by bisection until the combination costs no more than
// localCost, or 0 when it costs more than base. mixed is scratch.
func (m *model) dampStep(mixed *Plan, base, tgt Plan, step, localCost float64) float64 {
	alpha := step
	switch {
	case math.IsNaN(alpha) || alpha > 1:
		alpha = 1
	case alpha < 0:
		alpha = 0
	}
	costAt := func(a float64) float64 {
		mix(mixed, base, tgt, a)
		ev := m.check(mixed.Fractions, mixed.Shed, false)
		if !ev.valid {
			return math.Inf(1)
		}
		return m.perRequest(ev.obj)
	}
	baseCost := costAt(0)
	c := costAt(alpha)
	switch {
	case c > localCost:
		lo, hi := alpha, 1.0
		for range 60 {
			mid := lo + (hi-lo)/2
			if mid <= lo || mid >= hi {
				break
			}
			if costAt(mid) <= localCost {
				hi = mid
			} else {
				lo = mid
			}
		}
		alpha = hi
	case c > baseCost*(1+costSlack):
		alpha = 0
	}
	return alpha
}

// costSlack is the relative rounding allowance of Damp's cost comparisons.
const costSlack = 1e-12

// usableRow reports whether a previous plan's row for source i can be used
// on m: right length, finite shares in [0, 1] adding up to 1, nothing sent
// to a region that is down, unreachable or without capacity.
func (m *model) usableRow(i int, row []float64, shed float64) bool {
	if len(row) != m.n || !(shed >= -rowTolerance && shed <= 1+rowTolerance) {
		return false
	}
	sum := shed
	for j, f := range row {
		if math.IsNaN(f) || f < -rowTolerance || f > 1+rowTolerance {
			return false
		}
		if f > 0 && !m.reachable(i, j) {
			return false
		}
		sum += f
	}
	return math.Abs(sum-1) <= rowTolerance
}

// normaliseRow copies a usable row into dst, clamping tiny negatives to 0
// and scaling so that fractions and shed add up to exactly 1.
func normaliseRow(dst []float64, dstShed *float64, row []float64, shed float64) {
	sum := math.Max(shed, 0)
	for _, f := range row {
		sum += math.Max(f, 0)
	}
	for j, f := range row {
		dst[j] = math.Max(f, 0) / sum
	}
	*dstShed = math.Max(shed, 0) / sum
}

// mix sets dst to the row-wise combination (1−a)·base + a·tgt.
func mix(dst *Plan, base, tgt Plan, a float64) {
	for i := range dst.Fractions {
		for j := range dst.Fractions[i] {
			dst.Fractions[i][j] = (1-a)*base.Fractions[i][j] + a*tgt.Fractions[i][j]
		}
		dst.Shed[i] = (1-a)*base.Shed[i] + a*tgt.Shed[i]
	}
}

// clonePlan returns a deep copy of pl.
func clonePlan(pl Plan) Plan {
	out := pl
	out.Fractions = make([][]float64, len(pl.Fractions))
	for i, row := range pl.Fractions {
		out.Fractions[i] = append([]float64(nil), row...)
	}
	out.Shed = append([]float64(nil), pl.Shed...)
	out.Load = append([]float64(nil), pl.Load...)
	return out
}
