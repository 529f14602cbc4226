package xds

import "math"

// RetryBudgetCurve is how a cluster's retry budget tightens with load:
// "in normal time we can tolerate a lot more retries than when the system
// is heavily utilised". Below Knee utilisation the budget is Max percent
// of the cluster's active requests; from Knee to Saturation it falls along
// a smoothstep (3x² − 2x³, flat at both ends, so a utilisation that
// wobbles around either end barely moves it) to Min percent, where it
// stays. With Min at 1 %, Envoy's min_retry_concurrency (Config's
// RetryBudgetMinConcurrency, default 3) is what bounds retries near
// saturation until a cluster has hundreds of requests in flight.
//
// The defaults come from the headroom a retry may use: retries at b
// percent of the requests in flight add at most b percent to the load, so
// at utilisation u they keep it within capacity while u·(1 + b/100) ≤ 1,
// that is b ≤ 100·(1 − u)/u. The full budget Max fits up to
// u = 100/(100 + Max) (0.83 for 20 %): that is the knee; nothing is left
// at u = 1: that is where the minimum is reached, not before. For Max 20
// the smoothstep stays within 2.8 points of 100·(1 − u)/u between the two
// (13.3 % against 11.1 % at 0.9, 5.1 % against 5.3 % at 0.95); bench
// paper's retry_storm stage measures it.
//
// Envoy reads the result as circuit_breakers.thresholds.retry_budget
// (envoy/config/cluster/v3/circuit_breaker.proto, RetryBudget:
// budget_percent, min_retry_concurrency; source/common/upstream/
// resource_manager_impl.h RetryBudgetImpl: the retry limit is
// max(budget_percent × active requests, min_retry_concurrency)); isobar's
// gateway honours the same field.
type RetryBudgetCurve struct {
	// Max is the budget with headroom, in percent (default: Config's
	// RetryBudgetPercent, 20).
	Max float64
	// Min is the budget at and above Saturation, in percent (default 1).
	Min float64
	// Knee is the utilisation where the budget starts to fall (default
	// 100/(100+Max)); Saturation where it reaches Min (default 1).
	Knee, Saturation float64
}

// DefaultRetryBudgetCurve is the curve with its defaults and Max = max.
func DefaultRetryBudgetCurve(max float64) RetryBudgetCurve {
	return RetryBudgetCurve{Max: max, Min: 1, Knee: 100 / (100 + max), Saturation: 1}
}

// RetryBudgetAt is the curve's budget in percent at utilisation u (load
// over capacity; NaN or negative counts as 0, anything ≥ Saturation as
// saturated). A curve with Saturation ≤ Knee steps from Max to Min at
// Knee; Min above Max is clamped to Max.
func RetryBudgetAt(u float64, c RetryBudgetCurve) float64 {
	lo := min(c.Min, c.Max)
	switch {
	case !(u > c.Knee):
		return c.Max
	case u >= c.Saturation || c.Saturation <= c.Knee:
		return lo
	}
	x := (u - c.Knee) / (c.Saturation - c.Knee)
	s := x * x * (3 - 2*x)
	return math.Max(lo, c.Max-(c.Max-lo)*s)
}
