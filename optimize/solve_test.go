package optimize

import (
	"math"
	"testing"
)

// tb is what the checks need from *testing.T and *rapid.T.
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// refEval evaluates a plan straight from the documented definitions,
// independently of the package's evaluation code: loads, cost per request
// (RTT plus engine latency, shed at the penalty) and the Frank-Wolfe
// duality gap per request, Σ_i d_i·(Σ_j f_ij·(rtt_ij + G'_j) + s_i·P −
// min(P, min_j rtt_ij + G'_j)) / Σ d.
func refEval(p Problem, pl Plan) (loads []float64, cost, gap float64) {
	q := p.withDefaults()
	n := len(q.Regions)
	loads = make([]float64, n)
	var total float64
	// The documented resolution: demand and capacity below MinValue are
	// 0, engine latency below it is MinValue.
	q.Regions = append([]Region(nil), q.Regions...)
	for i := range q.Regions {
		r := &q.Regions[i]
		if r.DemandRPS < MinValue {
			r.DemandRPS = 0
		}
		if r.CapacityRPS < MinValue {
			r.CapacityRPS = 0
		}
		r.EngineLatencyMs = math.Max(r.EngineLatencyMs, MinValue)
	}
	for i, r := range q.Regions {
		if r.Down {
			continue
		}
		total += r.DemandRPS
		for j, f := range pl.Fractions[i] {
			loads[j] += f * r.DemandRPS
		}
	}
	lat := make([]float64, n)
	marg := make([]float64, n)
	for j, r := range q.Regions {
		c := r.CapacityRPS * q.Headroom
		if r.Down || c == 0 {
			lat[j], marg[j] = math.Inf(1), math.Inf(1)
			continue
		}
		u := loads[j] / c
		lat[j] = refLatency(r.EngineLatencyMs, q.Beta, q.K, u)
		marg[j] = r.EngineLatencyMs * (1 + q.Beta*math.Pow(u, q.K)*((q.K+1)-q.K*u)/((1-u)*(1-u)))
	}
	if total == 0 {
		return loads, 0, 0
	}
	for i, r := range q.Regions {
		if r.Down || r.DemandRPS == 0 {
			continue
		}
		best := q.ShedPenaltyMs
		for j := range n {
			best = math.Min(best, q.RTTms[i][j]+marg[j])
		}
		used := pl.Shed[i] * q.ShedPenaltyMs
		cost += r.DemandRPS * pl.Shed[i] * q.ShedPenaltyMs
		for j, f := range pl.Fractions[i] {
			if f > 0 {
				cost += r.DemandRPS * f * (q.RTTms[i][j] + lat[j])
				used += f * (q.RTTms[i][j] + marg[j])
			}
		}
		gap += r.DemandRPS * (used - best)
	}
	return loads, cost / total, gap / total
}

// checkPlan asserts the invariants every plan from Solve must hold on p,
// and that its reported figures agree with refEval.
func checkPlan(t tb, p Problem, pl Plan) {
	t.Helper()
	q := p.withDefaults()
	n := len(q.Regions)
	if len(pl.Fractions) != n || len(pl.Shed) != n || len(pl.Load) != n {
		t.Fatalf("plan shape %d/%d/%d, want %d", len(pl.Fractions), len(pl.Shed), len(pl.Load), n)
	}
	var demand, served, shed float64
	for i, r := range q.Regions {
		row := pl.Fractions[i]
		if len(row) != n {
			t.Fatalf("row %d has %d entries", i, len(row))
		}
		sum := pl.Shed[i]
		if pl.Shed[i] < 0 || math.IsNaN(pl.Shed[i]) {
			t.Errorf("region %s: shed %v", r.Name, pl.Shed[i])
		}
		for j, f := range row {
			if f < 0 || math.IsNaN(f) {
				t.Errorf("fraction %s→%s = %v", r.Name, q.Regions[j].Name, f)
			}
			if _, c, _ := q.Regions[j].resolved(); f > 0 && (q.Regions[j].Down || c == 0 || math.IsInf(q.RTTms[i][j], 1)) {
				t.Errorf("routes %v of %s to %s, which cannot serve it", f, r.Name, q.Regions[j].Name)
			}
			sum += f
		}
		if r.Down {
			if sum != 0 {
				t.Errorf("down region %s has a row summing to %v, want 0", r.Name, sum)
			}
			continue
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("region %s: fractions + shed = %v, want 1", r.Name, sum)
		}
		d, _, _ := r.resolved()
		demand += d
		shed += pl.Shed[i] * d
	}
	loads, cost, gap := refEval(p, pl)
	for j, r := range q.Regions {
		served += pl.Load[j]
		if math.Abs(pl.Load[j]-loads[j]) > 1e-9*math.Max(1, loads[j]) {
			t.Errorf("region %s: Load %v, recomputed %v", r.Name, pl.Load[j], loads[j])
		}
		if limit := r.CapacityRPS * q.Headroom; pl.Load[j] > limit*(1+1e-12) {
			t.Errorf("region %s: load %v above capacity·headroom %v", r.Name, pl.Load[j], limit)
		}
	}
	if math.Abs(served+shed-demand) > 1e-9*math.Max(1, demand) {
		t.Errorf("demand not conserved: served %v + shed %v != demand %v", served, shed, demand)
	}
	if math.Abs(pl.CostMs-cost) > 1e-9*math.Max(1, cost) {
		t.Errorf("CostMs %v, recomputed %v", pl.CostMs, cost)
	}
	if math.Abs(pl.Gap-gap) > 1e-6*math.Max(1, cost) {
		t.Errorf("Gap %v, recomputed %v", pl.Gap, gap)
	}
	if local := LocalOnly(p); pl.CostMs > local.CostMs*(1+1e-9) {
		t.Errorf("cost %v above the local-only plan's %v", pl.CostMs, local.CostMs)
	}
}

