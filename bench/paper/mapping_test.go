package paper

import (
	"reflect"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/score"
)

// registryView is cell c as the regional registry holds it once c's
// cellagent has sent its heartbeat: the reading's values as the
// heartbeat's signals, the sources' health, the probe's round trip, the
// declared context. The registry maps it with cycle.FromView.
func registryView(c cycle.Cell) cycle.CellView {
	r := c.Reading
	opt := func(v score.Value) *float64 {
		if !v.OK {
			return nil
		}
		return &v.V
	}
	s := &isobarpb.Signals{
		QueueDepth: opt(r.QueueDepth), Running: opt(r.Running), TtftP95Seconds: opt(r.TTFTP95),
		ErrorRate: opt(r.ErrorRate), KvCacheUsage: opt(r.KVCache),
		GpuUtil: opt(r.GPUUtil), VramUsed: opt(r.VRAM), SmActive: opt(r.SMActive), DramActive: opt(r.DRAMActive),
		TemperatureCelsius: opt(r.TemperatureC),
	}
	if r.ThrottleOK {
		s.ClockThrottleReasons = &r.ThrottleReasons
	}
	if c.EngineRequests > 0 {
		s.WindowRequests = &c.EngineRequests
	}
	return cycle.CellView{
		ID: c.ID, Model: c.Model, MaxModelLen: c.MaxModelLen, State: c.State,
		Signals: s, VLLM: cycle.SourceView{OK: r.AppOK}, DCGM: cycle.SourceView{OK: r.HardwareOK},
		RTT: r.RTT, Jitter: r.Jitter, RTTOK: r.RTTOK,
	}
}

// The bench maps its cells with the registry's mapping, from the inputs
// the registry would have: at every tick of an isobar run with a kill
// (data-plane errors, a failed cell), a DCGM outage and a cell of short
// context, each bench cell equals what cycle.FromView makes of the
// registry's view of the same cell, and cycle.Map gives the same
// projection cells and scores for both. A bench that read a signal the
// heartbeat does not carry, or mapped a cell its own way, fails here.
func TestBenchMapsCellsAsTheRegistry(t *testing.T) {
	cfg := DefaultConfig()
	w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 10, duration: 20 * time.Second, seed: 9}
	mml := make([]int, cfg.Topology.Cells())
	mml[1] = 1024
	var f *fleet
	ticks, errs, dps := 0, 0, 0
	spec := runSpec{policy: IsobarCapability, requests: w.generate(cfg.Profile), seed: 9, until: 40 * time.Second,
		maxModelLen: mml, declareCapability: true,
		faults: []fault{{at: 8 * time.Second, kind: faultKill, cell: 4}, {at: 5 * time.Second, kind: faultDCGMDown, cell: 2}},
		onTick: func(_ time.Duration, scores []cellScore) {
			ticks++
			bench := f.cycleCells
			reg := make([]cycle.Cell, len(bench))
			for i, c := range bench {
				reg[i] = cycle.FromView(registryView(c), c.DataPlane)
				if !reflect.DeepEqual(reg[i], c) {
					t.Fatalf("tick %d cell %s: bench %+v, registry %+v", ticks, c.ID, c, reg[i])
				}
				if c.DataPlane.OK {
					dps++
				}
				if c.Reading.ErrorRate.OK {
					errs++
				}
			}
			bp, bs := cycle.Map(f.scorer, bench)
			rp, rs := cycle.Map(f.scorer, reg)
			if !reflect.DeepEqual(bp, rp) || !reflect.DeepEqual(bs, rs) {
				t.Fatalf("tick %d: projection cells differ:\nbench    %+v\nregistry %+v", ticks, bp, rp)
			}
			for i, sc := range scores {
				if !reflect.DeepEqual(sc.res, rs[i]) {
					t.Fatalf("tick %d cell %d: the bench scored %+v, the registry's mapping %+v", ticks, i, sc.res, rs[i])
				}
			}
		}}
	f, err := newFleet(cfg, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.run(); err != nil {
		t.Fatal(err)
	}
	if ticks == 0 || errs == 0 || dps == 0 {
		t.Fatalf("%d ticks, %d engine and %d data-plane error windows: the run exercised too little", ticks, errs, dps)
	}
}
