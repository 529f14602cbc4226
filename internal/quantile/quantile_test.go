package quantile

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestRank(t *testing.T) {
	for _, tc := range []struct {
		n    int
		q    float64
		want int
	}{
		{0, 0.5, 0}, {1, 0, 0}, {1, 0.99, 0}, {1, 1, 0},
		{10, 0, 0}, {10, 0.05, 0}, {10, 0.1, 0}, {10, 0.11, 1},
		{10, 0.5, 4}, {10, 0.95, 9}, {10, 0.99, 9}, {10, 1, 9}, {10, 2, 9}, {10, -1, 0},
		{100, 0.5, 49}, {100, 0.95, 94}, {100, 0.99, 98}, {101, 0.99, 99},
	} {
		if got := Rank(tc.n, tc.q); got != tc.want {
			t.Errorf("Rank(%d, %v) = %d, want %d", tc.n, tc.q, got, tc.want)
		}
	}
}

func TestSortedAndOf(t *testing.T) {
	if got := Sorted([]time.Duration(nil), 0.5); got != 0 {
		t.Errorf("empty: %v", got)
	}
	if got := Of([]float64(nil), 0.5); got != 0 {
		t.Errorf("empty: %v", got)
	}
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	orig := slices.Clone(ds)
	for q, want := range map[float64]time.Duration{0.5: 50 * time.Millisecond, 0.95: 95 * time.Millisecond, 0.99: 99 * time.Millisecond, 1: 100 * time.Millisecond, 0: time.Millisecond} {
		if got := Of(ds, q); got != want {
			t.Errorf("Of(q=%v) = %v, want %v", q, got, want)
		}
	}
	if !slices.Equal(ds, orig) {
		t.Error("Of modified its input")
	}
	fs := []float64{3, 1, 2}
	if got := Of(fs, 0.5); got != 2 {
		t.Errorf("median of 3 = %v", got)
	}
	if got := Sorted([]float64{1, 2, 3, 4}, 0.5); got != 2 {
		t.Errorf("median of 4 = %v, want the lower middle (nearest rank)", got)
	}
	if got := Of([]float64{math.NaN(), 1}, 1); got != 1 {
		t.Errorf("NaN sorts first: %v", got)
	}
}
