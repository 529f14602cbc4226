package optimize_test

import (
	"fmt"

	"github.com/isobar-mesh/isobar/optimize"
)

// The worked example of the design: B's 120 rps overload its 100 rps, and
// the plan sends part of it 30 ms away to C, whose queue is shorter.
func ExampleSolve() {
	p := optimize.Problem{
		Regions: []optimize.Region{
			{Name: "a", DemandRPS: 90, CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "b", DemandRPS: 120, CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "c", DemandRPS: 40, CapacityRPS: 80, EngineLatencyMs: 300},
		},
		RTTms:    [][]float64{{0, 20, 60}, {20, 0, 30}, {60, 30, 0}},
		Headroom: 1,
	}
	pl, err := optimize.Solve(p)
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, r := range p.Regions {
		fmt.Printf("%s: ", r.Name)
		for j, f := range pl.Fractions[i] {
			if f > 0 {
				fmt.Printf("%s %.3f ", p.Regions[j].Name, f)
			}
		}
		fmt.Printf("load %.1f rps\n", pl.Load[i])
	}
	fmt.Printf("b→c %.1f rps; %.0f ms per request, local-only %.0f ms\n",
		pl.Fractions[1][2]*120, pl.CostMs, optimize.LocalOnly(p).CostMs)
	// Output:
	// a: a 0.993 b 0.007 load 89.3 rps
	// b: b 0.738 c 0.262 load 89.3 rps
	// c: c 1.000 load 71.4 rps
	// b→c 31.4 rps; 482 ms per request, local-only 1525 ms
}

// A global loop damps each new optimum into the plan in force, so no
// fraction moves by more than the step per cycle.
func ExampleDamp() {
	p := optimize.Problem{
		Regions: []optimize.Region{
			{Name: "a", DemandRPS: 60, CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "b", DemandRPS: 110, CapacityRPS: 100, EngineLatencyMs: 300},
		},
		RTTms:    [][]float64{{0, 20}, {20, 0}},
		Headroom: 0.9,
	}
	plan := optimize.LocalOnly(p)
	target, _ := optimize.Solve(p)
	for cycle := 1; cycle <= 3; cycle++ {
		plan = optimize.Damp(p, plan, target, 0.5)
		fmt.Printf("cycle %d: b keeps %.3f, sends %.3f to a, sheds %.3f\n",
			cycle, plan.Fractions[1][1], plan.Fractions[1][0], plan.Shed[1])
	}
	fmt.Printf("optimum: b keeps %.3f, sends %.3f to a, sheds %.3f\n",
		target.Fractions[1][1], target.Fractions[1][0], target.Shed[1])
	// Output:
	// cycle 1: b keeps 0.773, sends 0.114 to a, sheds 0.113
	// cycle 2: b keeps 0.773, sends 0.170 to a, sheds 0.057
	// cycle 3: b keeps 0.773, sends 0.199 to a, sheds 0.028
	// optimum: b keeps 0.773, sends 0.227 to a, sheds 0.000
}
