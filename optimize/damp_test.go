package optimize

import (
	"math"
	"testing"
)

// TestDampConverges: a global loop that damps toward a fixed optimum every
// cycle lowers the cost every cycle, moves each fraction by at most the
// step, and converges on the optimum without overshooting.
func TestDampConverges(t *testing.T) {
	p := threeRegions(1)
	target := solve(t, p)
	cur := LocalOnly(p)
	const step = 0.25
	for cycle := range 40 {
		next, info := DampWithInfo(p, cur, target, step)
		checkPlan(t, p, next)
		if info.Step != step {
			t.Fatalf("cycle %d: step %v, want %v", cycle, info.Step, step)
		}
		if next.CostMs > cur.CostMs*(1+1e-12) {
			t.Fatalf("cycle %d: cost rose from %v to %v", cycle, cur.CostMs, next.CostMs)
		}
		for i := range cur.Fractions {
			for j := range cur.Fractions[i] {
				if d := math.Abs(next.Fractions[i][j] - cur.Fractions[i][j]); d > step+1e-12 {
					t.Fatalf("cycle %d: fraction %d→%d moved %v", cycle, i, j, d)
				}
			}
		}
		cur = next
	}
	if math.Abs(cur.CostMs-target.CostMs) > 1e-3*target.CostMs {
		t.Errorf("after 40 cycles cost %v, optimum %v", cur.CostMs, target.CostMs)
	}
}

func TestDampResets(t *testing.T) {
	t.Run("destination went down", func(t *testing.T) {
		old := threeRegions(1)
		prev := solve(t, old) // b sends a quarter of its traffic to c
		p := threeRegions(1)
		p.Regions[2].Down = true
		got, info := DampWithInfo(p, prev, solve(t, p), 0.1)
		checkPlan(t, p, got)
		if !info.Reset[1] {
			t.Errorf("b's row (sending to c) was not reset: %v", info.Reset)
		}
		if info.Reset[0] {
			t.Errorf("a's row (not touching c) was reset")
		}
		if got.Fractions[2][2] != 0 || got.Load[2] != 0 {
			t.Errorf("down region c still in the plan: row %v load %v", got.Fractions[2], got.Load[2])
		}
	})
	t.Run("demand jump overloads", func(t *testing.T) {
		prev := solve(t, threeRegions(0.9))
		p := threeRegions(0.9)
		p.Regions[2].DemandRPS = 70 // c's own traffic now fills c; b still sends some there
		got, info := DampWithInfo(p, prev, solve(t, p), 0.1)
		checkPlan(t, p, got)
		if !info.Reset[1] || !info.Reset[2] {
			t.Errorf("sources feeding the overloaded c not reset: %v", info.Reset)
		}
		if !math.IsInf(Cost(p, prev), 1) {
			t.Errorf("the previous plan should overload c on the new demand (cost %v)", Cost(p, prev))
		}
	})
	t.Run("malformed previous plan", func(t *testing.T) {
		p := threeRegions(0.9)
		target := solve(t, p)
		got, info := DampWithInfo(p, Plan{}, target, 0.1)
		for i, r := range info.Reset {
			if !r {
				t.Errorf("row %d not reset", i)
			}
		}
		if math.Abs(got.CostMs-target.CostMs) > 1e-12*target.CostMs {
			t.Errorf("cost %v, want the target's %v", got.CostMs, target.CostMs)
		}
	})
}

func TestDampExceptions(t *testing.T) {
	p := threeRegions(1)
	target := solve(t, p)
	local := LocalOnly(p)

	t.Run("step bounds", func(t *testing.T) {
		if got, info := DampWithInfo(p, local, target, 0); info.Step != 0 || got.CostMs != local.CostMs {
			t.Errorf("step 0: step %v cost %v, want the previous plan (%v)", info.Step, got.CostMs, local.CostMs)
		}
		for _, step := range []float64{1, 7, math.NaN()} {
			if got, info := DampWithInfo(p, local, target, step); info.Step != 1 || math.Abs(got.CostMs-target.CostMs) > 1e-12*target.CostMs {
				t.Errorf("step %v: used %v cost %v, want the target (%v)", step, info.Step, got.CostMs, target.CostMs)
			}
		}
	})
	t.Run("previous plan costlier than local-only", func(t *testing.T) {
		shedAll := newPlan(3)
		for i := range shedAll.Shed {
			shedAll.Shed[i] = 1
		}
		got, info := DampWithInfo(p, shedAll, target, 0.01)
		if !(info.Step > 0.01) {
			t.Errorf("step %v, want it raised above 0.01", info.Step)
		}
		if got.CostMs > local.CostMs*(1+1e-9) {
			t.Errorf("cost %v above local-only %v", got.CostMs, local.CostMs)
		}
		if lower := Cost(p, mixAt(shedAll, target, info.Reset, info.Step*0.99)); lower <= local.CostMs {
			t.Errorf("a 1 %% smaller step (%v) already reaches the local-only cost: %v ≤ %v", info.Step*0.99, lower, local.CostMs)
		}
	})
	t.Run("target no better than previous", func(t *testing.T) {
		// Damping from the optimum toward the local-only plan would only
		// raise the cost: the plan stays.
		got, info := DampWithInfo(p, target, local, 0.5)
		if info.Step != 0 || math.Abs(got.CostMs-target.CostMs) > 1e-12*target.CostMs {
			t.Errorf("step %v cost %v, want to keep the optimum (%v)", info.Step, got.CostMs, target.CostMs)
		}
	})
	t.Run("unusable target", func(t *testing.T) {
		bad := clonePlan(target)
		bad.Fractions[0][0] = math.NaN()
		got, info := DampWithInfo(p, local, bad, 1)
		if !info.LocalTarget || math.Abs(got.CostMs-local.CostMs) > 1e-12*local.CostMs {
			t.Errorf("LocalTarget %v cost %v, want the local-only plan", info.LocalTarget, got.CostMs)
		}
	})
	t.Run("invalid problem", func(t *testing.T) {
		if got := Damp(Problem{}, local, target, 0.5); got.CostMs != target.CostMs {
			t.Errorf("Damp on an invalid problem changed the target")
		}
	})
}
