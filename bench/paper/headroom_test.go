package paper

import (
	"fmt"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/sim"
)

// BenchmarkLabHeadroom measures, in virtual time, how much any load
// balancer can win on TTFT P95 at the live lab's steady operating point:
// one region of the lab (3 cells of the fitted 70b-awq profile, the lab's
// default engine) under baseline_mixed at 3.2 RPS, 80 % of the fleet's
// capacity, over 8 seeds with the same per-request draws for every policy.
// It reports each policy's TTFT P95, averaged over the seeds, as
// <policy>_p95_ms; the oracle (the true state of every engine) is the
// limit. docs/bench.md ("Live") gives the figures:
//
//	go test ./bench/paper -run '^$' -bench LabHeadroom -benchtime 1x
func BenchmarkLabHeadroom(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Profile = sim.Profile70B()
	cells := make([]cellSpec, 3)
	for i := range cells {
		cells[i] = cellSpec{site: 0, profile: sim.Profile70B()}
	}
	const seeds, rps = 8, 3.2
	const warm, dur = 10 * time.Second, 120 * time.Second
	pols := []Policy{Isobar, RR, LR, Oracle}
	for range b.N {
		sum := map[Policy]time.Duration{}
		for s := uint64(1); s <= seeds; s++ {
			w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: rps, duration: warm + dur, seed: s}
			reqs := w.generate(cfg.Profile)
			for _, p := range pols {
				f, err := newFleet(cfg, runSpec{policy: p, requests: reqs, until: w.duration + drain, seed: s, cells: cells})
				if err != nil {
					b.Fatal(err)
				}
				res, err := f.run()
				if err != nil {
					b.Fatal(err)
				}
				st := summarise(res.requests, arrivedIn(warm, warm+dur))
				if st.n == 0 {
					b.Fatalf("seed %d %s: no request measured", s, p)
				}
				sum[p] += st.ttftP95
			}
		}
		for _, p := range pols {
			b.ReportMetric(float64(sum[p]/seeds)/1e6, fmt.Sprintf("%s_p95_ms", p))
		}
	}
}
