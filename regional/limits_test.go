package regional

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/summary"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// newLimitedFixture is newRegFixture with cfg changed by mut.
func newLimitedFixture(t *testing.T, mut func(*Config)) *regFixture {
	t.Helper()
	return newFixtureWith(t, mut, func(*Registry) {})
}

// newFixtureWith is newLimitedFixture with mutReg applied to the registry
// before it starts.
func newFixtureWith(t *testing.T, mut func(*Config), mutReg func(*Registry)) *regFixture {
	t.Helper()
	cfg := DefaultConfig("r1")
	mut(&cfg)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	prom := prometheus.NewRegistry()
	m, err := newMetrics(prom)
	if err != nil {
		t.Fatal(err)
	}
	push := newRecordingPusher()
	reg, err := newRegistry(cfg, clock, slog.New(slog.DiscardHandler), m, push.push)
	if err != nil {
		t.Fatal(err)
	}
	reg.auditAll = true // every untouched cell compared every cycle (touched.go)
	mutReg(reg)
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	return &regFixture{t: t, clock: clock, reg: reg, push: push, prom: prom, m: m, seq: map[string]uint64{}}
}

func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Limits)
	}{
		{"no cells", func(l *Limits) { l.MaxCells = -1 }},
		{"tiny gRPC limit", func(l *Limits) { l.MaxRecvMsgBytes = 100 }},
		{"negative rate", func(l *Limits) { l.HeartbeatRate = -1 }},
		{"negative burst", func(l *Limits) { l.HeartbeatBurst = -1 }},
		{"negative skew", func(l *Limits) { l.MaxClockSkew = -time.Second }},
		{"negative demand keys", func(l *Limits) { l.MaxDemandKeys = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig("r1")
			tc.mut(&cfg.Limits)
			if err := cfg.validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("validate = %v, want ErrInvalidConfig", err)
			}
		})
	}
	if err := DefaultConfig("r1").validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
}

func TestTokenBucket(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newTokenBucket(2, 3) // 2/s, burst 3
	steps := []struct {
		at      time.Duration
		allowed bool
		dropped int
	}{
		{0, true, 0}, {0, true, 0}, {0, true, 0}, // the burst
		{0, false, 1}, {100 * time.Millisecond, false, 2}, // 0.2 tokens
		{500 * time.Millisecond, true, 2},                                // 1 token after 0.5 s; the episode of drops goes on
		{500 * time.Millisecond, false, 3},                               // spent
		{-time.Second, false, 4},                                         // time going back refills nothing
		{time.Hour, true, 4}, {time.Hour, true, 4}, {time.Hour, true, 4}, // refill caps at the burst
		{time.Hour, false, 1}, // a drop a refill time after the last: a new episode
	}
	for i, s := range steps {
		if got := b.allow(t0.Add(s.at)); got != s.allowed || b.dropped != s.dropped {
			t.Fatalf("step %d (at %v): allow = %v dropped %d, want %v dropped %d", i, s.at, got, b.dropped, s.allowed, s.dropped)
		}
	}
}

// A backlog read at once is not abuse: a stream whose controller stalled
// and then reads 100 heartbeats in the same instant has them dropped down
// to the bucket, and is not closed; a sender above the rate for the
// bucket's refill time (burst / rate) is.
func TestTokenBucketAbuseNeedsTime(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newTokenBucket(20, 40) // the defaults: refill time 2 s
	for range 100 {
		b.allow(t0)
	}
	if b.dropped != 60 || b.abusive() {
		t.Fatalf("a backlog of 100 at once: %d dropped, abusive %v; want 60 dropped, not abusive", b.dropped, b.abusive())
	}
	// The next heartbeat at the agent's pace is taken.
	if !b.allow(t0.Add(500 * time.Millisecond)) {
		t.Fatal("the heartbeat after the backlog was dropped")
	}
	// A flood of 200/s: 20/s get through, the drops never stop; abusive
	// once they have run for 2 s.
	b = newTokenBucket(20, 40)
	at := t0
	abusiveAt := time.Duration(-1)
	for i := range 1000 {
		at = t0.Add(time.Duration(i) * 5 * time.Millisecond)
		b.allow(at)
		if b.abusive() {
			abusiveAt = at.Sub(b.dropFrom)
			break
		}
	}
	if abusiveAt < 2*time.Second || abusiveAt > 3*time.Second {
		t.Fatalf("a 200/s flood judged abusive after %v of drops, want 2-3 s", abusiveAt)
	}
}

