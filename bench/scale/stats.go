package scale

import (
	"math"
	"time"

	"github.com/isobar-mesh/isobar/internal/quantile"
)

// quantileNaN is the nearest-rank q-quantile of xs; NaN when empty (the
// report's "not measured").
func quantileNaN(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return quantile.Of(xs, q)
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ptr(v float64) *float64 { return &v }
