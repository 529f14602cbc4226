package optimize

import (
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