// A new cell beyond MaxCells is refused with ResourceExhausted and
// counted; a known cell reconnecting is not.
func TestHeartbeatCellLimit(t *testing.T) {
	c, _ := startController(t, func(cfg *Config) { cfg.Limits.MaxCells = 2 })
	cl := dialController(t, c.Addr(), nil)
	refused := func() float64 { return testutil.ToFloat64(c.metrics.rejected.WithLabelValues("too_many_cells")) }
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY

	first := openStream(t, cl)
	for i, id := range []string{"a", "b"} {
		s := first
		if i > 0 {
			s = openStream(t, cl)
		}
		if err := s.Send(heartbeat(id, "127.0.0.1:"+[]string{"3001", "3002"}[i], ready, 1)); err != nil {
			t.Fatal(err)
		}
		if ack, err := s.Recv(); err != nil || ack.Error != "" {
			t.Fatalf("cell %s: ack %v, %v", id, ack, err)
		}
	}
	s := openStream(t, cl)
	if err := s.Send(heartbeat("c", "127.0.0.1:3003", ready, 1)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Recv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "cell limit") {
		t.Fatalf("third cell: %v; want ResourceExhausted naming the cell limit", err)
	}
	if got := refused(); got != 1 {
		t.Fatalf("too_many_cells = %v, want 1", got)
	}

	// a's agent restarts: its old stream ends, a new one claims a again.
	if err := first.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != io.EOF {
		t.Fatalf("closing a's stream: %v", err)
	}
	waitCell(t, c, "a", nil)
	again := openStream(t, cl)
	hb := heartbeat("a", "127.0.0.1:3001", ready, 1)
	hb.Incarnation = "i2"
	if err := again.Send(hb); err != nil {
		t.Fatal(err)
	}
	if ack, err := again.Recv(); err != nil || ack.Error != "" {
		t.Fatalf("known cell reconnecting: %v, %v", ack, err)
	}
	if got := refused(); got != 1 {
		t.Fatalf("too_many_cells = %v after a known cell reconnected, want 1", got)
	}
}

// waitCell polls the controller's view until cell id satisfies cond
// (nil: is present), bounded above.
func waitCell(t *testing.T, c *Controller, id string, cond func(CellView) bool) CellView {
	t.Helper()
	var cv CellView
	if !eventually.Wait(5*time.Second, func() bool {
		var ok bool
		cv, ok = c.Registry().View().Cell(id)
		return ok && (cond == nil || cond(cv))
	}) {
		t.Fatalf("cell %s never reached the view", id)
	}
	return cv
}

// The registry bounds its own map even when the heartbeat service's view
// lags: a heartbeat for a new cell beyond MaxCells is dropped and counted.
func TestRegistryCellLimit(t *testing.T) {
	f := newLimitedFixture(t, func(cfg *Config) { cfg.Limits.MaxCells = 1 })
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	if err := f.reg.SubmitOrBlock(context.Background(), heartbeat("b", "127.0.0.1:1002", ready, 1)); err != nil {
		t.Fatal(err)
	}
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0)) // processed after b
	if _, ok := f.reg.View().Cell("b"); ok || len(f.reg.View().Cells) != 1 {
		t.Fatalf("cells = %+v, want only a", f.reg.View().Cells)
	}
	if got := testutil.ToFloat64(f.m.rejected.WithLabelValues("too_many_cells")); got != 1 {
		t.Fatalf("too_many_cells = %v, want 1", got)
	}
}

