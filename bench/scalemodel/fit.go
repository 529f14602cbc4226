package scalemodel

import (
	"fmt"
	"math"
	"slices"

	"github.com/isobar-mesh/isobar/bench/scale"
)

// FitOptions choose the points Fit uses.
type FitOptions struct {
	// MaxCells: fit only on points of at most this many cells (0: all).
	// A hold-out check fits on the smaller points and predicts the
	// largest.
	MaxCells int
	// NearestRTT is how many peers' RTTs the run's summaries carried (0:
	// every peer, the summaries before issue 26 item 4).
	NearestRTT int
	// CPUExp > 0 fixes the ingest CPU's exponent (1: linear in the
	// heartbeats) instead of fitting it.
	CPUExp float64
}

// minIngestFraction: a point whose controllers accepted less than this of
// the offered heartbeats was saturated; its CPU is the machine's limit,
// not the work's demand, so no cost is fitted on it.
const minIngestFraction = 0.95

// fitPoint is one measured point Fit may use.
type fitPoint struct {
	cells, controllers int
	n                  float64 // cells per controller
	topology           string
	f                  *scale.Figures
}

// machineBusy: a point whose controllers and senders together used this
// share of the machine's CPUs or more saturated the machine; its CPU and
// wall times measure the machine's limit and its queues, not the work.
const machineBusy = 0.9

// saturated says whether a point's figures measure the machine's limit:
// under minIngestFraction of the offered heartbeats accepted, cells not
// Ready after the window, or the machine's CPUs machineBusy used.
func saturated(f *scale.Figures, numCPU int) bool {
	used := f.CPUSPerS
	if f.SenderCPUSPerS != nil {
		used += *f.SenderCPUSPerS
	}
	return f.IngestFraction < minIngestFraction || f.NotReadyAfterWindow > 0 ||
		numCPU > 0 && used >= machineBusy*float64(numCPU)
}

// usablePoints are the report's points with window figures that did not
// saturate, of at most opt.MaxCells cells.
func usablePoints(rep *scale.Report, opt FitOptions) []fitPoint {
	var out []fitPoint
	for _, p := range rep.Points {
		f := p.Figures
		if p.Skipped != "" || f == nil || f.OfferedHeartbeatsPerS <= 0 || saturated(f, rep.Machine.NumCPU) {
			continue
		}
		if opt.MaxCells > 0 && p.Cells > opt.MaxCells {
			continue
		}
		ctrls := p.Regions
		if p.Topology == scale.Flat {
			ctrls = 1
		}
		out = append(out, fitPoint{cells: p.Cells, controllers: ctrls, n: float64(p.CellsPerController), topology: p.Topology, f: f})
	}
	return out
}