func solve(t tb, p Problem) Plan {
	t.Helper()
	pl, err := Solve(p)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	checkPlan(t, p, pl)
	// Solve's promise: the duality gap bounds the distance to the
	// optimum. Where the gap stays loose (an option whose marginal latency
	// is flat at zero load, see Solve), no single shift of one source's
	// traffic may still pay off.
	if tol := p.withDefaults().Tolerance; pl.Gap > tol*pl.CostMs+1e-9 {
		if imp := bestShift(p, pl); imp > 1e-9 {
			t.Errorf("gap %v above tolerance %v × cost %v after %d iterations, and shifting one source's traffic saves %.3g of the cost",
				pl.Gap, tol, pl.CostMs, pl.Iterations, imp)
		}
	}
	return pl
}

// bestShift returns the largest relative saving any single move of one
// source's traffic from one option to another (served somewhere, or shed)
// achieves, each move found by a golden-section search. At the optimum of
// this convex problem it is 0.
func bestShift(p Problem, pl Plan) float64 {
	q := p.withDefaults()
	n := len(q.Regions)
	_, base, _ := refEval(p, pl)
	if base == 0 {
		return 0
	}
	best := 0.0
	for i, r := range q.Regions {
		d, _, _ := r.resolved()
		if r.Down || d == 0 {
			continue
		}
		for a := -1; a < n; a++ { // -1: shed
			share := pl.Shed[i]
			if a >= 0 {
				share = pl.Fractions[i][a]
			}
			if share <= 0 {
				continue
			}
			for k := -1; k < n; k++ {
				_, ck, _ := q.Regions[max(k, 0)].resolved()
				if k == a || (k >= 0 && (q.Regions[k].Down || ck == 0 || math.IsInf(q.RTTms[i][k], 1))) {
					continue
				}
				limit := share
				if k >= 0 {
					room := (ck*q.Headroom - pl.Load[k]) / d
					limit = math.Min(limit, room*(1-1e-9))
				}
				if limit <= 0 {
					continue
				}
				at := func(delta float64) float64 {
					moved := clonePlan(pl)
					if a >= 0 {
						moved.Fractions[i][a] -= delta
					} else {
						moved.Shed[i] -= delta
					}
					if k >= 0 {
						moved.Fractions[i][k] += delta
					} else {
						moved.Shed[i] += delta
					}
					_, c, _ := refEval(p, moved)
					return c
				}
				lo, hi := 0.0, limit
				const phi = 0.6180339887498949
				for range 80 {
					m1, m2 := hi-phi*(hi-lo), lo+phi*(hi-lo)
					if at(m1) < at(m2) {
						hi = m2
					} else {
						lo = m1
					}
				}
				if s := (base - at((lo+hi)/2)) / base; s > best {
					best = s
				}
			}
		}
	}
	return best
}

func moved(p Problem, pl Plan, from, to int) float64 {
	return pl.Fractions[from][to] * p.Regions[from].DemandRPS
}

