package scalemodel

import (
	"container/heap"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/bench/scale"
)

func TestLstsqRecoversALine(t *testing.T) {
	var x [][]float64
	var y []float64
	for _, n := range []float64{1, 10, 100, 1000} {
		x, y = append(x, []float64{1, n}), append(y, 0.5+0.003*n)
	}
	b, rss, err := lstsq(x, y, nil)
	if err != nil || math.Abs(b[0]-0.5) > 1e-9 || math.Abs(b[1]-0.003) > 1e-12 || rss > 1e-12 {
		t.Fatalf("lstsq = %v rss %g err %v, want [0.5 0.003]", b, rss, err)
	}
	if _, _, err := lstsq([][]float64{{1, 5}, {1, 5}}, []float64{1, 2}, nil); err == nil {
		t.Fatal("one distinct x fitted a line")
	}
}

func TestNNLSDropsANegativeColumn(t *testing.T) {
	// y = 2·a exactly, with a column c that least squares would give a
	// negative weight: the non-negative fit keeps it at 0.
	x := [][]float64{{1, 0}, {2, 1}, {3, 0}, {4, 1}}
	y := []float64{2, 3.9, 6, 7.9}
	b, err := nnlsSubsets(x, y)
	if err != nil || b[1] != 0 || math.Abs(b[0]-1.97) > 0.05 {
		t.Fatalf("nnls = %v, %v; want [≈2 0]", b, err)
	}
}

func TestPSServerSharesCores(t *testing.T) {
	// One core, two jobs of 1 s at 0: each is served at half rate. At 1 s
	// (0.5 s left each) a job of 0.25 s joins: three at a third each, it
	// finishes at 1.75 s; the two then have 0.25 s left at half rate and
	// finish together at 2.25 s.
	p := &psServer{cores: 1}
	p.add(kindHeartbeat, 1)
	p.add(kindHeartbeat, 1)
	p.advance(1)
	p.add(kindProbe, 0.25)
	if got := p.nextCompletion(); math.Abs(got-1.75) > 1e-9 {
		t.Fatalf("first completion at %v, want 1.75", got)
	}
	p.advance(p.nextCompletion())
	if j := heap.Pop(&p.active).(job); j.kind != kindProbe {
		t.Fatalf("first out %v, want the probe", j.kind)
	}
	for range 2 {
		if got := p.nextCompletion(); math.Abs(got-2.25) > 1e-9 {
			t.Fatalf("long job finished at %v, want 2.25", got)
		}
		p.advance(p.nextCompletion())
		heap.Pop(&p.active)
	}
	// Two cores: one job alone uses one core, not two.
	q := &psServer{cores: 2}
	q.add(kindHeartbeat, 1)
	if got := q.nextCompletion(); got != 1 {
		t.Fatalf("a lone job on 2 cores finished at %v, want 1", got)
	}
}

// synthParams are costs a synthetic report is generated from.
func synthParams() Params {
	return Params{
		HeartbeatCPUUs: 40, HeartbeatCPUExp: 0.8, ControllerCPUMsPerS: 2, ProcessCPUMsPerS: 15,
		FullCycle: Linear{A: 0.02, B: 0.004}, FullCycleCPU: Linear{A: 0.015, B: 0.003}, LiveCycle: Linear{A: 0.01, B: 0.001}, LiveBuild: Linear{A: 0.05, B: 0.002},
		CycleSpread: 0.5, PushesPerControllerPerS: 0.9, HeartbeatBytes: 250,
		SummaryBaseBytes: 250, SummaryPerRTTBytes: 17, Solve: Power{C: 0.001, P: 1.6},
	}
}

