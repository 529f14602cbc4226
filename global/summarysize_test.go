package global

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/summary"
)

// geoFleet is n regions on a 10,000 × 5,000 km map (optimize's benchmark
// geography: RTT = 2 ms + 1 ms per 100 km), each region's Vivaldi
// coordinate computed by serf's coordinate.Client from simulated probes
// the way regional/gossip computes it from memberlist's (each probe: a
// random member, the RTT within ±5 % noise, the member's coordinate at
// that time).
type geoFleet struct {
	names    []string
	rtt      [][]float64 // the true RTTs, ms
	coords   []*coordinate.Coordinate
	capacity []float64
	demand   []float64
}

// probesPerRegion: how many probes each region makes before its
// coordinate goes into a summary (memberlist probes one member a second:
// a few minutes of gossip).
const probesPerRegion = 200

func newGeoFleet(t testing.TB, n int, seed uint64) geoFleet {
	return newGeoFleetProbes(t, n, seed, probesPerRegion)
}

// newGeoFleetProbes is newGeoFleet with probes per region.
func newGeoFleetProbes(t testing.TB, n int, seed uint64, probes int) geoFleet {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 26))
	type pt struct{ x, y float64 }
	pts := make([]pt, n)
	f := geoFleet{names: make([]string, n), rtt: make([][]float64, n), capacity: make([]float64, n), demand: make([]float64, n)}
	for i := range pts {
		pts[i] = pt{rng.Float64() * 10_000, rng.Float64() * 5_000}
		f.names[i] = fmt.Sprintf("r%04d", i)
		f.capacity[i] = 50 + rng.Float64()*450
		f.demand[i] = f.capacity[i] * (0.3 + 0.8*rng.Float64())
	}
	for i := range f.rtt {
		f.rtt[i] = make([]float64, n)
		for j := range f.rtt[i] {
			if i != j {
				f.rtt[i][j] = 2 + math.Hypot(pts[i].x-pts[j].x, pts[i].y-pts[j].y)/100
			}
		}
	}
	clients := make([]*coordinate.Client, n)
	for i := range clients {
		c, err := coordinate.NewClient(coordinate.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	for range probes {
		for i := range clients {
			j := rng.IntN(n)
			if j == i || n < 2 {
				continue
			}
			ms := f.rtt[i][j] * (0.95 + 0.1*rng.Float64())
			if _, err := clients[i].Update(f.names[j], clients[j].GetCoordinate(), time.Duration(ms*float64(time.Millisecond))); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.coords = make([]*coordinate.Coordinate, n)
	for i, c := range clients {
		f.coords[i] = c.GetCoordinate()
	}
	return f
}

// summaries are the fleet's summaries as summary.Aggregate builds them
// (10 Ready cells of one model per region, the measured RTT to every
// other region, the coordinate), listing nearest RTTs (0: the default,
// negative: every region, the pre-issue-26 summary).
func (f geoFleet) summaries(t testing.TB, nearest int) []*isobarpb.RegionSummary {
	return f.summariesOf(t, nearest, len(f.names))
}

// summariesOf is summaries for the first n regions only.
func (f geoFleet) summariesOf(t testing.TB, nearest, n int) []*isobarpb.RegionSummary {
	t.Helper()
	out := make([]*isobarpb.RegionSummary, n)
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for i, r := range f.names[:n] {
		rtt := make(map[string]time.Duration, len(f.names))
		for j, p := range f.names {
			if j != i {
				rtt[p] = time.Duration(f.rtt[i][j] * float64(time.Millisecond))
			}
		}
		cells := make([]summary.Cell, 10)
		for k := range cells {
			t0 := 0.3
			cells[k] = summary.Cell{Model: "m", State: isobarpb.LifecycleState_LIFECYCLE_STATE_READY, CapacityRPS: f.capacity[i] / 10,
				CapacityConfidence: 0.8, LoadRPS: f.demand[i] / 10, Pressure: 0.5, LowLoadTTFT: &t0}
		}
		s := summary.Aggregate(summary.Input{
			Region: r, Incarnation: "abcdef012345", Sequence: 1, Now: now, Cells: cells,
			Demand: map[string]float64{"m": f.demand[i]}, RTT: rtt, NearestRTT: nearest, Coordinate: f.coords[i],
			IngressAddress: fmt.Sprintf("10.%d.%d.1:10001", i/250, i%250), DefaultEngineLatencyMs: 300,
		})
		if err := summary.Validate(s); err != nil {
			t.Fatalf("built summary does not validate: %v", err)
		}
		out[i] = s
	}
	return out
}

func meanSize(sums []*isobarpb.RegionSummary) float64 {
	var total int
	for _, s := range sums {
		total += proto.Size(s)
	}
	return float64(total) / float64(len(sums))
}

// Summary bytes per region stay flat from 10 to 1,000 regions (within
// ±10 %), so the leader's inbound bytes grow linearly in regions; the
// pre-issue-26 summary (every RTT listed) grows with the regions. The
// sizes are the mean over (at most) the first 50 regions' summaries, each
// built with the RTT to every region of the fleet; the coordinates come
// from 20 probes per region (their placement does not change their
// size). The table is docs/issue26-summary.md's:
//
//	go test -count=1 -run TestSummaryBytesFlatInRegions -v ./global/
func TestSummaryBytesFlatInRegions(t *testing.T) {
	sizes := []int{10, 100, 1000}
	var base float64
	t.Logf("%8s %14s %16s %14s %16s", "regions", "B/region", "inbound B/s", "full B/region", "full inbound B/s")
	for k, n := range sizes {
		f := newGeoFleetProbes(t, n, 1, 20)
		reduced := meanSize(f.summariesOf(t, 0, min(n, 50)))
		full := meanSize(f.summariesOf(t, -1, min(n, 50)))
		t.Logf("%8d %14.0f %16.0f %14.0f %16.0f", n, reduced, reduced*float64(n), full, full*float64(n))
		if k == 0 {
			base = reduced
			continue
		}
		if math.Abs(reduced-base) > 0.1*base {
			t.Errorf("%d regions: %.0f B/region, %.0f at %d: not flat within 10 %%", n, reduced, base, sizes[0])
		}
		if full < 2*reduced {
			t.Errorf("%d regions: the full summary (%.0f B) is not larger than the reduced one (%.0f B): is the list still cut?", n, full, reduced)
		}
	}
}

// planOf runs one planning cycle of a fresh planner with cfg over sums,
// and returns the plan and, for model "m", the mean cost per request (ms)
// of the aggregate plan on the true RTT matrix (nil: the one it planned
// with).
func planOf(cfg PlanConfig, sums []*isobarpb.RegionSummary, truth [][]float64) (*isobarpb.RoutingPlan, float64) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	m := map[string]received{}
	live := make([]string, 0, len(sums))
	for _, s := range sums {
		m[s.GetRegion()] = received{s: s, at: now}
		live = append(live, s.GetRegion())
	}
	slices.Sort(live)
	pl := newPlanner(cfg)
	p, _ := pl.plan(now, m, time.Minute, time.Minute)
	if truth == nil {
		truth = rttMatrix(live, m)
	}
	return p, optimize.Cost(pl.problem("m", live, m, truth), pl.prev["m"].plan)
}

// routeTable is a plan as (ingress → destination → fraction), with the
// shed under destination "".
func routeTable(p *isobarpb.RoutingPlan) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, mp := range p.GetPlans() {
		row := map[string]float64{"": mp.GetShed()}
		for _, r := range mp.GetRoutes() {
			row[r.GetDestination()] = r.GetFraction()
		}
		out[mp.GetModel()+"/"+mp.GetIngressRegion()] = row
	}
	return out
}

// maxRouteDiff is the largest difference of one route's fraction (or
// shed) between two plans.
func maxRouteDiff(a, b *isobarpb.RoutingPlan) (float64, string) {
	ta, tb := routeTable(a), routeTable(b)
	worst, where := 0.0, ""
	for k, ra := range ta {
		for d, fa := range ra {
			if diff := math.Abs(fa - tb[k][d]); diff > worst {
				worst, where = diff, k+"→"+d
			}
		}
	}
	for k, rb := range tb {
		for d, fb := range rb {
			if diff := math.Abs(fb - ta[k][d]); diff > worst {
				worst, where = diff, k+"→"+d
			}
		}
	}
	return worst, where
}

// The worked example of docs/design.md §5.2 (optimize/testdata/
// worked-example.json; RTT A–B 20, B–C 30, A–C 60 ms) planned from
// reduced summaries: each region lists only its nearest peer, so A–C is
// measured by neither and comes from the coordinates. The leader's plan
// is the same as from full summaries, to the last bit: B's excess goes
// to A and C, whose own routing does not depend on A–C.
func TestWorkedExampleSamePlanFromReducedSummaries(t *testing.T) {
	f := geoFleet{
		names:    []string{"a", "b", "c"},
		rtt:      [][]float64{{0, 20, 60}, {20, 0, 30}, {60, 30, 0}},
		capacity: []float64{100, 100, 80},
		demand:   []float64{90, 120, 40},
	}
	f.coords = vivaldiFor(t, f.names, f.rtt)
	reduced := f.summaries(t, 1)
	if got := len(reduced[0].GetRtt()) + len(reduced[1].GetRtt()) + len(reduced[2].GetRtt()); got != 3 {
		t.Fatalf("reduced summaries list %d RTTs, want 3 (one each)", got)
	}
	src := [][]summary.RTTSource{make([]summary.RTTSource, 3), make([]summary.RTTSource, 3), make([]summary.RTTSource, 3)}
	mat := summary.RTTMatrix(f.names, reduced, src)
	if src[0][2] != summary.RTTEstimated || src[0][1] != summary.RTTMeasured || src[1][2] != summary.RTTMeasured {
		t.Fatalf("sources %v: want A–C estimated, A–B and B–C measured", src)
	}
	t.Logf("A–C: measured 60 ms, estimated %.1f ms from the coordinates", mat[0][2])
	cfg := DefaultConfig().Plan
	cfg.Headroom = 1 // the worked example's
	full, _ := planOf(cfg, f.summaries(t, -1), nil)
	red, _ := planOf(cfg, reduced, nil)
	if d, where := maxRouteDiff(full, red); d != 0 {
		t.Errorf("plans differ by %v at %s:\nfull    %v\nreduced %v", d, where, routeTable(full), routeTable(red))
	}
	rb := routeTable(red)["m/b"]
	t.Logf("b's plan from reduced summaries: %v", rb)
	if c, a := rb["c"]*120, rb["a"]*120; c < 15 || c > 25 || a <= 0 || a > 10 || rb[""] > 1e-9 {
		t.Errorf("b's plan %v: want about 19 rps to c and 5 to a (docs/design.md §5.2), no shed", rb)
	}
}

// vivaldiFor runs the probe simulation of newGeoFleet on given RTTs.
func vivaldiFor(t testing.TB, names []string, rtt [][]float64) []*coordinate.Coordinate {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 26))
	n := len(names)
	clients := make([]*coordinate.Client, n)
	for i := range clients {
		clients[i], _ = coordinate.NewClient(coordinate.DefaultConfig())
	}
	for range probesPerRegion {
		for i := range clients {
			j := (i + 1 + rng.IntN(n-1)) % n
			ms := rtt[i][j] * (0.95 + 0.1*rng.Float64())
			if _, err := clients[i].Update(names[j], clients[j].GetCoordinate(), time.Duration(ms*float64(time.Millisecond))); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := make([]*coordinate.Coordinate, n)
	for i, c := range clients {
		out[i] = c.GetCoordinate()
	}
	return out
}

// Random fleets (optimize's benchmark geography, demand 30–110 % of
// capacity) planned from reduced summaries and from full ones. Local-first
// spills a region's excess to its nearest regions with room, which its own
// list measures; the far pairs the coordinates estimate are rarely chosen.
// With the default 8 nearest the plans are the same up to 30 regions; from
// 100 on, a region that spills past its 8th neighbour may move a route
// between near-equal options (the estimate's error, 2 % median, is that
// of a probe's jitter): the plan's cost on the true RTTs stays within
// 0.5 %. With 16 nearest the plans are the same at 100 regions too.
// BenchmarkNearestFidelity measures k against fidelity at 100 and 300
// regions.
func TestRandomFleetsSamePlanFromReducedSummaries(t *testing.T) {
	cfg := DefaultConfig().Plan
	cases := []struct{ n, nearest, seeds int }{{10, 0, 3}, {30, 0, 3}, {100, 0, 3}, {100, 16, 3}}
	for _, tc := range cases {
		for seed := range uint64(tc.seeds) {
			t.Run(fmt.Sprintf("regions=%d/nearest=%d/seed=%d", tc.n, tc.nearest, seed), func(t *testing.T) {
				f := newGeoFleet(t, tc.n, seed+10)
				full, fullCost := planOf(cfg, f.summaries(t, -1), f.rtt)
				red, redCost := planOf(cfg, f.summaries(t, tc.nearest), f.rtt)
				d, where := maxRouteDiff(full, red)
				rel := (redCost - fullCost) / fullCost
				t.Logf("largest route difference %.2g at %s; cost on the true RTTs %.3f ms (full) vs %.3f ms (reduced), %+.4f %%", d, where, fullCost, redCost, 100*rel)
				if (tc.n <= 30 || tc.nearest == 16) && d > 1e-6 {
					t.Errorf("plans differ by %.3g at %s", d, where)
				}
				if math.Abs(rel) > 5e-3 {
					t.Errorf("the reduced summaries' plan costs %+.3f %% on the true RTTs", 100*rel)
				}
			})
		}
	}
}

// estimateError is the relative error of the coordinates' estimate over
// the pairs the reduced summaries do not measure: what the leader loses.
func estimateError(t testing.TB, f geoFleet) (median, p90 float64, estimated int) {
	sums := f.summaries(t, 0)
	n := len(f.names)
	src := make([][]summary.RTTSource, n)
	for i := range src {
		src[i] = make([]summary.RTTSource, n)
	}
	mat := summary.RTTMatrix(f.names, sums, src)
	var errs []float64
	for i := range n {
		for j := i + 1; j < n; j++ {
			if src[i][j] == summary.RTTEstimated {
				errs = append(errs, math.Abs(mat[i][j]-f.rtt[i][j])/f.rtt[i][j])
			}
		}
	}
	if len(errs) == 0 {
		return 0, 0, 0
	}
	slices.Sort(errs)
	return errs[len(errs)/2], errs[len(errs)*9/10], len(errs)
}

// What the leader loses: far pairs are estimated, not measured. The
// estimate stays within a bound good enough to rank far regions (median
// relative error under 25 %); the figures go to docs/issue26-summary.md.
func TestFarPairEstimateError(t *testing.T) {
	for _, n := range []int{30, 100} {
		f := newGeoFleet(t, n, 5)
		med, p90, k := estimateError(t, f)
		t.Logf("%d regions: %d estimated pairs, relative error median %.1f %%, P90 %.1f %%", n, k, 100*med, 100*p90)
		if k == 0 || med > 0.25 {
			t.Errorf("%d regions: median relative error %.2f over %d estimated pairs", n, med, k)
		}
	}
}

// BenchmarkPlanCycleReduced: one leader cycle over reduced summaries
// (16 nearest RTTs and a coordinate each, so the leader plans on a dense
// matrix, measured near and estimated far) at 10, 100 and 1,000 regions,
// beside the same fleet's full summaries:
//
//	go test -run '^$' -bench PlanCycleReduced -benchtime 10x ./global/
func BenchmarkPlanCycleReduced(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		f := newGeoFleet(b, n, 7)
		for _, full := range []bool{false, true} {
			nearest, name := 0, fmt.Sprintf("regions=%d/reduced", n)
			if full {
				nearest, name = -1, fmt.Sprintf("regions=%d/full", n)
			}
			sums := f.summaries(b, nearest)
			now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
			m := map[string]received{}
			for _, s := range sums {
				m[s.GetRegion()] = received{s: s, at: now}
			}
			b.Run(name, func(b *testing.B) {
				b.ReportMetric(meanSize(sums), "summary-B/region")
				for b.Loop() {
					newPlanner(DefaultConfig().Plan).plan(now, m, time.Minute, time.Minute)
				}
			})
		}
	}
}

