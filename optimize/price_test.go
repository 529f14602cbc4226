package optimize

import (
	"math"
	"reflect"
	"runtime"
	"testing"
)

// TestPricerExact checks the clustered pricing against the full scan on
// large instances, with marginal latencies that tie, that are infinite,
// and with unusable and unreachable regions, as Solve meets them.
func TestPricerExact(t *testing.T) {
	for seed := range uint64(4) {
		rng := newRand(seed, 77)
		n := pricerFrom + int(rng.IntN(200))
		p := randomProblem(rng, n)
		for range 10 {
			j := rng.IntN(n)
			if rng.IntN(2) == 0 {
				p.Regions[j].Down = true
			} else {
				p.Regions[j].CapacityRPS = 0
			}
		}
		for range 20 {
			i, j := rng.IntN(n), rng.IntN(n)
			if i != j {
				p.RTTms[i][j], p.RTTms[j][i] = math.Inf(1), math.Inf(1)
			}
		}
		if seed%2 == 1 { // coarse RTTs, so that costs tie
			for i := range n {
				for j := range n {
					p.RTTms[i][j] = math.Round(p.RTTms[i][j] / 8)
				}
			}
		}
		m := compile(p.withDefaults())
		pr := newPricer(&m)
		mu := make([]float64, n)
		for round := range 20 {
			for j := range n {
				switch {
				case !m.srv[j].usable:
					mu[j] = math.Inf(1)
				case round%4 == 1:
					mu[j] = 300 // every destination ties on mu
				case rng.IntN(50) == 0:
					mu[j] = math.Inf(1)
				default:
					// Coarse values, so that costs tie.
					mu[j] = float64(200 + rng.IntN(8)*round)
				}
			}
			if round == 7 {
				for j := range mu {
					mu[j] = m.P // nothing beats shedding
				}
			}
			pr.load(mu)
			for i := range n {
				wb, wa := m.cheapest(i, mu)
				gb, ga := pr.cheapest(i, m.P)
				if gb != wb || ga != wa {
					t.Fatalf("seed %d round %d source %d: pricer (%v, %d), full scan (%v, %d)", seed, round, i, gb, ga, wb, wa)
				}
			}
		}
	}
}

// TestClusteredSolveExact solves large instances (with down, empty and
// unreachable regions, overload and other knees too) with the clustered
// pricing, on one and on two
// goroutines, and with full scans: the pricing is exact, so the solver
// takes the same steps and the plans must be identical, bit for bit.
func TestClusteredSolveExact(t *testing.T) {
	for _, n := range []int{pricerFrom, parallelPricing + 44} {
		for seed := range uint64(4) {
			rng := newRand(seed, uint64(n))
			p := randomProblem(rng, n)
			switch seed {
			case 2: // overloaded, so that regions shed; a sharp knee
				p.K = 17
				for i := range p.Regions {
					p.Regions[i].DemandRPS *= 1.6
				}
			case 3: // a linear knee, lighter load
				p.K, p.Beta = 1, 0.5
				for i := range p.Regions {
					p.Regions[i].DemandRPS *= 0.5
				}
			}
			if seed == 1 {
				for range n / 20 {
					j := rng.IntN(n)
					if rng.IntN(2) == 0 {
						p.Regions[j].Down = true
					} else {
						p.Regions[j].CapacityRPS = 0
					}
				}
				for range n {
					i, j := rng.IntN(n), rng.IntN(n)
					if i != j {
						p.RTTms[i][j], p.RTTms[j][i] = math.Inf(1), math.Inf(1)
					}
				}
			}
			q := p.withDefaults()
			full := solveModel(q, false)
			prev := runtime.GOMAXPROCS(1)
			one := solveModel(q, true)
			runtime.GOMAXPROCS(prev)
			pl, err := Solve(p)
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, p, pl)
			for name, other := range map[string]Plan{"full scan": full, "one goroutine": one} {
				if !reflect.DeepEqual(pl, other) {
					t.Errorf("n=%d seed %d: the plan differs from the %s plan (cost %v vs %v, %d vs %d rounds)",
						n, seed, name, pl.CostMs, other.CostMs, pl.Iterations, other.Iterations)
				}
			}
			if pl.Gap > q.Tolerance*pl.CostMs {
				t.Errorf("n=%d seed %d: gap %v above tolerance × cost %v", n, seed, pl.Gap, q.Tolerance*pl.CostMs)
			}
		}
	}
}