// TestWorkedExample is docs/design.md §5.2: local-only overloads B; the plan
// moves B's excess to C because the RTT costs less than the queueing it
// saves.
func TestWorkedExample(t *testing.T) {
	t.Run("headroom 1", func(t *testing.T) {
		p := threeRegions(1)
		pl := solve(t, p)
		local := LocalOnly(p)
		toC, toA := moved(p, pl, 1, 2), moved(p, pl, 1, 0)
		t.Logf("B→C %.2f rps, B→A %.2f rps, A→B %.2f rps, loads %.2f, cost %.1f ms (local-only %.1f ms), %d iterations, gap %.2g ms",
			toC, toA, moved(p, pl, 0, 1), pl.Load, pl.CostMs, local.CostMs, pl.Iterations, pl.Gap)
		if toC < 20 || toC > 35 {
			t.Errorf("B→C = %.2f rps, want about 20–35 (B is 20 over capacity)", toC)
		}
		if pl.Load[1] > 100 {
			t.Errorf("B planned at %.2f rps, above its capacity 100", pl.Load[1])
		}
		for i, s := range pl.Shed {
			if s != 0 {
				t.Errorf("region %d sheds %v with demand 250 < capacity 280", i, s)
			}
		}
		if local.Shed[1] == 0 {
			t.Errorf("local-only plan does not shed at B (loads %v)", local.Load)
		}
		if !(pl.CostMs < local.CostMs/2) {
			t.Errorf("cost %v not well below local-only %v", pl.CostMs, local.CostMs)
		}
	})
	t.Run("headroom 0.9", func(t *testing.T) {
		p := threeRegions(0.9)
		pl := solve(t, p)
		var shed float64
		for i, r := range p.Regions {
			shed += pl.Shed[i] * r.DemandRPS
		}
		t.Logf("B→C %.2f rps, loads %.2f, shed %.2f rps, cost %.1f ms", moved(p, pl, 1, 2), pl.Load, shed, pl.CostMs)
		for j, limit := range []float64{90, 90, 72} {
			if pl.Load[j] > limit {
				t.Errorf("region %s planned at %.3f rps, above c·h = %v", p.Regions[j].Name, pl.Load[j], limit)
			}
		}
		if moved(p, pl, 1, 2) < 20 {
			t.Errorf("B→C = %.2f rps, want at least 20", moved(p, pl, 1, 2))
		}
	})
}

func TestLowLoad(t *testing.T) {
	t.Run("well below capacity stays local", func(t *testing.T) {
		p := threeRegions(0.9)
		p.Regions[0].DemandRPS, p.Regions[1].DemandRPS, p.Regions[2].DemandRPS = 30, 40, 25
		p.RTTms = [][]float64{{0, 30, 60}, {30, 0, 30}, {60, 30, 0}}
		pl := solve(t, p)
		for i := range p.Regions {
			if pl.Fractions[i][i] != 1 {
				t.Errorf("region %s keeps %v local, want 1 (row %v)", p.Regions[i].Name, pl.Fractions[i][i], pl.Fractions[i])
			}
		}
	})
	t.Run("A 50 B 60 C 40 moves only a trim", func(t *testing.T) {
		// B at 67 % of c·h has a marginal latency ~85 ms above C's,
		// more than the 30 ms RTT, so the optimum trims a little off B.
		p := threeRegions(0.9)
		p.Regions[0].DemandRPS, p.Regions[1].DemandRPS, p.Regions[2].DemandRPS = 50, 60, 40
		p.RTTms = [][]float64{{0, 30, 60}, {30, 0, 30}, {60, 30, 0}}
		pl := solve(t, p)
		t.Logf("rows %.4f, loads %.2f, cost %.2f ms vs local-only %.2f ms", pl.Fractions, pl.Load, pl.CostMs, LocalOnly(p).CostMs)
		for i := range p.Regions {
			if pl.Fractions[i][i] < 0.9 {
				t.Errorf("region %s keeps only %.3f local", p.Regions[i].Name, pl.Fractions[i][i])
			}
			if pl.Shed[i] != 0 {
				t.Errorf("region %s sheds at low load", p.Regions[i].Name)
			}
		}
	})
	t.Run("multi-second RTT keeps traffic local", func(t *testing.T) {
		p := threeRegions(0.9)
		p.Regions[0].DemandRPS, p.Regions[1].DemandRPS, p.Regions[2].DemandRPS = 50, 60, 40
		p.RTTms = [][]float64{{0, 3000, 5000}, {3000, 0, 4000}, {5000, 4000, 0}}
		pl := solve(t, p)
		for i := range p.Regions {
			if pl.Fractions[i][i] != 1 {
				t.Errorf("region %s row %v, want all local", p.Regions[i].Name, pl.Fractions[i])
			}
		}
	})
}

