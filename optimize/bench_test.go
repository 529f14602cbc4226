package optimize

import (
	"math"
	"slices"
	"strconv"
	"testing"
)

// BenchmarkSolve solves random realistic instances (see randomProblem) of
// 10, 100 and 1,000 regions, cycling over five seeds, and reports the
// rounds and the worst relative duality gap.
func BenchmarkSolve(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var ps []Problem
			for seed := range uint64(5) {
				ps = append(ps, randomProblem(newRand(seed, uint64(n)), n))
			}
			var worst float64
			rounds := 0
			k := 0
			for b.Loop() {
				pl, err := Solve(ps[k%len(ps)])
				if err != nil {
					b.Fatal(err)
				}
				worst = max(worst, pl.Gap/pl.CostMs)
				rounds += pl.Iterations
				k++
			}
			b.ReportMetric(float64(rounds)/float64(k), "rounds/op")
			b.ReportMetric(worst, "max-relgap")
		})
	}
}

// BenchmarkDamp damps the previous cycle's plan toward a new optimum on
// 100 and 1,000 regions.
func BenchmarkDamp(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			p := randomProblem(newRand(1, uint64(n)), n)
			prev := LocalOnly(p)
			target, err := Solve(p)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				Damp(p, prev, target, 0.3)
			}
		})
	}
}

// BenchmarkSolveSlices plans random instances (see randomProblem) whose
// demand is split 20/50/30 % critical/standard/sheddable, with a fifth of
// the regions also sending a slice pinned to themselves and their two
// index neighbours, at 1.3× the demand of BenchmarkSolve (a shortfall).
func BenchmarkSolveSlices(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			p := randomProblem(newRand(1, uint64(n)), n)
			var sl []Slice
			for i, r := range p.Regions {
				d := 1.3 * r.DemandRPS
				sl = append(sl, Slice{Source: i, Band: 0, RPS: 0.2 * d}, Slice{Source: i, Band: 1, RPS: 0.5 * d}, Slice{Source: i, Band: 2, RPS: 0.3 * d})
				if i%5 == 0 {
					sl = append(sl, Slice{Source: i, Band: 1, RPS: 0.1 * d, Allowed: []int{i, (i + 1) % n, (i + n - 1) % n}})
				}
			}
			for b.Loop() {
				if _, err := SolveSlices(p, sl, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSolveSlicesSparse is BenchmarkSolveSlices' 1,000 regions with
// each region reaching only its 8 nearest (the global controller's RTTs
// come from each region's nearest peers), at 1.5× the demand: every
// source's reachable set differs, so admission has a group per source
// and band, and a shortfall to share.
func BenchmarkSolveSlicesSparse(b *testing.B) {
	n := 1000
	p := randomProblem(newRand(2, uint64(n)), n)
	cuts := make([]float64, n)
	for i := range n {
		cuts[i] = sortedCut(p.RTTms[i])
	}
	for i := range n {
		for j := range n {
			if p.RTTms[i][j] > cuts[i] && p.RTTms[i][j] > cuts[j] {
				p.RTTms[i][j] = math.Inf(1)
			}
		}
	}
	for i := range n {
		for j := range n {
			if math.IsInf(p.RTTms[i][j], 1) || math.IsInf(p.RTTms[j][i], 1) {
				p.RTTms[i][j], p.RTTms[j][i] = math.Inf(1), math.Inf(1)
			}
		}
	}
	var sl []Slice
	for i, r := range p.Regions {
		d := 1.5 * r.DemandRPS
		sl = append(sl, Slice{Source: i, Band: 0, RPS: 0.2 * d}, Slice{Source: i, Band: 1, RPS: 0.5 * d}, Slice{Source: i, Band: 2, RPS: 0.3 * d})
	}
	for b.Loop() {
		if _, err := SolveSlices(p, sl, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func sortedCut(row []float64) float64 {
	r := slices.Clone(row)
	slices.Sort(r)
	return r[min(8, len(r)-1)]
}
