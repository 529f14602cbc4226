package lb

import (
	"fmt"
	"math"
	"testing"

	"pgregory.net/rapid"
)

// TestEDFFrequenciesConvergeToWeights: with constant active counts, a
// weighted balancer's pick counts track its effective weights w_i — static
// weights for round robin, weight/(active+1)^bias for least request — over
// any run length, whatever the seed (which starts the schedule mid-way).
//
// Bound: the N picks span some stretch T of schedule time, and host j's
// deadlines are 1/w_j apart, so it is picked T·w_j + e_j times with
// |e_j| ≤ 1. Then count_i - N·w_i/W = e_i(1 - w_i/W) - Σ_{j≠i} e_j·w_i/W,
// at most 1 + n·w_i/W in size for n hosts: a constant, so the frequency
// count_i/N converges to w_i/W.
func TestEDFFrequenciesConvergeToWeights(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 8).Draw(t, "hosts")
		weights := rapid.SliceOfN(rapid.Uint32Range(0, 50), n, n).Draw(t, "weights")
		active := Counts(rapid.SliceOfN(rapid.Uint64Range(0, 20), n, n).Draw(t, "active"))
		p := DefaultPolicy(RoundRobin)
		if rapid.Bool().Draw(t, "least_request") {
			p = DefaultPolicy(LeastRequest)
			p.ActiveRequestBias = rapid.SampledFrom([]float64{0, 0.5, 1, 2}).Draw(t, "bias")
		}
		seed := rapid.Uint64().Draw(t, "seed")
		total := rapid.IntRange(1, 3000).Draw(t, "picks")

		b, err := NewBalancer(p, seed)
		if err != nil {
			t.Fatal(err)
		}
		b.Update(weights, active)
		if !b.Weighted() {
			t.Skip("weights equal or fewer than two hosts: unweighted pick")
		}
		eff := make([]float64, n)
		var sum float64
		for h := range eff {
			if weights[h] > 0 {
				eff[h] = float64(weights[h])
				if p.Algorithm == LeastRequest {
					eff[h] /= math.Pow(float64(active[h]+1), p.ActiveRequestBias)
				}
			}
			sum += eff[h]
		}
		hosts := 0
		for _, w := range weights {
			if w > 0 {
				hosts++
			}
		}
		counts := make([]int, n)
		var r constRand
		for range total {
			h, ok := b.Pick(&r, active)
			if !ok {
				t.Fatal("Pick: ok=false")
			}
			counts[h]++
		}
		for h := range counts {
			want := float64(total) * eff[h] / sum
			tol := 1 + float64(hosts)*eff[h]/sum + 1e-9
			if d := math.Abs(float64(counts[h]) - want); d > tol {
				t.Fatalf("%v: host %d picked %d times in %d, want %.2f ± %.2f (effective weights %v, counts %v)",
					b, h, counts[h], total, want, tol, eff, counts)
			}
		}
	})
}

// constRand is a Rand for picks whose random values cannot matter.
type constRand struct{}

func (*constRand) Uint64() uint64 { return 0 }

// TestPickAllocations: a pick allocates nothing.
func TestPickAllocations(t *testing.T) {
	for _, name := range []string{"round_robin", "least_request", "least_request_full_scan"} {
		for _, weights := range [][]uint32{{1, 1, 1, 1}, {1, 2, 3, 4}} {
			t.Run(fmt.Sprint(name, weights), func(t *testing.T) {
				p, _ := ParsePolicy(name)
				b := mustBalancer(t, p, 7)
				// Converted to the interface once, as a caller would: a
				// slice-to-interface conversion allocates.
				var active Active = Counts{3, 1, 4, 1}
				b.Update(weights, active)
				var r constRand
				if a := testing.AllocsPerRun(100, func() { b.Pick(&r, active) }); a != 0 {
					t.Errorf("%v allocations per pick", a)
				}
			})
		}
	}
}
