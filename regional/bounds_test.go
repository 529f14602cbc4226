package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/summary"
)

// The reproduction: a heartbeat with ttft_p95_seconds=1e5 (above
// the summary's 86,400 s) is taken with the signal capped at the bound
// and counted, and the region's summary stays valid. On the old code the
// heartbeat passed validation unchanged and every summary of the region
// failed summary.Validate.
func TestHeartbeatTTFTAboveBoundKeepsSummaryValid(t *testing.T) {
	f := newRegFixture(t)
	s := newTestSyncer(DefaultConfig("r1").Global, "r1", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
	hb := heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
	hb.Signals.TtftP95Seconds, hb.Signals.RequestRate = f64(1e5), f64(1)
	if err := validateHeartbeat(hb, "r1"); err != nil {
		t.Fatalf("validateHeartbeat = %v; an out-of-range (finite) signal is capped, not refused", err)
	}
	f.send(hb)
	c, _ := f.reg.View().Cell("a")
	if got := c.Signals.GetTtftP95Seconds(); got != summary.MaxTTFTSeconds {
		t.Errorf("registry holds ttft_p95_seconds %v, want it capped at %v", got, float64(summary.MaxTTFTSeconds))
	}
	if got := testutil.ToFloat64(f.m.signalsClamped.WithLabelValues("ttft_p95_seconds")); got != 1 {
		t.Errorf("signals clamped{field=ttft_p95_seconds} = %v, want 1", got)
	}
	sm := s.summary.build(f.clock.Now())
	if err := summary.ValidateAt(sm, f.clock.Now()); err != nil {
		t.Fatalf("the region's summary is invalid after one cell's heartbeat: %v", err)
	}
	if len(sm.GetModels()) != 1 || sm.GetModels()[0].GetCellsReady() != 1 {
		t.Fatalf("summary models = %v, want the cell counted ready", sm.GetModels())
	}
}

// randomSignal draws a signal value at the edges: absent, zero, normal,
// at and beyond each shared bound, huge, and now and then a corrupt one
// (NaN, an infinity, negative) that validation refuses. fraction: the
// signal is a fraction; then the large values are ones just above 1 that
// validation lets through.
func randomSignal(rng *rand.Rand, fraction bool) *float64 {
	var v float64
	switch k := rng.IntN(40); {
	case k == 0:
		v = math.NaN()
	case k == 1:
		v = math.Inf(1 - 2*rng.IntN(2))
	case k == 2:
		v = -rng.Float64()
	case k < 8:
		return nil
	case k < 12:
		v = 0
	case fraction && k < 20:
		v = 1 + rng.Float64()*1e-4
	case fraction:
		v = rng.Float64()
	case k < 16:
		v = summary.MaxTTFTSeconds * (1 + rng.Float64())
	case k < 20:
		v = summary.MaxRateRPS * (1 + rng.Float64())
	case k < 23:
		v = math.MaxFloat64 * rng.Float64()
	case k < 26:
		v = rng.Float64() * 1e13
	default:
		v = rng.Float64() * 100
	}
	return &v
}

// Property: whatever the registry accepts (random heartbeats and
// data-plane reports, extreme values, NaN, Inf and huge counts among
// them, each through the validation the gRPC services apply) produces a
// summary that passes summary.ValidateAt. Fails on the old code, whose
// heartbeat bound (1e12) and report bound (2^40 requests) were looser
// than the summary's.
func TestAcceptedInputAlwaysPublishable(t *testing.T) {
	f := newRegFixture(t)
	s := newTestSyncer(DefaultConfig("r1").Global, "r1", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
	rng := rand.New(rand.NewPCG(22, 2))
	states := []isobarpb.LifecycleState{
		isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING, isobarpb.LifecycleState_LIFECYCLE_STATE_READY,
		isobarpb.LifecycleState_LIFECYCLE_STATE_READY, isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING,
	}
	var accepted, refused, reports int
	for round := range 40 {
		for range 8 {
			id := fmt.Sprintf("c%d", rng.IntN(12))
			hb := heartbeat(id, fmt.Sprintf("127.0.0.1:%d", 1000+rng.IntN(16)), states[rng.IntN(len(states))], 0)
			hb.Capability.Model = fmt.Sprintf("m%d", rng.IntN(3))
			sg := hb.Signals
			sg.QueueDepth, sg.Running, sg.TtftP95Seconds = randomSignal(rng, false), randomSignal(rng, false), randomSignal(rng, false)
			sg.PowerWatts, sg.RequestRate, sg.WindowRequests = randomSignal(rng, false), randomSignal(rng, false), randomSignal(rng, false)
			sg.ErrorRate, sg.KvCacheUsage = randomSignal(rng, true), randomSignal(rng, true)
			sg.PrefixCacheHitRate, sg.GpuUtil = randomSignal(rng, true), randomSignal(rng, true)
			f.seq[id]++
			hb.Sequence = f.seq[id]
			if err := validateHeartbeat(hb, "r1"); err != nil {
				refused++
				continue
			}
			accepted++
			f.send(hb)
		}
		for range 2 {
			interval := []float64{1e-9, 0.5, 1, 60}[rng.IntN(4)]
			huge := []uint64{0, 1, 1 << 40, math.MaxUint64, uint64(summary.MaxRateRPS * math.Max(interval, 1))}[rng.IntN(5)]
			r := &isobarpb.DataPlaneReport{Node: fmt.Sprintf("gw%d", rng.IntN(3)), Region: "r1", IntervalSeconds: interval,
				Endpoints: []*isobarpb.EndpointStats{{CellId: fmt.Sprintf("c%d", rng.IntN(12)), Requests: huge, Errors: huge / 2}},
				Demand:    []*isobarpb.ModelDemand{{Model: fmt.Sprintf("m%d", rng.IntN(4)), Requests: huge, Shed: huge / 3}}}
			if validateReport(r, "r1") != nil {
				continue
			}
			reports++
			if err := f.reg.send(context.Background(), message{report: r}); err != nil {
				t.Fatal(err)
			}
		}
		f.tick()
		now := f.clock.Now()
		if err := summary.ValidateAt(s.summary.build(now), now); err != nil {
			t.Fatalf("round %d: the summary built from what the registry accepted is invalid: %v", round, err)
		}
	}
	t.Logf("heartbeats accepted %d, refused %d; reports accepted %d", accepted, refused, reports)
	if accepted < 50 || reports < 10 {
		t.Fatalf("too few inputs accepted (%d heartbeats, %d reports) for the property to mean anything", accepted, reports)
	}
}

// A report whose count implies more than the shared rate bound is refused
// (ErrReportOutOfRange, with ErrInvalidReport); one at the bound passes.
func TestValidateReportRateBound(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval float64
		requests uint64
		ok       bool
	}{
		{"at the bound", 2, uint64(2 * summary.MaxRateRPS), true},
		{"above the bound", 2, uint64(2*summary.MaxRateRPS) + 1, false},
		{"short interval counts as a second", 0.001, uint64(summary.MaxRateRPS), true},
		{"2^40 in a second", 1, 1 << 40, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []*isobarpb.DataPlaneReport{
				{Node: "gw", Region: "r1", IntervalSeconds: tc.interval, Demand: []*isobarpb.ModelDemand{{Model: "m", Requests: tc.requests}}},
				{Node: "gw", Region: "r1", IntervalSeconds: tc.interval, Endpoints: []*isobarpb.EndpointStats{{CellId: "a", Requests: tc.requests}}},
			} {
				err := validateReport(r, "r1")
				if tc.ok && err != nil {
					t.Fatalf("validateReport = %v, want nil", err)
				}
				if !tc.ok && (!errors.Is(err, ErrReportOutOfRange) || !errors.Is(err, ErrInvalidReport)) {
					t.Fatalf("validateReport = %v, want ErrReportOutOfRange", err)
				}
			}
		})
	}
}