// TestHeartbeatRateLimit: heartbeats beyond a stream's bucket are dropped
// unacked and counted; a backlog at once does not close the stream, a
// sender above the rate for the bucket's refill time (burst/rate: 3 s
// here, on the fake clock) does, with ResourceExhausted.
func TestHeartbeatRateLimit(t *testing.T) {
	clk := clockwork.NewFakeClock()
	c := startControllerClock(t, clk, func(cfg *Config) { cfg.Limits.HeartbeatRate, cfg.Limits.HeartbeatBurst = 1, 3 })
	cl := dialController(t, c.Addr(), nil)
	limited := func() float64 { return testutil.ToFloat64(c.metrics.rejected.WithLabelValues("rate_limited")) }
	accepted := func() float64 { return testutil.ToFloat64(c.metrics.heartbeats) }
	s := openStream(t, cl)
	ended := make(chan error, 1)
	go func() { // drains the acks; the stream's end is its error
		for {
			if _, err := s.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	seq := uint64(0)
	// send sends n heartbeats and waits until the controller took or
	// dropped each (so the fake clock moves only between batches); false
	// once the stream has ended.
	send := func(n int) bool {
		t.Helper()
		for range n {
			seq++
			if err := s.Send(heartbeat("fast", "127.0.0.1:3101", ready, seq)); err != nil {
				return false
			}
		}
		done := false
		awaitCond(t, "every heartbeat sent taken or dropped, or the stream closed", func() bool {
			select {
			case err := <-ended:
				ended <- err
				done = true
				return true
			default:
				return accepted()+limited() >= float64(seq)
			}
		})
		return !done
	}
	// 3 within the burst, 3 dropped at once: a backlog, not a flood.
	if !send(6) || limited() != 3 || accepted() != 3 {
		t.Fatalf("rate_limited %v accepted %v, want 3 and 3 and the stream open", limited(), accepted())
	}
	// 50/s against 1/s: drops without a pause; closed once they have
	// gone on for 3 s (30 steps of 100 ms).
	steps := 0
	for ; steps < 60 && send(5); steps++ {
		clk.Advance(100 * time.Millisecond)
	}
	err := <-ended
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "rate limit") {
		t.Fatalf("after a sustained flood: %v; want ResourceExhausted naming the rate limit", err)
	}
	if steps < 29 || steps > 35 {
		t.Errorf("closed after %d steps of 100 ms of flooding, want about 30 (the bucket's 3 s refill time)", steps)
	}
}

// A heartbeat whose sent_at is an hour off is accepted; the cell is
// flagged (view, debug endpoint, metrics) and liveness runs on the
// receive time: it stays Ready while heartbeats arrive and fails one TTL
// after they stop, whatever sent_at said.
func TestClockSkewFlaggedLivenessByReceiveTime(t *testing.T) {
	f := newLimitedFixture(t, func(cfg *Config) { cfg.Limits.MaxClockSkew = 5 * time.Second })
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	for _, tc := range []struct {
		name string
		off  time.Duration
	}{{"behind", -time.Hour}, {"ahead", time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			id := "skew-" + tc.name
			hb := heartbeat(id, "127.0.0.1:"+map[string]string{"behind": "1101", "ahead": "1102"}[tc.name], ready, 0)
			hb.SentAt = timestamppb.New(f.clock.Now().Add(tc.off))
			before := testutil.ToFloat64(f.m.skewed)
			f.send(hb)
			cv, _ := f.reg.View().Cell(id)
			if !cv.ClockSkewed || !cv.ClockSkewKnown || (cv.ClockSkew-tc.off).Abs() > time.Second {
				t.Fatalf("view: skewed %v known %v skew %v, want flagged at %v", cv.ClockSkewed, cv.ClockSkewKnown, cv.ClockSkew, tc.off)
			}
			if cv.State != lifecycle.Ready || f.clock.Since(cv.LastSeen).Abs() > time.Second {
				t.Fatalf("state %s last seen %v (now %v): want Ready, seen at receive time", cv.State, cv.LastSeen, f.clock.Now())
			}
			if got := testutil.ToFloat64(f.m.skewed); got != before+1 {
				t.Fatalf("skewed heartbeats = %v, want %v", got, before+1)
			}
			d := debugCell(cv, f.reg.cfg.Score)
			if !d.ClockSkewed || d.ClockSkewSeconds == nil || (*d.ClockSkewSeconds-tc.off.Seconds()) > 1 || (*d.ClockSkewSeconds-tc.off.Seconds()) < -1 {
				t.Fatalf("debug: %+v", d)
			}
			// Keep heartbeating (same skew) for two TTLs: still Ready.
			for start := f.clock.Now(); f.clock.Since(start) < 2*f.reg.cfg.TTL(); {
				hb := heartbeat(id, cv.Endpoint, ready, 0)
				hb.SentAt = timestamppb.New(f.clock.Now().Add(tc.off))
				f.send(hb)
				f.tick()
			}
			if cv, _ := f.reg.View().Cell(id); cv.State != lifecycle.Ready {
				t.Fatalf("after heartbeating with a skewed clock: %s, want ready", cv.State)
			}
			// Silence: Failed one TTL after the last receive time.
			last, _ := f.reg.View().Cell(id)
			f.waitView(func(v *View) bool { c, _ := v.Cell(id); return c.State == lifecycle.Failed })
			if waited := f.clock.Since(last.LastSeen); waited < f.reg.cfg.TTL() || waited > f.reg.cfg.TTL()+3*f.reg.cfg.CycleInterval {
				t.Fatalf("failed %v after the last heartbeat, want about the TTL %v", waited, f.reg.cfg.TTL())
			}
		})
	}
	// Within the bound (and without sent_at): not flagged.
	hb := heartbeat("in-sync", "127.0.0.1:1103", ready, 0)
	hb.SentAt = timestamppb.New(f.clock.Now().Add(-2 * time.Second))
	f.send(hb)
	if cv, _ := f.reg.View().Cell("in-sync"); cv.ClockSkewed || !cv.ClockSkewKnown {
		t.Fatalf("2 s skew: %+v", cv)
	}
	f.send(heartbeat("no-time", "127.0.0.1:1104", ready, 0))
	if cv, _ := f.reg.View().Cell("no-time"); cv.ClockSkewed || cv.ClockSkewKnown {
		t.Fatalf("no sent_at: %+v", cv)
	}
}