// Fit fits the model's per-operation costs on a bench scale report. The
// rules, one per constant:
//
//   - FullCycle, FullCycleCPU, LiveCycle, LiveBuild: weighted least
//     squares of the measured cost (cycle_p50_ms; cycle_cpu_p50_ms, left
//     zero when no point has it; live_projection_mean_ms;
//     live_xds_build_mean_ms) on the cells per controller, weights 1/y²
//     (relative error, so the 1,000-fold range is not decided by its
//     largest point alone), for both a + b·n and a + b·n·log₂n; the form
//     of smaller weighted residual is kept. The cycle's steps are loops
//     over the cells (score, map, project, build) and a sort of the
//     endpoints, so either could hold; the data decide, and the form kept
//     is written beside the constants.
//   - CycleSpread: the median over points of ≥ 100 cells per controller
//     of ln(cycle_p99/cycle_p50)/2.326 (a lognormal's P99/P50), of the
//     cycles' CPU times where every point has them.
//   - PushesPerControllerPerS: the median over points of
//     live_pushes_per_s / controllers.
//   - HeartbeatCPUUs, HeartbeatCPUExp, ControllerCPUMsPerS,
//     ProcessCPUMsPerS: for each α on a 0.05 grid over [0.5, 1]
//     (opt.CPUExp > 0 fixes it), non-negative least squares (unweighted:
//     the large points, which the model must extrapolate from, count
//     most) of cpu_s_per_s on [1000·(ingest hb/s / 1000)ᵅ, controllers,
//     1]; the α of least residual is kept. Only points whose cells ran in
//     child processes count (in-process points count the senders too).
//     The live cycles' CPU is not taken out first: the live means are wall
//     times, stretched by whatever else the machine runs, and at a fixed
//     interval the cycles' per-cell work grows with the heartbeats, so it
//     lands in the heartbeat term (the model takes it back out where a
//     cycle saturates its goroutine).
//   - HeartbeatBytes: the mean of heartbeat_bytes.
//   - SummaryBaseBytes, SummaryPerRTTBytes: least squares of
//     summary_bytes_per_region on the RTT entries (regions − 1, at most
//     opt.NearestRTT), over the hierarchical points; one distinct entry
//     count fits a constant. A region alone carries no entry: with
//     summaries of the nearest 8, every run of 10 regions or more carries
//     8, and the 1-region points are the only other count.
//   - Solve: least squares of ln solve_ms on ln regions over hierarchical
//     points of ≥ 10 regions (below, a solve is its setup, not its
//     growth).
//
// Points that were skipped, have no figures or saturated (accepted under
// 95 % of the offered heartbeats, had cells not Ready after the window, or
// used 90 % of the machine's CPUs, controllers and senders together) are
// not used: their figures are the machine's limit and its queues. Fit errs when what is
// left cannot determine a constant.
func Fit(rep *scale.Report, opt FitOptions) (Params, error) {
	pts := usablePoints(rep, opt)
	if len(pts) < 2 {
		return Params{}, fmt.Errorf("scalemodel: fit: %d usable points (unskipped, with figures, ingest ≥ %.0f %% of offered); need at least 2", len(pts), 100*minIngestFraction)
	}
	var p Params
	var err error
	if p.FullCycle, err = fitCost(pts, func(f *scale.Figures) float64 { return f.CycleP50Ms }); err != nil {
		return Params{}, fmt.Errorf("scalemodel: fit full cycle: %w", err)
	}
	if p.FullCycleCPU, err = fitCost(pts, func(f *scale.Figures) float64 { return deref(f.CycleCPUP50Ms) }); err != nil {
		p.FullCycleCPU = Linear{} // no thread clock in these runs: the wall time stands in
	}
	if p.LiveCycle, err = fitCost(pts, func(f *scale.Figures) float64 { return f.LiveProjectionMeanMs }); err != nil {
		return Params{}, fmt.Errorf("scalemodel: fit live cycle: %w", err)
	}
	if p.LiveBuild, err = fitCost(pts, func(f *scale.Figures) float64 { return f.LiveXDSBuildMeanMs }); err != nil {
		return Params{}, fmt.Errorf("scalemodel: fit live build: %w", err)
	}
	p.CycleSpread = fitSpread(pts)
	p.PushesPerControllerPerS = median(perPoint(pts, func(q fitPoint) (float64, bool) {
		return q.f.LivePushesPerS / float64(q.controllers), true
	}))
	if err := fitCPU(&p, pts, opt.CPUExp); err != nil {
		return Params{}, err
	}
	p.HeartbeatBytes = mean(pts, func(q fitPoint) (float64, bool) { return q.f.HeartbeatBytes, q.f.HeartbeatBytes > 0 })
	if err := fitSummary(&p, pts, opt.NearestRTT); err != nil {
		return Params{}, err
	}
	if p.Solve, err = fitSolve(pts); err != nil {
		return Params{}, err
	}
	return p, nil
}

// fitCost fits y(n) in both forms, relative weights, and keeps the better.
func fitCost(pts []fitPoint, y func(*scale.Figures) float64) (Linear, error) {
	best, bestRSS := Linear{}, math.Inf(1)
	var lastErr error = errSingular
	for _, nlogn := range []bool{false, true} {
		var x [][]float64
		var ys, ws []float64
		for _, q := range pts {
			v := y(q.f)
			if v <= 0 || math.IsNaN(v) {
				continue
			}
			x = append(x, []float64{1, growth(q.n, nlogn)})
			ys, ws = append(ys, v), append(ws, 1/(v*v))
		}
		b, rss, err := lstsq(x, ys, ws)
		if err != nil {
			lastErr = err
			continue
		}
		if rss < bestRSS {
			best, bestRSS = Linear{A: b[0], B: b[1], NLogN: nlogn}, rss
		}
	}
	if math.IsInf(bestRSS, 1) {
		return Linear{}, lastErr
	}
	return best, nil
}

// fitSpread is the median lognormal σ of the full-push cycles' P99/P50:
// their CPU times', where every point has them (the spread of the cost;
// the model's shared cores add the waits), else their wall times'.
func fitSpread(pts []fitPoint) float64 {
	cpu := true
	for _, q := range pts {
		cpu = cpu && q.f.CycleCPUP50Ms != nil && q.f.CycleCPUP99Ms != nil
	}
	var s []float64
	for _, q := range pts {
		p50, p99 := q.f.CycleP50Ms, q.f.CycleP99Ms
		if cpu {
			p50, p99 = *q.f.CycleCPUP50Ms, *q.f.CycleCPUP99Ms
		}
		if q.n >= 100 && p50 > 0 && p99 >= p50 {
			s = append(s, math.Log(p99/p50)/z99)
		}
	}
	return median(s)
}

