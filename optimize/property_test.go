package optimize

import (
	"math"
	"testing"

	"pgregory.net/rapid"
)

// genProblem draws a small problem with every feature the model has: idle
// and overloaded regions, zero capacity, down regions, unreachable pairs,
// RTTs from 0 to seconds, and non-default model parameters.
func genProblem(t *rapid.T) Problem {
	n := rapid.IntRange(1, 7).Draw(t, "n")
	p := Problem{
		Regions:  make([]Region, n),
		RTTms:    make([][]float64, n),
		Headroom: rapid.Float64Range(0.05, 1).Draw(t, "headroom"),
		Beta:     rapid.SampledFrom([]float64{0.01, 0.1, 1, 5}).Draw(t, "beta"),
		K:        rapid.SampledFrom([]float64{1, 2, 4, 6.5}).Draw(t, "k"),
	}
	maxL0 := 0.0
	for i := range n {
		r := Region{
			Name:            regionName(i),
			DemandRPS:       rapid.SampledFrom([]float64{0, 1, 50, 120, 400}).Draw(t, "demand") * rapid.Float64Range(0.5, 1.5).Draw(t, "demandScale"),
			CapacityRPS:     rapid.SampledFrom([]float64{0, 10, 100, 300}).Draw(t, "capacity") * rapid.Float64Range(0.5, 1.5).Draw(t, "capacityScale"),
			EngineLatencyMs: rapid.Float64Range(1, 2000).Draw(t, "l0"),
			Down:            rapid.IntRange(0, 9).Draw(t, "down") == 0,
		}
		maxL0 = math.Max(maxL0, r.EngineLatencyMs)
		p.Regions[i] = r
		p.RTTms[i] = make([]float64, n)
	}
	p.ShedPenaltyMs = maxL0 * rapid.Float64Range(1.01, 40).Draw(t, "penaltyFactor")
	for i := range n {
		for j := i + 1; j < n; j++ {
			var v float64
			switch rapid.IntRange(0, 9).Draw(t, "rttKind") {
			case 0:
				v = math.Inf(1)
			case 1:
				v = rapid.Float64Range(1000, 8000).Draw(t, "rttLong")
			default:
				v = rapid.Float64Range(0, 200).Draw(t, "rtt")
			}
			p.RTTms[i][j], p.RTTms[j][i] = v, v
		}
	}
	return p
}

// perturb draws the problem a previous plan was made for: demand and
// capacity moved, regions gone down or come back.
func perturb(t *rapid.T, p Problem) Problem {
	q := p
	q.Regions = append([]Region(nil), p.Regions...)
	for i := range q.Regions {
		q.Regions[i].DemandRPS *= rapid.Float64Range(0.3, 2).Draw(t, "demandDrift")
		q.Regions[i].CapacityRPS *= rapid.Float64Range(0.5, 1.5).Draw(t, "capacityDrift")
		if rapid.IntRange(0, 5).Draw(t, "flip") == 0 {
			q.Regions[i].Down = !q.Regions[i].Down
		}
	}
	return q
}

func TestSolveProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := genProblem(rt)
		if err := p.Validate(); err != nil {
			rt.Fatalf("generated an invalid problem: %v", err)
		}
		solve(rt, p)
	})
}

func TestDampProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := genProblem(rt)
		old := perturb(rt, p)
		prev, err := Solve(old)
		if err != nil {
			rt.Fatalf("Solve(old): %v", err)
		}
		target := solve(rt, p)
		step := rapid.Float64Range(0, 1).Draw(rt, "step")
		got, info := DampWithInfo(p, prev, target, step)
		checkPlan(rt, p, got)

		local := LocalOnly(p).CostMs
		prevCost := Cost(p, prev)
		if got.CostMs > prevCost*(1+1e-9)+1e-9 {
			rt.Errorf("damped cost %v above the previous plan's %v on this problem", got.CostMs, prevCost)
		}
		if got.CostMs > local*(1+1e-9)+1e-9 {
			rt.Errorf("damped cost %v above the local-only cost %v", got.CostMs, local)
		}
		if info.LocalTarget {
			rt.Errorf("Solve's plan was refused as a target")
		}
		// A previous plan that is feasible as it stands keeps every row.
		if !math.IsInf(prevCost, 1) {
			for i, r := range info.Reset {
				if r {
					rt.Errorf("row %d reset although the previous plan is feasible (cost %v)", i, prevCost)
				}
			}
		}
		// Moves are bounded by the step actually used; reset rows are the
		// target's.
		for i := range p.Regions {
			if p.Regions[i].Down {
				continue
			}
			if info.Reset[i] {
				if !rowsEqual(got.Fractions[i], target.Fractions[i], got.Shed[i], target.Shed[i]) {
					rt.Errorf("reset row %d = %v, want the target's %v", i, got.Fractions[i], target.Fractions[i])
				}
				continue
			}
			limit := info.Step + 1e-9
			if d := math.Abs(got.Shed[i] - prev.Shed[i]); d > limit {
				rt.Errorf("row %d shed moved %v, step %v", i, d, info.Step)
			}
			for j := range p.Regions {
				if d := math.Abs(got.Fractions[i][j] - prev.Fractions[i][j]); d > limit {
					rt.Errorf("fraction %d→%d moved %v, step %v", i, j, d, info.Step)
				}
			}
		}
		// The step is the one asked for unless the exceptions applied.
		switch {
		case info.Step > step+1e-12:
			if c := Cost(p, mixAt(prev, target, info.Reset, step)); c <= local {
				rt.Errorf("step raised from %v to %v although the plan at %v costs %v ≤ local-only %v", step, info.Step, step, c, local)
			}
		case info.Step == 0 && step > 0:
			base := mixAt(prev, target, info.Reset, 0)
			if c, b := Cost(p, mixAt(prev, target, info.Reset, step)), Cost(p, base); c <= b {
				rt.Errorf("kept the previous plan although moving costs %v ≤ %v", c, b)
			}
		case math.Abs(info.Step-step) > 1e-12:
			rt.Errorf("step %v, asked for %v", info.Step, step)
		}
	})
}

func rowsEqual(a, b []float64, sa, sb float64) bool {
	if math.Abs(sa-sb) > 1e-12 {
		return false
	}
	for j := range a {
		if math.Abs(a[j]-b[j]) > 1e-12 {
			return false
		}
	}
	return true
}

// mixAt is the test's own row-wise combination of prev (target where
// reset) and target.
func mixAt(prev, target Plan, reset []bool, a float64) Plan {
	out := clonePlan(target)
	for i := range out.Fractions {
		if reset[i] {
			continue
		}
		for j := range out.Fractions[i] {
			out.Fractions[i][j] = (1-a)*prev.Fractions[i][j] + a*target.Fractions[i][j]
		}
		out.Shed[i] = (1-a)*prev.Shed[i] + a*target.Shed[i]
	}
	return out
}

// TestSolverDescends drives the solver round by round: the start may not
// cost more than the local-only plan, and every round (pivots plus
// settles) may only lower the objective.
func TestSolverDescends(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := genProblem(rt)
		m := compile(p.withDefaults())
		s := newSolver(&m)
		s.start()
		obj, _ := s.price()
		if local := m.localCost() * m.total; obj > local*(1+1e-9)+1e-9 {
			rt.Fatalf("start costs %v, local-only %v", obj, local)
		}
		for round := range 30 {
			if len(s.cands) == 0 {
				return
			}
			s.pivotRound()
			next, _ := s.price()
			if next > obj*(1+1e-12)+1e-12 {
				rt.Fatalf("round %d raised the objective from %v to %v", round, obj, next)
			}
			obj = next
		}
	})
}