// The debug endpoint shows the flag over HTTP.
func TestDebugShowsClockSkew(t *testing.T) {
	c, _ := startController(t, nil)
	cl := dialController(t, c.Addr(), nil)
	s := openStream(t, cl)
	hb := heartbeat("skewed", "127.0.0.1:3201", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
	hb.SentAt = timestamppb.New(time.Now().Add(time.Hour))
	if err := s.Send(hb); err != nil {
		t.Fatal(err)
	}
	if ack, err := s.Recv(); err != nil || ack.Error != "" {
		t.Fatalf("skewed heartbeat refused: %v, %v", ack, err)
	}
	waitCell(t, c, "skewed", nil)
	resp, err := http.Get("http://" + c.HTTPAddr() + "/debug/cells/skewed")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d CellDebug
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	if !d.ClockSkewed || d.ClockSkewSeconds == nil || *d.ClockSkewSeconds < 3500 {
		t.Fatalf("debug cell = %+v, want clock_skewed with about +3600 s", d)
	}
}

// Demand windows keyed by (data plane node, model) are capped.
func TestDemandKeysBounded(t *testing.T) {
	f := newLimitedFixture(t, func(cfg *Config) { cfg.Limits.MaxDemandKeys = 2 })
	for i, node := range []string{"gw-1", "gw-2", "gw-3"} {
		rep := &isobarpb.DataPlaneReport{
			Node: node, Region: "r1", IntervalSeconds: 1,
			Demand: []*isobarpb.ModelDemand{{Model: "m" + string(rune('1'+i)), Requests: 5}},
		}
		if err := f.reg.send(context.Background(), message{report: rep}); err != nil {
			t.Fatal(err)
		}
	}
	// The inbox is FIFO: once this heartbeat shows, the reports are in.
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	v := f.waitView(func(v *View) bool { return len(v.Demand) > 0 })
	if _, ok := v.Demand["m3"]; ok || len(v.Demand) != 2 {
		t.Fatalf("demand = %v, want m1 and m2 only", v.Demand)
	}
	if got := testutil.ToFloat64(f.m.reports.WithLabelValues("demand_overflow")); got != 1 {
		t.Fatalf("demand_overflow = %v, want 1", got)
	}
}

// Plan validity runs on the receiving region's clock: the leader's clock
// only grants a lifetime (valid_until - issued_at).
func TestPlanValidityOnReceiverClock(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		issued    time.Duration // leader's clock offset
		noIssued  bool
		life      time.Duration
		wantErr   error
		wantUntil time.Duration
	}{
		{"in sync", 0, false, 30 * time.Second, nil, 30 * time.Second},
		{"leader an hour behind", -time.Hour, false, 30 * time.Second, nil, 30 * time.Second},
		{"leader an hour ahead", time.Hour, false, 30 * time.Second, nil, 30 * time.Second},
		{"no lifetime", 0, false, -time.Second, ErrExpiredPlan, 0},
		{"lifetime beyond the cap", 0, false, maxPlanLifetime + time.Second, ErrInvalidPlan, 0},
		{"no issued_at, in the past", -time.Hour, true, 30 * time.Second, ErrExpiredPlan, 0},
		{"no issued_at, in the future", 0, true, 30 * time.Second, nil, 30 * time.Second},
		{"no issued_at, a century ahead", 0, true, 100 * 365 * 24 * time.Hour, ErrInvalidPlan, 0}, // found by FuzzPlanTable
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan(5, 1, now.Add(tc.issued))
			p.ValidUntil = timestamppb.New(now.Add(tc.issued + tc.life))
			if tc.noIssued {
				p.IssuedAt = nil
			}
			tbl, err := planTable(p, "b", nil, false, now, 5*time.Second)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("planTable = %v, want %v", err, tc.wantErr)
			}
			if err == nil && !tbl.ValidUntil.Equal(now.Add(tc.wantUntil)) {
				t.Fatalf("valid until %v, want %v", tbl.ValidUntil, now.Add(tc.wantUntil))
			}
		})
	}
}