// deref is *v, or NaN for nil (unmeasured).
func deref(v *float64) float64 {
	if v == nil {
		return math.NaN()
	}
	return *v
}

// z99 is the standard normal's 99th percentile.
const z99 = 2.326

// fitCPU fits the heartbeat, controller and process CPU.
func fitCPU(p *Params, pts []fitPoint, fixedExp float64) error {
	var use []fitPoint
	for _, q := range pts {
		if q.f.CellProcs > 0 && q.f.CPUSPerS > 0 {
			use = append(use, q)
		}
	}
	if len(use) < 3 {
		return fmt.Errorf("scalemodel: fit cpu: %d points with cells in child processes; need at least 3", len(use))
	}
	exps := []float64{fixedExp}
	if fixedExp <= 0 {
		exps = nil
		for i := 0; i <= 10; i++ {
			exps = append(exps, 0.5+0.05*float64(i))
		}
	}
	bestRSS := math.Inf(1)
	for _, a := range exps {
		x, y := make([][]float64, len(use)), make([]float64, len(use))
		for i, q := range use {
			x[i] = []float64{RefHeartbeatsPerS * math.Pow(q.f.IngestHeartbeatsPerS/RefHeartbeatsPerS, a), float64(q.controllers), 1}
			y[i] = q.f.CPUSPerS
		}
		b, err := nnlsSubsets(x, y)
		if err != nil {
			continue
		}
		if rss := residual(x, y, b); rss < bestRSS {
			bestRSS = rss
			p.HeartbeatCPUUs, p.HeartbeatCPUExp, p.ControllerCPUMsPerS, p.ProcessCPUMsPerS = 1e6*b[0], a, 1e3*b[1], 1e3*b[2]
		}
	}
	if math.IsInf(bestRSS, 1) {
		return fmt.Errorf("scalemodel: fit cpu: %w", errSingular)
	}
	return nil
}

// residual is Σ (y − x·b)².
func residual(x [][]float64, y, b []float64) float64 {
	rss := 0.0
	for i, row := range x {
		e := y[i]
		for j := range row {
			e -= row[j] * b[j]
		}
		rss += e * e
	}
	return rss
}

// fitSummary fits the summary bytes on the RTT entries.
func fitSummary(p *Params, pts []fitPoint, nearest int) error {
	var x [][]float64
	var y []float64
	regions := map[int]bool{}
	for _, q := range pts {
		s := q.f.SummaryBytesPerRegion
		if q.topology != scale.Hierarchical || s == nil || *s <= 0 {
			continue
		}
		e := q.controllers - 1
		if nearest > 0 && nearest < e {
			e = nearest
		}
		x, y = append(x, []float64{1, float64(e)}), append(y, *s)
		regions[e] = true
	}
	switch {
	case len(y) == 0:
		return fmt.Errorf("scalemodel: fit summary: no hierarchical point with summary bytes")
	case len(regions) == 1:
		p.SummaryBaseBytes = meanOf(y)
		return nil
	}
	b, _, err := lstsq(x, y, nil)
	if err != nil {
		return fmt.Errorf("scalemodel: fit summary: %w", err)
	}
	p.SummaryBaseBytes, p.SummaryPerRTTBytes = b[0], b[1]
	return nil
}

// minSolveRegions: solves of fewer regions time their setup.
const minSolveRegions = 10

// fitSolve fits ln solve on ln regions.
func fitSolve(pts []fitPoint) (Power, error) {
	var x [][]float64
	var y []float64
	for _, q := range pts {
		s := q.f.SolveMs
		if q.topology != scale.Hierarchical || q.controllers < minSolveRegions || s == nil || *s <= 0 {
			continue
		}
		x, y = append(x, []float64{1, math.Log(float64(q.controllers))}), append(y, math.Log(*s))
	}
	b, _, err := lstsq(x, y, nil)
	if err != nil {
		return Power{}, fmt.Errorf("scalemodel: fit solve (needs solves at two region counts ≥ %d): %w", minSolveRegions, err)
	}
	return Power{C: math.Exp(b[0]), P: b[1]}, nil
}

func mean(pts []fitPoint, v func(fitPoint) (float64, bool)) float64 { return meanOf(perPoint(pts, v)) }

// perPoint is v of every point where it applies.
func perPoint(pts []fitPoint, v func(fitPoint) (float64, bool)) []float64 {
	var xs []float64
	for _, q := range pts {
		if x, ok := v(q); ok {
			xs = append(xs, x)
		}
	}
	return xs
}

func meanOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
