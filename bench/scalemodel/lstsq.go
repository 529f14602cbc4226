package scalemodel

import (
	"errors"
	"math"
)

// errSingular: the columns of a least-squares problem are not independent
// (too few distinct points for the form).
var errSingular = errors.New("scalemodel: too few distinct points to fit")

// lstsq solves min Σ wᵢ(yᵢ − xᵢ·β)² by the normal equations (at most a
// few columns, so their conditioning is not a concern here) and returns β
// and the weighted residual sum of squares. w nil weighs every row 1.
func lstsq(x [][]float64, y, w []float64) ([]float64, float64, error) {
	if len(x) == 0 || len(x) != len(y) {
		return nil, 0, errSingular
	}
	k := len(x[0])
	a := make([][]float64, k)
	for i := range a {
		a[i] = make([]float64, k+1)
	}
	for r, row := range x {
		wr := 1.0
		if w != nil {
			wr = w[r]
		}
		for i := 0; i < k; i++ {
			for j := 0; j < k; j++ {
				a[i][j] += wr * row[i] * row[j]
			}
			a[i][k] += wr * row[i] * y[r]
		}
	}
	beta, err := gauss(a)
	if err != nil {
		return nil, 0, err
	}
	rss := 0.0
	for r, row := range x {
		e := y[r]
		for i := range row {
			e -= row[i] * beta[i]
		}
		wr := 1.0
		if w != nil {
			wr = w[r]
		}
		rss += wr * e * e
	}
	return beta, rss, nil
}

// gauss solves the augmented system a (k rows of k+1) with partial
// pivoting.
func gauss(a [][]float64) ([]float64, error) {
	k := len(a)
	for c := 0; c < k; c++ {
		p := c
		for r := c + 1; r < k; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12*(1+math.Abs(a[c][k])) {
			return nil, errSingular
		}
		a[c], a[p] = a[p], a[c]
		for r := c + 1; r < k; r++ {
			f := a[r][c] / a[c][c]
			for j := c; j <= k; j++ {
				a[r][j] -= f * a[c][j]
			}
		}
	}
	beta := make([]float64, k)
	for c := k - 1; c >= 0; c-- {
		s := a[c][k]
		for j := c + 1; j < k; j++ {
			s -= a[c][j] * beta[j]
		}
		beta[c] = s / a[c][c]
	}
	return beta, nil
}

// nnlsSubsets fits y on every non-empty subset of x's columns and keeps
// the subset of least residual whose coefficients are all ≥ 0 (the
// others are 0): a non-negative least squares exact for the few columns
// used here. It errs when no subset fits.
func nnlsSubsets(x [][]float64, y []float64) ([]float64, error) {
	k := len(x[0])
	var best []float64
	bestRSS := math.Inf(1)
	for mask := 1; mask < 1<<k; mask++ {
		var cols []int
		for c := 0; c < k; c++ {
			if mask&(1<<c) != 0 {
				cols = append(cols, c)
			}
		}
		sub := make([][]float64, len(x))
		for r, row := range x {
			for _, c := range cols {
				sub[r] = append(sub[r], row[c])
			}
		}
		b, rss, err := lstsq(sub, y, nil)
		if err != nil || rss >= bestRSS || anyNegative(b) {
			continue
		}
		best, bestRSS = make([]float64, k), rss
		for i, c := range cols {
			best[c] = b[i]
		}
	}
	if best == nil {
		return nil, errSingular
	}
	return best, nil
}

func anyNegative(b []float64) bool {
	for _, v := range b {
		if v < 0 {
			return true
		}
	}
	return false
}
