package paper

import (
	"math"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/internal/quantile"
)

// Figures are one policy's results in one stage: snake_case names with
// their unit; nil (JSON null) where a figure does not apply to the policy.
type Figures map[string]*float64

func num(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func ms(d time.Duration) *float64 { return num(float64(d) / 1e6) }

// reqStats summarises a set of requests.
type reqStats struct {
	n, ok                             int
	ttft, e2e                         []time.Duration // of the successful ones, sorted
	success                           float64
	ttftP50, ttftP95, ttftP99, e2eP95 time.Duration // of the successful ones
}

// overAll is the nearest-rank q-quantile of sorted (the ok successful
// requests' figures) over all n requests, a failed request counting as
// later than any answer: a refusal is a miss, never a fast reply. ok is
// false when the quantile falls on a failed request.
func overAll(sorted []time.Duration, n int, q float64) (time.Duration, bool) {
	if n <= 0 {
		return 0, false
	}
	i := quantile.Rank(n, q)
	if i >= len(sorted) {
		return 0, false
	}
	return sorted[i], true
}

// meetsSLO reports whether the requests hold a TTFT SLO: success >= 0.95
// and the P95 TTFT over every request, failed ones counting as misses, at
// most slo. So at least 95 % of the requests were answered within it (the
// SLO attainment of DistServe): a policy cannot hold a rate by failing
// its costliest requests fast.
func (s reqStats) meetsSLO(slo time.Duration) bool {
	p95, ok := overAll(s.ttft, s.n, 0.95)
	return s.n > 0 && s.success >= 0.95 && ok && p95 <= slo
}

// summarise the requests keep selects.
func summarise(rs []request, keep func(*request) bool) reqStats {
	var s reqStats
	for i := range rs {
		r := &rs[i]
		if !keep(r) {
			continue
		}
		s.n++
		if r.status == statusOK && r.end > 0 {
			s.ok++
			s.ttft = append(s.ttft, r.ttft())
			s.e2e = append(s.e2e, r.end-r.arrive)
		}
	}
	slices.Sort(s.ttft)
	slices.Sort(s.e2e)
	if s.n > 0 {
		s.success = float64(s.ok) / float64(s.n)
	}
	s.ttftP50, s.ttftP95, s.ttftP99 = quantile.Sorted(s.ttft, 0.50), quantile.Sorted(s.ttft, 0.95), quantile.Sorted(s.ttft, 0.99)
	s.e2eP95 = quantile.Sorted(s.e2e, 0.95)
	return s
}

func arrivedIn(from, to time.Duration) func(*request) bool {
	return func(r *request) bool { return r.arrive >= from && r.arrive < to }
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
