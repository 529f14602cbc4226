package optimize

import "testing"

// On realistic fleets (randomProblem) at 1.4× their demand, split 20/50/30
// critical/standard/sheddable and unconstrained, the shortfall falls on
// sheddable demand: critical and standard keep (nearly) everything.
func TestSlicesShedOrderRealistic(t *testing.T) {
	for seed := range uint64(5) {
		p := randomProblem(newRand(seed, 60), 60)
		var sl []Slice
		var total float64
		for i, r := range p.Regions {
			d := 1.4 * r.DemandRPS
			total += d
			sl = append(sl, Slice{Source: i, Band: 0, RPS: 0.2 * d}, Slice{Source: i, Band: 1, RPS: 0.5 * d}, Slice{Source: i, Band: 2, RPS: 0.3 * d})
		}
		sp, err := SolveSlices(p, sl, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkSlicePlan(t, p, sl, sp)
		crit, std, shed := shedRPS(sl, sp, 0), shedRPS(sl, sp, 1), shedRPS(sl, sp, 2)
		// Today's plan of the same demand, blind to criticality.
		q := p
		q.Regions = append([]Region(nil), p.Regions...)
		for i := range q.Regions {
			q.Regions[i].DemandRPS *= 1.4
		}
		today, err := SolveLocalFirst(q, 0)
		if err != nil {
			t.Fatal(err)
		}
		var todayShed float64
		for i, r := range q.Regions {
			todayShed += today.Shed[i] * r.DemandRPS
		}
		t.Logf("seed %d: demand %.0f rps, shed critical %.3f standard %.3f sheddable %.1f (today's plan sheds %.1f)", seed, total, crit, std, shed, todayShed)
		if all := crit + std + shed; all > 1.02*todayShed {
			t.Errorf("seed %d: sheds %v rps in all, today's plan %v: ordering the shed must not cost goodput", seed, all, todayShed)
		}
		if shed < 1 {
			t.Fatalf("seed %d: no shortfall at 1.4× demand: the test says nothing", seed)
		}
		if crit > 1e-6*total || std > 0.01*0.5*total {
			t.Errorf("seed %d: critical shed %v, standard shed %v rps while sheddable absorbs %v", seed, crit, std, shed)
		}
	}
}