// A plan is bounded in models, routes and ingress addresses.
func TestPlanShapeLimits(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		mut  func(*isobarpb.RoutingPlan)
	}{
		{"too many models", func(p *isobarpb.RoutingPlan) {
			for i := range summary.MaxModels {
				p.Plans = append(p.Plans, &isobarpb.ModelPlan{Model: fmt.Sprintf("m%d", i), IngressRegion: "b",
					Routes: []*isobarpb.Route{{Destination: "b", Fraction: 1}}})
			}
		}},
		{"too many ingress addresses", func(p *isobarpb.RoutingPlan) {
			for i := range summary.MaxRegions {
				p.Ingress = append(p.Ingress, &isobarpb.RegionIngress{Region: fmt.Sprintf("r%d", i), Address: "127.0.0.1:1"})
			}
		}},
		{"too many routes", func(p *isobarpb.RoutingPlan) {
			for range summary.MaxRegions {
				p.Plans[0].Routes = append(p.Plans[0].Routes, &isobarpb.Route{Destination: "b"})
			}
		}},
		{"long leader id", func(p *isobarpb.RoutingPlan) { p.LeaderId = strings.Repeat("g", maxLeaderIDLen+1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan(5, 1, now)
			tc.mut(p)
			if _, err := planTable(p, "b", nil, false, now, 5*time.Second); !errors.Is(err, ErrInvalidPlan) || !strings.Contains(err.Error(), "most") {
				t.Fatalf("planTable = %v, want ErrInvalidPlan naming the limit", err)
			}
		})
	}
}

// A data-plane window keeps at most maxWindowSamples samples, the newest,
// however many reports arrive within it.
func TestDataPlaneWindowBounded(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var w dpWindow
	for i := range 3 * maxWindowSamples {
		w.add(dpSample{at: t0.Add(time.Duration(i) * time.Microsecond), span: time.Second, requests: float64(i)}, 10*time.Second)
	}
	if len(w.samples) != maxWindowSamples {
		t.Fatalf("%d samples, want %d", len(w.samples), maxWindowSamples)
	}
	if last := w.samples[len(w.samples)-1].requests; last != 3*maxWindowSamples-1 {
		t.Fatalf("newest sample %v dropped", last)
	}
}