// An endpoint conflict clears when the other claimant goes. On the old
// code claimEndpoint ran only when a cell's endpoint changed, so b stayed
// conflicting (weight 0) forever.
func TestEndpointConflictClears(t *testing.T) {
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	const ep = "127.0.0.1:1001"
	conflicted := func(t *testing.T) *regFixture {
		t.Helper()
		f := newLimitedFixture(t, func(c *Config) { c.ForgetAfter = 2 * time.Second })
		f.send(heartbeat("a", ep, ready, 0))
		f.send(heartbeat("b", ep, ready, 0))
		if c, _ := f.reg.View().Cell("b"); !c.EndpointConflict {
			t.Fatalf("b = %+v, want a conflict", c)
		}
		return f
	}
	// routable waits, b heartbeating every cycle (a too when aAlive), until
	// b holds the endpoint with weight.
	routable := func(t *testing.T, f *regFixture, aAlive bool, aEP string) {
		t.Helper()
		for range 100 {
			f.send(heartbeat("b", ep, ready, 0))
			if aAlive {
				f.send(heartbeat("a", aEP, ready, 0))
			}
			f.tick()
			if c, _ := f.reg.View().Cell("b"); !c.EndpointConflict && c.Weight.Published > 0 {
				return
			}
		}
		c, _ := f.reg.View().Cell("b")
		t.Fatalf("b never became routable: %+v", c)
	}

	t.Run("holder terminates and is forgotten", func(t *testing.T) {
		f := conflicted(t)
		f.send(heartbeat("a", ep, isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED, 0))
		for range 100 {
			if _, ok := f.reg.View().Cell("a"); !ok {
				break
			}
			f.send(heartbeat("b", ep, ready, 0))
			f.tick()
		}
		if _, ok := f.reg.View().Cell("a"); ok {
			t.Fatal("a was never forgotten")
		}
		routable(t, f, false, "")
	})
	t.Run("holder moves to another endpoint", func(t *testing.T) {
		f := conflicted(t)
		routable(t, f, true, "127.0.0.1:1002")
		if c, _ := f.reg.View().Cell("a"); c.EndpointConflict || c.Weight.Published == 0 {
			t.Fatalf("a after moving = %+v, want routable", c)
		}
	})
	t.Run("one address written another way", func(t *testing.T) {
		f := newRegFixture(t)
		f.send(heartbeat("a", "10.0.0.5:8000", ready, 0))
		f.send(heartbeat("b", "[::ffff:10.0.0.5]:8000", ready, 0))
		f.send(heartbeat("c", "[2001:db8::1]:8000", ready, 0))
		f.send(heartbeat("d", "[2001:0db8:0::1]:8000", ready, 0))
		for _, id := range []string{"b", "d"} {
			if c, _ := f.reg.View().Cell(id); !c.EndpointConflict {
				t.Errorf("%s = %+v, want a conflict: its endpoint is another cell's written differently", id, c)
			}
		}
	})
	t.Run("holder fails and comes back", func(t *testing.T) {
		f := conflicted(t)
		// a goes silent: after its TTL it is Failed and b takes the endpoint.
		routable(t, f, false, "")
		if c, _ := f.reg.View().Cell("a"); c.State != lifecycle.Failed {
			t.Fatalf("a = %s, want failed", c.State)
		}
		// a returns on the same endpoint: b holds it now, a conflicts;
		// never both routable on one address.
		f.send(heartbeat("a", ep, ready, 0))
		a, _ := f.reg.View().Cell("a")
		b, _ := f.reg.View().Cell("b")
		if !a.EndpointConflict || b.EndpointConflict {
			t.Fatalf("after a returns: a conflict=%v, b conflict=%v; want only a", a.EndpointConflict, b.EndpointConflict)
		}
	})
}
