package scale

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/optimize"
)

// regionMap places n regions on a 2-D map (km) and gives the RTT between
// them as fibre would (2 ms plus 1 ms per 100 km), as the optimiser's own
// benchmarks do. Seeded: the same seed and n give the same map.
func regionMap(seed uint64, n int) [][]float64 {
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	type pt struct{ x, y float64 }
	pts := make([]pt, n)
	for i := range pts {
		pts[i] = pt{rng.Float64() * 10000, rng.Float64() * 5000}
	}
	rtt := make([][]float64, n)
	for i := range rtt {
		rtt[i] = make([]float64, n)
		for j := range rtt[i] {
			if i != j {
				rtt[i][j] = 2 + math.Hypot(pts[i].x-pts[j].x, pts[i].y-pts[j].y)/100
			}
		}
	}
	return rtt
}

// solveProblem is a realistic instance of n regions, generated as
// optimize's benchmarks generate theirs: capacities 50–500 rps,
// demand 30–110 % of capacity (some regions overloaded), engine latency
// 200–400 ms, RTT from regionMap.
func solveProblem(seed uint64, n int) optimize.Problem {
	rng := rand.New(rand.NewPCG(seed^0x5ca1e, uint64(n)))
	p := optimize.Problem{Regions: make([]optimize.Region, n), RTTms: regionMap(seed, n), Headroom: optimize.DefaultHeadroom}
	for i := range p.Regions {
		c := 50 + rng.Float64()*450
		p.Regions[i] = optimize.Region{Name: regionName(i), DemandRPS: c * (0.3 + rng.Float64()*0.8), CapacityRPS: c,
			EngineLatencyMs: 200 + rng.Float64()*200}
	}
	return p
}

// solveTimes solves the instance of n regions up to samples times within
// budget and returns each solve's duration in ms.
func solveTimes(ctx context.Context, seed uint64, n, samples int, budget time.Duration, clock clockwork.Clock) ([]float64, error) {
	p := solveProblem(seed, n)
	var out []float64
	start := clock.Now()
	for i := 0; i < samples && ctx.Err() == nil && (i == 0 || clock.Since(start) < budget); i++ {
		t0 := clock.Now()
		if _, err := optimize.Solve(p); err != nil {
			return out, fmt.Errorf("scale: solve %d regions: %w", n, err)
		}
		out = append(out, ms(clock.Since(t0)))
	}
	return out, nil
}

// regionName is the name of region i of a point ("r000" ...).
func regionName(i int) string { return fmt.Sprintf("r%03d", i) }
