// Package quantile owns the one nearest-rank quantile the repository
// reports latencies and other figures with: the simulator, the lab, the
// chaos drills, the load generator, the paper and scale benches and the
// regional summary all read their percentiles here, so a P99 means the same
// everywhere.
//
// Nearest rank: the q-quantile of n ascending values is the value at
// 1-based rank ⌈q·n⌉, clamped to [1, n]. It is always one of the values
// (never an interpolation), q = 0 gives the smallest and q = 1 the largest.
//
// Concurrency: pure functions, no package state. Sorted and Rank only read
// their arguments; Of sorts a copy, so its input is never modified. Any
// function may be called from any number of goroutines at once.
package quantile

import (
	"cmp"
	"math"
	"slices"
)

// Rank returns the 0-based index of the nearest-rank q-quantile among n
// ascending values: ⌈q·n⌉ − 1 clamped to [0, n−1]. It returns 0 for n <= 0
// (there is no such index; callers check n first).
func Rank(n int, q float64) int {
	if n <= 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(n))) - 1
	return max(0, min(i, n-1))
}

// Sorted returns the nearest-rank q-quantile of sorted, which must be in
// ascending order; the zero value when it is empty.
func Sorted[T cmp.Ordered](sorted []T, q float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	return sorted[Rank(len(sorted), q)]
}

// Of returns the nearest-rank q-quantile of xs, in any order; the zero
// value when it is empty. It sorts a copy: to read several quantiles of
// one sample, sort it once and use Sorted.
func Of[T cmp.Ordered](xs []T, q float64) T {
	if len(xs) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Sorted(s, q)
}