// synthReport is a bench scale report whose figures follow p exactly.
func synthReport(p Params) *scale.Report {
	rep := &scale.Report{Machine: scale.Machine{NumCPU: 2}, Config: scale.ReportConfig{HeartbeatIntervalMs: 500, CycleIntervalMs: 100, SummaryIntervalMs: 1000}}
	for _, cells := range []int{10, 100, 1000} {
		for _, regions := range []int{0, 1, 10, 100} {
			if regions > cells {
				continue
			}
			ctrls, topo := regions, scale.Hierarchical
			if regions == 0 {
				ctrls, topo = 1, scale.Flat
			}
			n := float64(cells / ctrls)
			hb := float64(cells) * 2
			f := &scale.Figures{OfferedHeartbeatsPerS: hb, IngestHeartbeatsPerS: hb, IngestFraction: 1, CellProcs: 1,
				CycleP50Ms: p.FullCycle.At(n), CycleP99Ms: p.FullCycle.At(n) * math.Exp(z99*p.CycleSpread),
				CycleCPUP50Ms: ptr(p.FullCycleCPU.At(n)), CycleCPUP99Ms: ptr(p.FullCycleCPU.At(n) * math.Exp(z99*p.CycleSpread)),
				LiveProjectionMeanMs: p.LiveCycle.At(n), LiveXDSBuildMeanMs: p.LiveBuild.At(n),
				LivePushesPerS: float64(ctrls) * p.PushesPerS(10), HeartbeatBytes: p.HeartbeatBytes}
			f.CPUSPerS = p.IngestCores(hb) + float64(ctrls)*p.ControllerCPUMsPerS/1e3 + p.ProcessCPUMsPerS/1e3
			if topo == scale.Hierarchical {
				s, solve := p.SummaryBytes(ctrls, 0), p.Solve.At(float64(ctrls))
				f.SummaryBytesPerRegion, f.SolveMs = &s, &solve
				f.GlobalInboundBytesPerS = float64(ctrls) * s
			} else {
				f.GlobalInboundBytesPerS = hb * p.HeartbeatBytes
			}
			rep.Points = append(rep.Points, scale.Point{Cells: cells, Regions: max(regions, 1), Topology: topo, CellsPerController: int(n), Figures: f})
		}
	}
	return rep
}

func TestFitRecoversTheCostsItWasGivenAndIgnoresSaturatedPoints(t *testing.T) {
	want := synthParams()
	rep := synthReport(want)
	// A saturated point with nonsense figures must not move the fit.
	rep.Points = append(rep.Points, scale.Point{Cells: 10000, Regions: 1, Topology: scale.Flat, CellsPerController: 10000,
		Figures: &scale.Figures{OfferedHeartbeatsPerS: 20000, IngestHeartbeatsPerS: 8000, IngestFraction: 0.4, CPUSPerS: 99, CycleP50Ms: 999, CellProcs: 1}})
	got, err := Fit(rep, FitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, g, w float64) {
		if math.Abs(g-w) > 1e-6*math.Max(1, math.Abs(w)) {
			t.Errorf("%s = %g, want %g", name, g, w)
		}
	}
	near("heartbeat µs", got.HeartbeatCPUUs, want.HeartbeatCPUUs)
	near("heartbeat exponent", got.HeartbeatCPUExp, want.HeartbeatCPUExp)
	near("controller ms/s", got.ControllerCPUMsPerS, want.ControllerCPUMsPerS)
	near("process ms/s", got.ProcessCPUMsPerS, want.ProcessCPUMsPerS)
	near("full cycle b", got.FullCycle.B, want.FullCycle.B)
	near("full cycle cpu a", got.FullCycleCPU.A, want.FullCycleCPU.A)
	near("full cycle cpu b", got.FullCycleCPU.B, want.FullCycleCPU.B)
	near("live cycle b", got.LiveCycle.B, want.LiveCycle.B)
	near("spread", got.CycleSpread, want.CycleSpread)
	near("pushes", got.PushesPerControllerPerS, want.PushesPerControllerPerS)
	near("summary per rtt", got.SummaryPerRTTBytes, want.SummaryPerRTTBytes)
	near("solve p", got.Solve.P, want.Solve.P)
	if got.FullCycle.NLogN {
		t.Error("a linear cost was fitted as n·log n")
	}
}