// TestLongRTTOverload: with RTTs of seconds, only what B cannot serve
// near its own capacity leaves B; A and C keep their own traffic.
func TestLongRTTOverload(t *testing.T) {
	p := threeRegions(0.9)
	p.RTTms = [][]float64{{0, 4000, 5000}, {4000, 0, 4000}, {5000, 4000, 0}}
	pl := solve(t, p)
	t.Logf("rows %.4f, shed %.4f, loads %.2f", pl.Fractions, pl.Shed, pl.Load)
	if pl.Fractions[0][0] < 1-pl.Shed[0]-1e-12 || pl.Fractions[2][2] < 1-pl.Shed[2]-1e-12 {
		t.Errorf("A or C sends traffic away: A %v, C %v", pl.Fractions[0], pl.Fractions[2])
	}
	if local := moved(p, pl, 1, 1); local < 0.9*90 {
		t.Errorf("B serves only %.2f rps locally, want ≥ 81 (90 %% of c·h) before paying seconds of RTT", local)
	}
	if away := 120 - moved(p, pl, 1, 1); away < 30 {
		t.Errorf("B keeps %.2f rps, more than c·h = 90", moved(p, pl, 1, 1))
	}
}

func TestOverloadSheds(t *testing.T) {
	p := threeRegions(0.9)
	p.Regions[0].DemandRPS, p.Regions[1].DemandRPS, p.Regions[2].DemandRPS = 150, 150, 100
	pl := solve(t, p)
	var shed float64
	for i, r := range p.Regions {
		shed += pl.Shed[i] * r.DemandRPS
		if pl.Shed[i] <= 0 {
			t.Errorf("region %s sheds nothing with demand 400 > capacity·headroom 252", r.Name)
		}
	}
	if shed < 400-252 {
		t.Errorf("sheds %.2f rps, want at least the 148 rps excess", shed)
	}
}

func TestDownAndUnreachable(t *testing.T) {
	t.Run("down region", func(t *testing.T) {
		p := threeRegions(0.9)
		p.Regions[1].Down = true
		pl := solve(t, p)
		for i := range p.Regions {
			if pl.Fractions[i][1] != 0 {
				t.Errorf("%s sends %v to down region b", p.Regions[i].Name, pl.Fractions[i][1])
			}
		}
		if pl.Load[1] != 0 {
			t.Errorf("down region b has load %v", pl.Load[1])
		}
	})
	t.Run("unreachable pair", func(t *testing.T) {
		p := threeRegions(0.9)
		// a wants to spill; b has room but cannot be reached, c has room.
		p.Regions[0].DemandRPS, p.Regions[1].DemandRPS, p.Regions[2].DemandRPS = 130, 50, 20
		p.RTTms[0][1], p.RTTms[1][0] = math.Inf(1), math.Inf(1)
		pl := solve(t, p)
		if pl.Fractions[0][1] != 0 || pl.Fractions[1][0] != 0 {
			t.Errorf("routes over the unreachable a–b pair: %v", pl.Fractions)
		}
		if pl.Fractions[0][2] == 0 {
			t.Errorf("a does not spill to c: %v", pl.Fractions[0])
		}
	})
	t.Run("zero capacity", func(t *testing.T) {
		p := threeRegions(0.9)
		p.Regions[2].CapacityRPS = 0
		pl := solve(t, p)
		if pl.Load[2] != 0 || pl.Fractions[2][2] != 0 {
			t.Errorf("zero-capacity region c serves %v", pl.Load[2])
		}
	})
	t.Run("isolated region without capacity sheds", func(t *testing.T) {
		p := threeRegions(0.9)
		p.Regions[2].CapacityRPS = 0
		p.RTTms[2][0], p.RTTms[0][2], p.RTTms[2][1], p.RTTms[1][2] = math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)
		pl := solve(t, p)
		if pl.Shed[2] != 1 {
			t.Errorf("c sheds %v, want 1", pl.Shed[2])
		}
	})
	t.Run("zero demand gets a row", func(t *testing.T) {
		p := threeRegions(0.9)
		p.Regions[2].DemandRPS = 0
		pl := solve(t, p)
		if pl.Fractions[2][2] != 1 {
			t.Errorf("idle region c's row %v, want local", pl.Fractions[2])
		}
	})
	t.Run("no demand anywhere", func(t *testing.T) {
		p := threeRegions(0.9)
		for i := range p.Regions {
			p.Regions[i].DemandRPS = 0
		}
		if pl := solve(t, p); pl.CostMs != 0 || pl.Gap != 0 {
			t.Errorf("cost %v gap %v, want 0", pl.CostMs, pl.Gap)
		}
	})
	t.Run("single region", func(t *testing.T) {
		p := Problem{Regions: []Region{{Name: "solo", DemandRPS: 120, CapacityRPS: 100, EngineLatencyMs: 250}}, RTTms: [][]float64{{0}}}
		pl := solve(t, p)
		if pl.Shed[0] <= 0 || pl.Load[0] > 90 {
			t.Errorf("solo: shed %v load %v", pl.Shed[0], pl.Load[0])
		}
	})
}

