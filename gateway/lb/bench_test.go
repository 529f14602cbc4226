package lb

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkPick measures one Balancer.Pick for each mode (unweighted round
// robin, EDF round robin, N_CHOICES, FULL_SCAN, least-request EDF) and host
// count, with a PCG random source and counts behind the Active interface.
func BenchmarkPick(b *testing.B) {
	modes := []struct {
		name     string
		policy   string
		weighted bool
	}{
		{"round_robin", "round_robin", false},
		{"round_robin_edf", "round_robin", true},
		{"least_request_p2c", "least_request", false},
		{"least_request_full_scan", "least_request_full_scan", false},
		{"least_request_edf", "least_request", true},
	}
	for _, m := range modes {
		for _, n := range []int{8, 64, 512} {
			b.Run(fmt.Sprintf("%s/hosts=%d", m.name, n), func(b *testing.B) {
				p, err := ParsePolicy(m.policy)
				if err != nil {
					b.Fatal(err)
				}
				bal := mustBalancer(b, p, 42)
				r := rand.New(rand.NewPCG(1, 2))
				weights := make([]uint32, n)
				counts := make(Counts, n)
				for i := range weights {
					weights[i] = 1
					if m.weighted {
						weights[i] = uint32(1 + i%7)
					}
					counts[i] = uint64(r.IntN(8))
				}
				var active Active = counts
				bal.Update(weights, active)
				b.ReportAllocs()
				for b.Loop() {
					h, _ := bal.Pick(r, active)
					counts[h] ^= 1 // keep counts moving without growing
				}
			})
		}
	}
}

// BenchmarkUpdate measures a refresh that builds an EDF schedule with
// pre-picks, as Envoy does on every host-set change.
func BenchmarkUpdate(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			bal := mustBalancer(b, DefaultPolicy(LeastRequest), 0xfeedface)
			weights := make([]uint32, n)
			for i := range weights {
				weights[i] = uint32(1 + i%7)
			}
			var active Active = make(Counts, n)
			b.ReportAllocs()
			for b.Loop() {
				bal.Update(weights, active)
			}
		})
	}
}