func TestValidateReproducesASyntheticPoint(t *testing.T) {
	p := synthParams()
	cs, err := Validate(p, synthReport(p), 1000, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		for _, k := range c.Checks {
			if k.Figure == "controllers' CPU s/s" || k.Figure == "global inbound B/s" {
				if k.RelErr() > 1e-9 {
					t.Errorf("%d/%d %s: model %g, measured %g", c.Cells, c.Regions, k.Figure, k.Model, k.Measured)
				}
			}
		}
		if !c.Pass() {
			t.Errorf("%d cells %d regions %s: %+v", c.Cells, c.Regions, c.Topology, c.Checks)
		}
		// The cost (CPU time) is held to the tolerance; the wall time,
		// which holds the waits for a core, is shown beside it.
		for _, k := range c.Checks {
			if strings.Contains(k.Figure, "cycle CPU") != k.Gated && strings.HasPrefix(k.Figure, "cycle") {
				t.Errorf("%s: gated %v", k.Figure, k.Gated)
			}
		}
	}
	// A report without the cycles' CPU times (from before they were
	// measured) fits no cost and holds the wall time to the tolerance.
	rep := synthReport(p)
	for _, pt := range rep.Points {
		pt.Figures.CycleCPUP50Ms, pt.Figures.CycleCPUP99Ms = nil, nil
	}
	old, err := Fit(rep, FitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if old.FullCycleCPU != (Linear{}) {
		t.Errorf("fitted a cycle CPU cost without any measured: %+v", old.FullCycleCPU)
	}
	cs, err = Validate(old, rep, 1000, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if k := cs[0].Checks[0]; k.Figure != "cycle P50 ms (full push, wall)" || !k.Gated {
		t.Errorf("without CPU times the first check is %+v, want the wall P50 gated", k)
	}
}

func TestRunTinyIsDeterministicBySeed(t *testing.T) {
	p := synthParams()
	s := Scenario{Cells: 200, Regions: 4, Cores: 2, Horizon: 500 * time.Millisecond, Seed: 7}
	a, err := Run(p, s)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Run(p, s)
	if a.FullCycleP99Ms != b.FullCycleP99Ms || a.LiveCycleP50Ms != b.LiveCycleP50Ms || a.IngestHeartbeatsPerS != b.IngestHeartbeatsPerS {
		t.Fatalf("same seed, different results: %+v vs %+v", a, b)
	}
	if a.Saturated || math.Abs(a.IngestHeartbeatsPerS-400)/400 > 0.05 {
		t.Fatalf("ingest %v of 400 offered (saturated %v)", a.IngestHeartbeatsPerS, a.Saturated)
	}
	// The full cycle's response is at least its cost's median.
	if a.FullCycleP50Ms < 0.9*p.CycleCost(50) {
		t.Fatalf("full cycle P50 %v below its cost %v", a.FullCycleP50Ms, p.CycleCost(50))
	}
	// Saturation: 100,000 cells at 40 µs each need 8 cores of ingest.
	sat, err := Run(p, Scenario{Cells: 100000, Topology: scale.Flat, Cores: 2})
	if err != nil || !sat.Saturated || sat.IngestHeartbeatsPerS >= sat.OfferedHeartbeatsPerS {
		t.Fatalf("100,000 cells on 2 cores: %+v, %v", sat, err)
	}
}

func TestBadInputIsAnError(t *testing.T) {
	for _, in := range []string{"", "not json", `{"points": []}`, `{"points": 3}`} {
		if _, err := parseReport([]byte(in), "x"); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
	if _, err := Fit(&scale.Report{Config: scale.ReportConfig{CycleIntervalMs: 100}}, FitOptions{}); err == nil || !strings.Contains(err.Error(), "usable points") {
		t.Errorf("empty report fitted: %v", err)
	}
	for _, s := range []Scenario{{Cells: 0, Cores: 2}, {Cells: 10, Regions: 20, Cores: 2}, {Cells: 10, Regions: 1, Cores: 1, OtherCPU: 1}, {Cells: 10, Topology: "mesh", Cores: 1}} {
		if _, err := Run(synthParams(), s); err == nil {
			t.Errorf("%+v ran", s)
		}
	}
}

func FuzzParseReport(f *testing.F) {
	f.Add([]byte(`{"points":[{"cells":10,"regions":1,"topology":"flat","figures":{"offered_heartbeats_per_s":20}}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rep, err := parseReport(b, "fuzz")
		if err != nil {
			return
		}
		// Whatever parsed, fitting and validating must not panic.
		if p, err := Fit(rep, FitOptions{}); err == nil {
			_, _ = Validate(p, rep, largestMeasured(rep), 0, 1)
		}
	})
}

func ptr(v float64) *float64 { return &v }
