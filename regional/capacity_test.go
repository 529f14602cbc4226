package regional

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// The summary's capacity starts at the prior with confidence 0, keeps it
// while the cell shows no traffic, moves toward what the cell serves at
// its SLO once it does, and counts heartbeats the estimator refuses.
func TestSummaryCapacityMeasured(t *testing.T) {
	f := newRegFixture(t)
	cfg := DefaultConfig("r1").Global
	cfg.NominalCellRPS = 2
	// The fixture's heartbeats are one cycle apart: a short time constant
	// and little evidence needed, so a few seconds of fake time suffice.
	cfg.Capacity.Tau, cfg.Capacity.EvidenceRequests = f.reg.cfg.CycleInterval*10, 5
	cfg.withDefaults()
	s := newTestSyncer(cfg, "r1", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	model := func() (capRPS, conf float64) {
		t.Helper()
		sm := s.summary.build(f.clock.Now())
		if len(sm.GetModels()) != 1 {
			t.Fatalf("models = %v", sm.GetModels())
		}
		return sm.GetModels()[0].GetCapacityRps(), sm.GetModels()[0].GetCapacityConfidence()
	}

	// Idle: the prior.
	for range 5 {
		f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
		if c, conf := model(); c != 2 || conf != 0 {
			t.Fatalf("idle cell: capacity %v confidence %v, want the prior 2 with 0", c, conf)
		}
	}
	// A low-load heartbeat teaches the low-load TTFT, then the cell runs at
	// its SLO (TTFT P95 = 1.5 s) completing 3 rps.
	hb := heartbeat("a", "127.0.0.1:1001", ready, 0)
	hb.Signals.RequestRate, hb.Signals.TtftP95Seconds, hb.Signals.Running = f64(0.1), f64(0.3), f64(0.5)
	f.send(hb)
	model()
	var capRPS, conf float64
	for range 150 {
		hb := heartbeat("a", "127.0.0.1:1001", ready, 0)
		hb.Signals.RequestRate, hb.Signals.TtftP95Seconds, hb.Signals.Running = f64(3), f64(1.5), f64(15)
		f.send(hb)
		capRPS, conf = model()
	}
	if conf <= 0.3 || capRPS <= 2.3 || capRPS > 3+1e-9 {
		t.Fatalf("after 150 heartbeats at the SLO serving 3 rps: capacity %v confidence %v, want toward 3 with confidence > 0.3", capRPS, conf)
	}
	// An absurd value (a request rate the registry accepts but the
	// estimator does not) is ignored and counted.
	bad := heartbeat("a", "127.0.0.1:1001", ready, 0)
	bad.Signals.RequestRate, bad.Signals.TtftP95Seconds = f64(1e8), f64(1.5)
	f.send(bad)
	if c, _ := model(); c < capRPS-0.05 || c > 3+1e-9 {
		t.Errorf("an absurd heartbeat moved the capacity from %v to %v", capRPS, c)
	}
	if got := testutil.ToFloat64(f.m.capacityRejected); got != 1 {
		t.Errorf("capacity samples rejected = %v, want 1", got)
	}
	// The same heartbeat read twice is one sample: no change in evidence.
	before, _ := model()
	if after, _ := model(); after != before {
		t.Errorf("re-reading the same view moved the capacity %v → %v", before, after)
	}
}
