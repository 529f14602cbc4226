package xds

import (
	"math"
	"testing"
)

// TestRetryBudgetCurve: full budget while retries fit in the headroom
// (u ≤ 100/(100+max)), the minimum only at full utilisation, monotone and
// continuous between and within 3 points of the headroom 100·(1 − u)/u,
// NaN and negatives as idle.
func TestRetryBudgetCurve(t *testing.T) {
	c := DefaultRetryBudgetCurve(20)
	mid := (100.0/120 + 1) / 2 // halfway from the knee (0.833) to saturation: half the fall
	for u, want := range map[float64]float64{0: 20, 0.5: 20, 100.0 / 120: 20, 1: 1, 3: 1, -1: 20, math.NaN(): 20, mid: 10.5} {
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
		if prev != math.Inf(1) && prev-b > 0.18 { // smooth: the steepest slope, 1.5·19/(1/6) per unit, is 0.171 per 1/1000
			t.Fatalf("budget steps from %v to %v at utilisation %v", prev, b, u)
		}
		prev = b
	}
	for _, max := range []float64{10, 20} {
		c := DefaultRetryBudgetCurve(max)
		if got := RetryBudgetAt(0.999, c); got <= c.Min {
			t.Errorf("max %v: minimum reached before full utilisation (%v at 0.999)", max, got)
		}
		for u := c.Knee; u <= 1; u += 0.01 {
			head := 100 * (1 - u) / u
			if got := RetryBudgetAt(u, c); math.Abs(got-math.Max(head, c.Min)) > 3 {
				t.Errorf("max %v: budget %.2f at u %.2f, headroom %.2f", max, got, u, head)
			}
		}
	}
	if got := RetryBudgetAt(0.7, RetryBudgetCurve{Max: 20, Min: 30, Knee: 0.6, Saturation: 0.6}); got != 20 {
		t.Errorf("degenerate curve: %v, want Min clamped to Max (20)", got)
	}
}