// TestRandomInstances solves the benchmark's realistic instances and checks
// every invariant and the optimality certificate.
func TestRandomInstances(t *testing.T) {
	for _, n := range []int{2, 5, 20, 120} {
		for seed := range uint64(3) {
			p := randomProblem(newRand(seed, uint64(n)), n)
			solve(t, p)
		}
	}
}

func TestCostOfOtherPlans(t *testing.T) {
	p := threeRegions(0.9)
	pl := solve(t, p)
	if c := Cost(p, pl); c != pl.CostMs {
		t.Errorf("Cost = %v, plan says %v", c, pl.CostMs)
	}
	for _, tc := range []struct {
		name string
		edit func(*Plan)
	}{
		{"row not summing to 1", func(q *Plan) { q.Fractions[0][0] -= 0.1 }},
		{"negative share", func(q *Plan) { q.Fractions[0][0], q.Fractions[0][1] = -0.2, q.Fractions[0][1]+1.2 }},
		{"NaN share", func(q *Plan) { q.Fractions[1][1] = math.NaN() }},
		{"overloads c", func(q *Plan) { q.Fractions[1] = []float64{0, 0, 1}; q.Shed[1] = 0 }},
		{"short plan", func(q *Plan) { q.Fractions = q.Fractions[:2] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := clonePlan(pl)
			tc.edit(&q)
			if c := Cost(p, q); !math.IsInf(c, 1) {
				t.Errorf("Cost = %v, want +Inf", c)
			}
		})
	}
	q := threeRegions(0.9)
	q.Regions[2].Down = true
	if c := Cost(q, pl); !math.IsInf(c, 1) {
		t.Errorf("Cost of a plan routing to a down region = %v, want +Inf", c)
	}
	if c := Cost(Problem{}, pl); !math.IsInf(c, 1) {
		t.Errorf("Cost on an invalid problem = %v, want +Inf", c)
	}
}

func TestLocalOnly(t *testing.T) {
	p := threeRegions(1)
	pl := LocalOnly(p)
	checkPlanShape(t, p, pl)
	if pl.Fractions[0][0] != 1 || pl.Fractions[2][2] != 1 {
		t.Errorf("A or C not fully local: %v", pl.Fractions)
	}
	if pl.Shed[1] <= 0 || pl.Load[1] >= 100 || pl.Load[1] < 90 {
		t.Errorf("B: shed %v load %v, want to serve just below capacity and shed the rest", pl.Shed[1], pl.Load[1])
	}
	if _, cost, _ := refEval(p, pl); math.Abs(cost-pl.CostMs) > 1e-9*cost {
		t.Errorf("local-only CostMs %v, recomputed %v", pl.CostMs, cost)
	}
	if c := LocalOnly(Problem{}).CostMs; !math.IsInf(c, 1) {
		t.Errorf("LocalOnly of an invalid problem costs %v, want +Inf", c)
	}
}

func checkPlanShape(t *testing.T, p Problem, pl Plan) {
	t.Helper()
	for i := range p.Regions {
		sum := pl.Shed[i]
		for _, f := range pl.Fractions[i] {
			sum += f
		}
		if math.Abs(sum-1) > 1e-12 {
			t.Errorf("row %d sums to %v", i, sum)
		}
	}
}