// BenchmarkRTTMatrix1000: the leader's matrix from 1,000 reduced
// summaries, its share of a cycle.
func BenchmarkRTTMatrix1000(b *testing.B) {
	f := newGeoFleet(b, 1000, 7)
	sums := f.summaries(b, 0)
	for b.Loop() {
		summary.RTTMatrix(f.names, sums, nil)
	}
}

// BenchmarkSolve1000Reduced: the optimiser alone at 1,000 regions on the
// matrix the leader rebuilds from reduced summaries (measured near,
// estimated far) beside the true matrix: Solve, the latency optimum
// bench/scale times, and SolveLocalFirst, what the leader plans with.
//
//	go test -run '^$' -bench Solve1000Reduced -benchtime 10x ./global/
func BenchmarkSolve1000Reduced(b *testing.B) {
	f := newGeoFleet(b, 1000, 7)
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	m := map[string]received{}
	for _, s := range f.summaries(b, 0) {
		m[s.GetRegion()] = received{s: s, at: now}
	}
	pl := newPlanner(DefaultConfig().Plan)
	for _, tc := range []struct {
		name string
		rtt  [][]float64
	}{{"reduced", rttMatrix(f.names, m)}, {"true", f.rtt}} {
		prob := pl.problem("m", f.names, m, tc.rtt)
		b.Run("solve/"+tc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := optimize.Solve(prob); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("localfirst/"+tc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := optimize.SolveLocalFirst(prob, optimize.DefaultLocalFill); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNearestFidelity is the table of docs/issue26-summary.md: for
// each k nearest RTTs, the summary's size and, over five fleets each of
// 100 and 300 regions, how many plans differ from the full summaries'
// (a route fraction by more than 1e-6) and the worst relative cost of the
// reduced summaries' plan on the true RTTs. It times nothing:
//
//	go test -run '^$' -bench NearestFidelity -benchtime 1x -v ./global/
func BenchmarkNearestFidelity(b *testing.B) {
	cfg := DefaultConfig().Plan
	type fleet struct {
		f        geoFleet
		fullCost float64
		full     *isobarpb.RoutingPlan
	}
	var fleets []fleet
	for _, n := range []int{100, 300} {
		for seed := range uint64(5) {
			f := newGeoFleet(b, n, seed+10)
			p, c := planOf(cfg, f.summaries(b, -1), f.rtt)
			fleets = append(fleets, fleet{f, c, p})
		}
	}
	for _, k := range []int{8, 12, 16, 24} {
		b.Run(fmt.Sprintf("nearest=%d", k), func(b *testing.B) {
			differ, worst, size := 0, 0.0, 0.0
			for b.Loop() {
				differ, worst = 0, 0
				for _, fl := range fleets {
					red, cost := planOf(cfg, fl.f.summaries(b, k), fl.f.rtt)
					if d, _ := maxRouteDiff(fl.full, red); d > 1e-6 {
						differ++
					}
					worst = max(worst, (cost-fl.fullCost)/fl.fullCost)
				}
				size = meanSize(fleets[0].f.summaries(b, k))
			}
			b.ReportMetric(size, "B/region")
			b.ReportMetric(float64(differ), "plans-differ")
			b.ReportMetric(100*worst, "worst-cost-%")
		})
	}
}
