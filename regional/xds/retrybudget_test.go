package xds

import (
	"math"
	"testing"
)

// TestRetryBudgetCurve: full budget with headroom, the minimum at
// saturation, monotone and continuous between, NaN and negatives as idle.
func TestRetryBudgetCurve(t *testing.T) {
	c := DefaultRetryBudgetCurve(20)
	for u, want := range map[float64]float64{0: 20, 0.5: 20, 0.95: 1, 1: 1, 3: 1, -1: 20, math.NaN(): 20, 0.725: 10.5} {
		if got := RetryBudgetAt(u, c); math.Abs(got-want) > 1e-9 {
			t.Errorf("RetryBudgetAt(%v) = %v, want %v", u, got, want)
		}
	}
	prev := math.Inf(1)
	for i := 0; i <= 1000; i++ {
		u := float64(i) / 1000
		b := RetryBudgetAt(u, c)
		if b > prev+1e-12 {
			t.Fatalf("budget rises from %v to %v at utilisation %v", prev, b, u)
		}
		if prev != math.Inf(1) && prev-b > 0.07 { // smooth: the steepest slope, 1.5·19/0.45 per unit, is 0.064 per 1/1000
			t.Fatalf("budget steps from %v to %v at utilisation %v", prev, b, u)
		}
		prev = b
	}
	if got := RetryBudgetAt(0.7, RetryBudgetCurve{Max: 20, Min: 30, Knee: 0.6, Saturation: 0.6}); got != 20 {
		t.Errorf("degenerate curve: %v, want Min clamped to Max (20)", got)
	}
}
