package optimize

import (
	"math"
	"math/rand/v2"
)

// randomProblem builds a realistic instance: regions on a 2-D map (RTT from
// distance), capacities 50–500 rps, demand averaging 70 % of capacity with
// some regions overloaded, engine latency 200–400 ms.
func randomProblem(rng *rand.Rand, n int) Problem {
	type pt struct{ x, y float64 }
	pts := make([]pt, n)
	p := Problem{Regions: make([]Region, n), RTTms: make([][]float64, n), Headroom: 0.9}
	for i := range n {
		pts[i] = pt{rng.Float64() * 10000, rng.Float64() * 5000} // km
		c := 50 + rng.Float64()*450
		load := 0.3 + rng.Float64()*0.8 // mean 0.7, up to 1.1
		p.Regions[i] = Region{
			Name:            regionName(i),
			DemandRPS:       c * load,
			CapacityRPS:     c,
			EngineLatencyMs: 200 + rng.Float64()*200,
		}
	}
	for i := range n {
		p.RTTms[i] = make([]float64, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			d := math.Hypot(pts[i].x-pts[j].x, pts[i].y-pts[j].y)
			rtt := 2 + d/100 // ~fibre: 100 km per ms of round trip
			p.RTTms[i][j], p.RTTms[j][i] = rtt, rtt
		}
	}
	return p
}

func regionName(i int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	s := ""
	for {
		s = string(letters[i%26]) + s
		i = i/26 - 1
		if i < 0 {
			return "r-" + s
		}
	}
}

func newRand(a, b uint64) *rand.Rand { return rand.New(rand.NewPCG(a, b)) }
