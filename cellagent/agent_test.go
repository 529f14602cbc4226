package cellagent

import (
	"context"
	"errors"
	"math"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	stateReady      = isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	stateLoading    = isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING
	stateDraining   = isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING
	stateFailed     = isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED
	stateTerminated = isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED
)

// harness runs one agent on a fake clock against an httptest engine and
// dcgm-exporter and a fake registry, all on 127.0.0.1.
type harness struct {
	t     *testing.T
	clk   *clockwork.FakeClock
	eng   *fakeEngine
	dcgm  *fakeDCGM
	reg   *fakeRegistry
	prom  *prometheus.Registry
	agent *Agent
	cfg   Config
}

func newHarness(t *testing.T, mod func(h *harness, c *Config)) *harness {
	t.Helper()
	h := &harness{t: t}
	h.eng = newFakeEngine(t)
	h.eng.update(func(p *enginePage) {
		p.Waiting, p.Running, p.KV = 2, 7, 0.35
		p.observeTTFT(repeat(0.03, 500)...)
		p.respond("2xx", 500)
	})
	h.dcgm = newFakeDCGM(t, readFixture(t, "dcgm_2gpu.prom"))
	h.reg = newFakeRegistry(t)
	h.cfg = Config{
		CellID:         "us-east-1a-gpu1",
		Region:         "us-east-1",
		ControllerAddr: h.reg.addr,
		VLLMURL:        h.eng.metricsURL(),
		DCGMURL:        h.dcgm.metricsURL(),
		DCGMGPU:        "1",
		Interval:       500 * time.Millisecond,
		ScrapeTimeout:  5 * time.Second,
		BackoffMax:     time.Second,
	}
	if mod != nil {
		mod(h, &h.cfg)
	}
	h.clk = clockwork.NewFakeClockAt(time.Unix(1_700_000_000, 0))
	h.prom = prometheus.NewRegistry()
	a, err := NewAgent(h.cfg, Deps{Clock: h.clk, Logger: testLogger(t), Registerer: h.prom})
	if err != nil {
		t.Fatal(err)
	}
	h.agent = a
	t.Cleanup(a.Stop) // runs before the servers' cleanups
	return h
}

// block waits until n timers or tickers wait on the fake clock.
func (h *harness) block(n int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.clk.BlockUntilContext(ctx, n); err != nil {
		h.t.Fatalf("clock never had %d waiters", n)
	}
}

// start starts the agent and returns its first heartbeat. After the first
// scrape both loops wait on their phase timers; one interval fires both.
func (h *harness) start() *isobarpb.CellHeartbeat {
	h.t.Helper()
	if err := h.agent.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.block(2)
	h.clk.Advance(h.cfg.Interval)
	return h.reg.next(h.t)
}

// tick advances the clock by the current heartbeat interval once the scrape
// and heartbeat tickers are both in place.
func (h *harness) tick() {
	h.t.Helper()
	h.block(2)
	h.clk.Advance(h.agent.hb.currentInterval())
}

// tickScrape ticks and waits until that tick's scrape has been applied (a
// heartbeat of the same tick may have gone out before it).
func (h *harness) tickScrape() {
	h.t.Helper()
	h.tick()
	now := h.clk.Now()
	waitUntil(h.t, "scrape applied", func() bool { return !h.agent.Snapshot().LastScrape.Before(now) })
}

// waitUntil polls cond, failing after a real-time deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, 10*time.Second, what, cond)
}

func TestAgentHeartbeatsAtInterval(t *testing.T) {
	h := newHarness(t, nil)
	hb := h.start()
	u, _ := url.Parse(h.eng.URL)
	if hb.GetCellId() != "us-east-1a-gpu1" || hb.GetRegion() != "us-east-1" || hb.GetEndpoint() != u.Host {
		t.Errorf("identity = %q %q %q", hb.GetCellId(), hb.GetRegion(), hb.GetEndpoint())
	}
	if hb.GetState() != stateReady || !hb.GetVllm().GetOk() || !hb.GetDcgm().GetOk() {
		t.Fatalf("first heartbeat = %v", hb)
	}
	if c := hb.GetCapability(); c.GetModel() != "meta-llama/Llama-3.1-70B-Instruct" || c.GetMaxModelLen() != 8192 ||
		c.GetPrefillTokensPerS() != 0 || c.GetMaxNumSeqs() != 0 {
		t.Errorf("capability = %v (nothing declared)", c)
	}
	s := hb.GetSignals()
	if s.GetQueueDepth() != 2 || s.GetRunning() != 7 || s.GetKvCacheUsage() != 0.35 || s.GetGpuUtil() != 0.12 || s.GetTemperatureCelsius() != 38 {
		t.Errorf("signals = %v", s)
	}
	if hb.GetVllm().GetLastSuccess() == nil || hb.GetDcgm().GetLastSuccess() == nil {
		t.Error("last_success unset on healthy sources")
	}

	seq0, t0 := hb.GetSequence(), hb.GetSentAt().AsTime()
	for i := 1; i <= 4; i++ {
		h.tick()
		hb = h.reg.next(t)
		if hb.GetSequence() != seq0+uint64(i) {
			t.Fatalf("heartbeat %d: sequence %d, want %d", i, hb.GetSequence(), seq0+uint64(i))
		}
		if got, want := hb.GetSentAt().AsTime(), t0.Add(time.Duration(i)*h.cfg.Interval); !got.Equal(want) {
			t.Fatalf("heartbeat %d sent at %v, want %v", i, got.Sub(t0), want.Sub(t0))
		}
	}

	// Slow, partly failing traffic arrives; the window's deltas show it.
	h.eng.update(func(p *enginePage) {
		p.observeTTFT(repeat(0.6, 100)...)
		p.respond("2xx", 90)
		p.respond("5xx", 10)
	})
	h.tickScrape() // the scrape sees the traffic (the heartbeat may go first)
	h.reg.next(t)
	h.tickScrape()
	s = h.reg.next(t).GetSignals()
	if s.TtftP95Seconds == nil || !approx(*s.TtftP95Seconds, 0.5+0.25*95.0/100.0) {
		t.Errorf("ttft_p95 = %v, want %v", s.TtftP95Seconds, 0.5+0.25*95.0/100.0)
	}
	if s.ErrorRate == nil || !approx(*s.ErrorRate, 0.1) || s.GetWindowRequests() != 100 {
		t.Errorf("error_rate = %v over %v requests, want 0.1 over 100", s.ErrorRate, s.WindowRequests)
	}
	if s.RequestRate == nil || *s.RequestRate <= 0 {
		t.Errorf("request_rate = %v, want > 0", s.RequestRate)
	}
	if got := testutil.ToFloat64(h.agent.scr.m.heartbeatsSent); got < 7 {
		t.Errorf("heartbeats_sent_total = %v, want >= 7", got)
	}
}

func TestAgentEngineDeathIsImmediate(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	now := h.clk.Now()
	// Let the scrape round started by the first tick finish: a round that
	// straddles the death reports the failed metrics read first.
	waitUntil(t, "first tick's scrape applied", func() bool { return !h.agent.Snapshot().LastScrape.Before(now) })
	waitUntil(t, "engine watcher connected", h.agent.scr.watching.Load)
	h.eng.Close() // the engine dies: listener and connections closed

	// No clock advance: the closed connection alone triggers the probe.
	hb := h.reg.next(t)
	if hb.GetState() != stateFailed {
		t.Fatalf("state = %v (%s), want FAILED", hb.GetState(), hb.GetReason())
	}
	if !strings.Contains(hb.GetReason(), "unreachable") {
		t.Errorf("reason = %q, want an unreachable engine", hb.GetReason())
	}
	if !hb.GetSentAt().AsTime().Equal(now) {
		t.Errorf("sent at %v, want %v: the death must not wait for a tick", hb.GetSentAt().AsTime(), now)
	}
	if hb.GetVllm().GetOk() || hb.GetSignals().QueueDepth != nil {
		t.Errorf("vllm = %v, signals %v; want the source down and its signals gone", hb.GetVllm(), hb.GetSignals())
	}
	if !hb.GetDcgm().GetOk() {
		t.Error("dcgm reported down with the engine")
	}
	ev := testutil.ToFloat64(h.agent.scr.m.engineEvents.WithLabelValues("closed")) +
		testutil.ToFloat64(h.agent.scr.m.engineEvents.WithLabelValues("reset"))
	if ev != 1 {
		t.Errorf("engine watch events = %v, want 1", ev)
	}
	if snap := h.agent.Snapshot(); snap.State != stateFailed {
		t.Errorf("snapshot state = %v", snap.State)
	}
}

func TestAgentDCGMDownNextHeartbeat(t *testing.T) {
	h := newHarness(t, nil)
	if hb := h.start(); !hb.GetDcgm().GetOk() || !hasHardware(hb.GetSignals()) {
		t.Fatalf("first heartbeat without DCGM: %v", hb)
	}
	h.dcgm.Close()
	closedAt := h.clk.Now()
	h.tickScrape()
	hb := h.reg.next(t)
	if hb.GetDcgm().GetOk() {
		// The tick's own heartbeat may leave before its scrape fails; the
		// failure then sends one at once, without waiting for a tick.
		hb = h.reg.next(t)
	}
	if hb.GetDcgm().GetOk() {
		t.Fatal("dcgm still ok in the heartbeat after a failed scrape")
	}
	// A scrape still pending at the close may fail before the tick: the
	// failure then leaves at once, at the close's instant. Either way it
	// is reported no later than the failing tick, never a tick after.
	if at := hb.GetSentAt().AsTime(); at.Before(closedAt) || at.After(h.clk.Now()) {
		t.Errorf("dcgm failure reported at %v, want between the close (%v) and the failing tick (%v)", at, closedAt, h.clk.Now())
	}
	if hasHardware(hb.GetSignals()) {
		t.Fatalf("hardware signals sent with dcgm down: %v", hb.GetSignals())
	}
	if hb.GetDcgm().GetError() == "" || hb.GetDcgm().GetLastSuccess() == nil {
		t.Errorf("dcgm = %v, want a reason and the last success", hb.GetDcgm())
	}
	if hb.GetState() != stateReady || !hb.GetVllm().GetOk() || hb.GetSignals().QueueDepth == nil {
		t.Errorf("engine side affected by the exporter: %v", hb)
	}
	if up := testutil.ToFloat64(h.agent.scr.m.sourceUp.WithLabelValues("dcgm")); up != 0 {
		t.Errorf("source_up{dcgm} = %v", up)
	}
}

func TestAgentReconnectsWithBackoff(t *testing.T) {
	h := newHarness(t, nil)
	first := h.start()
	h.reg.stop()
	waitUntil(t, "reconnect attempt", func() bool { return testutil.ToFloat64(h.agent.scr.m.reconnects) >= 1 })
	if !h.reg.none() {
		t.Fatalf("heartbeats queued besides the first: %d", len(h.reg.hbs))
	}
	h.reg.restart()
	deadline := time.After(20 * time.Second)
	var hb *isobarpb.CellHeartbeat
	for hb == nil {
		select {
		case hb = <-h.reg.hbs:
		case <-time.After(20 * time.Millisecond):
			h.clk.Advance(h.cfg.BackoffMax) // covers any backoff draw
		case <-deadline:
			t.Fatal("no heartbeat after the controller came back")
		}
	}
	if hb.GetIncarnation() != first.GetIncarnation() || hb.GetSequence() <= first.GetSequence() {
		t.Errorf("after reconnect: incarnation %q seq %d; before %q seq %d",
			hb.GetIncarnation(), hb.GetSequence(), first.GetIncarnation(), first.GetSequence())
	}
	if n := h.reg.streams.Load(); n < 2 {
		t.Errorf("streams = %d, want a new one", n)
	}
}

func TestAgentDrainRefusalAndInterval(t *testing.T) {
	h := newHarness(t, nil)
	h.start()

	h.reg.acks <- &isobarpb.HeartbeatAck{Commands: []isobarpb.Command{isobarpb.Command_COMMAND_DRAIN}}
	if hb := h.reg.next(t); hb.GetState() != stateDraining || hb.GetReason() == "" {
		t.Fatalf("after DRAIN: %v %q", hb.GetState(), hb.GetReason())
	}
	h.reg.acks <- &isobarpb.HeartbeatAck{Commands: []isobarpb.Command{isobarpb.Command_COMMAND_UNDRAIN}}
	if hb := h.reg.next(t); hb.GetState() != stateReady {
		t.Fatalf("after UNDRAIN: %v", hb.GetState())
	}

	h.reg.acks <- &isobarpb.HeartbeatAck{Error: "certificate identity does not match cell id"}
	waitUntil(t, "refusal counted", func() bool { return testutil.ToFloat64(h.agent.scr.m.refused) == 1 })

	// A new interval and a drain in one ack: the drain's heartbeat already
	// runs on the new schedule.
	h.reg.acks <- &isobarpb.HeartbeatAck{
		Interval: durationpb.New(time.Second),
		Commands: []isobarpb.Command{isobarpb.Command_COMMAND_DRAIN},
	}
	hb := h.reg.next(t)
	if hb.GetState() != stateDraining {
		t.Fatalf("state = %v", hb.GetState())
	}
	t1 := hb.GetSentAt().AsTime()
	h.block(2)
	h.clk.Advance(500 * time.Millisecond)
	h.block(2)
	h.clk.Advance(500 * time.Millisecond)
	hb = h.reg.next(t)
	if got := hb.GetSentAt().AsTime().Sub(t1); got != time.Second {
		t.Fatalf("next heartbeat %v after the change, want 1s", got)
	}
	if iv := h.agent.Snapshot().Interval; iv != time.Second {
		t.Errorf("interval = %v", iv)
	}

	// An absurd interval is clamped, not adopted.
	h.reg.acks <- &isobarpb.HeartbeatAck{Interval: durationpb.New(time.Nanosecond)}
	waitUntil(t, "interval clamped", func() bool { return h.agent.hb.currentInterval() == MinInterval })
}

func TestAgentStopSendsTerminated(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.agent.Stop()
	hb := h.reg.next(t)
	if hb.GetState() != stateTerminated || hb.GetReason() != "agent stopped" {
		t.Fatalf("final heartbeat = %v %q", hb.GetState(), hb.GetReason())
	}
	if n := h.reg.eofs.Load(); n != 1 {
		t.Errorf("stream half-closes seen = %d, want 1", n)
	}
	h.agent.Stop() // idempotent
	if err := h.agent.Start(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("Start after Stop = %v, want ErrStopped", err)
	}
}

// TestAgentStopWithUnresponsiveController: a controller that never ends the
// stream cannot hold Stop beyond ShutdownTimeout.
func TestAgentStopWithUnresponsiveController(t *testing.T) {
	h := newHarness(t, func(h *harness, c *Config) { c.ShutdownTimeout = 200 * time.Millisecond })
	h.start()
	h.reg.holdOpen.Store(true)
	stopped := make(chan struct{})
	go func() {
		h.agent.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop hung on a controller that keeps the stream open")
	}
	if hb := h.reg.next(t); hb.GetState() != stateTerminated {
		t.Errorf("final heartbeat state = %v", hb.GetState())
	}
}

func TestAgentStopWhileDisconnected(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.reg.stop()
	waitUntil(t, "reconnect attempt", func() bool { return testutil.ToFloat64(h.agent.scr.m.reconnects) >= 1 })
	h.reg.restart()
	// Stop during the backoff: the final heartbeat goes on a fresh stream.
	h.agent.Stop()
	hb := h.reg.nextMatching(t, "TERMINATED", func(hb *isobarpb.CellHeartbeat) bool { return hb.GetState() == stateTerminated })
	if hb.GetReason() != "agent stopped" {
		t.Errorf("reason = %q", hb.GetReason())
	}
}

func TestAgentPauseGoesSilent(t *testing.T) {
	h := newHarness(t, nil)
	hb := h.start()
	h.agent.Pause(true)
	for range 3 {
		h.tick()
	}
	h.agent.Pause(false)
	next := h.reg.next(t)
	if next.GetSequence() != hb.GetSequence()+1 || !next.GetSentAt().AsTime().Equal(h.clk.Now()) {
		t.Fatalf("after pause: seq %d at %v; want seq %d at %v (nothing sent while paused)",
			next.GetSequence(), next.GetSentAt().AsTime(), hb.GetSequence()+1, h.clk.Now())
	}
}

func TestAgentLoadingThenReadyAndInvalidValues(t *testing.T) {
	h := newHarness(t, func(h *harness, c *Config) {
		h.eng.setHealth(503)
		h.eng.update(func(p *enginePage) { p.KVRaw = "NaN" })
	})
	hb := h.start()
	if hb.GetState() != stateLoading || !strings.Contains(hb.GetReason(), "503") {
		t.Fatalf("state = %v %q, want LOADING with the health status", hb.GetState(), hb.GetReason())
	}
	if hb.GetSignals().KvCacheUsage != nil || !hb.GetVllm().GetOk() || !strings.Contains(hb.GetVllm().GetError(), "NaN") {
		t.Errorf("NaN kv: signals %v vllm %v; want kv dropped, source ok, reason naming it", hb.GetSignals(), hb.GetVllm())
	}
	if n := testutil.ToFloat64(h.agent.scr.m.invalidValues.WithLabelValues("vllm")); n < 1 {
		t.Errorf("invalid_values_total{vllm} = %v", n)
	}
	h.eng.setHealth(200)
	for hb.GetState() != stateReady {
		h.tickScrape()
		hb = h.reg.next(t)
	}
	if hb.GetReason() != "" {
		t.Errorf("READY with reason %q", hb.GetReason())
	}
}

// TestAgentStartupGrace: an engine that never came up is LOADING during the
// grace, FAILED after it.
func TestAgentStartupGrace(t *testing.T) {
	h := newHarness(t, func(h *harness, c *Config) {
		h.eng.Close()
		c.StartupGrace = 2 * time.Second
	})
	hb := h.start()
	if hb.GetState() != stateLoading || !strings.Contains(hb.GetReason(), "startup grace") {
		t.Fatalf("state = %v %q, want LOADING in the grace", hb.GetState(), hb.GetReason())
	}
	for hb.GetState() == stateLoading {
		if h.clk.Since(time.Unix(1_700_000_000, 0)) > 3*time.Second {
			t.Fatal("still LOADING past the grace")
		}
		h.tickScrape()
		hb = h.reg.next(t)
	}
	if hb.GetState() != stateFailed {
		t.Fatalf("state after the grace = %v", hb.GetState())
	}
	if d := hb.GetSentAt().AsTime().Sub(time.Unix(1_700_000_000, 0)); d < 2*time.Second {
		t.Fatalf("FAILED after %v, before the 2s grace ended", d)
	}
}

func TestAgentCounterResetCounted(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.eng.update(func(p *enginePage) { *p = enginePage{Waiting: 1} }) // engine restarted
	h.tickScrape()
	if n := testutil.ToFloat64(h.agent.scr.m.windowRestarts); n != 1 {
		t.Fatalf("window restarts = %v, want 1", n)
	}
}

// TestStaleProbeIgnored: a /health result that started before the one
// recorded (a scrape round finishing after the watcher's probe) is dropped.
func TestStaleProbeIgnored(t *testing.T) {
	a, err := NewAgent(Config{CellID: "c", Region: "r", ControllerAddr: "127.0.0.1:1", VLLMURL: "http://127.0.0.1:1/metrics"},
		Deps{Clock: clockwork.NewFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	a.scr.mu.Lock()
	defer a.scr.mu.Unlock()
	a.scr.applyHealthLocked(engineProbe{phase: phaseDown, reason: "engine unreachable: connection refused", seq: 2})
	a.scr.applyHealthLocked(engineProbe{phase: phaseUp, seq: 1})
	a.scr.recomputeLocked()
	if a.scr.st.lifecycle != stateFailed {
		t.Fatalf("state = %v: an older probe overwrote a newer one", a.scr.st.lifecycle)
	}
	a.scr.applyHealthLocked(engineProbe{phase: phaseUp, seq: 3})
	a.scr.recomputeLocked()
	if a.scr.st.lifecycle != stateReady {
		t.Fatalf("state = %v after a newer healthy probe", a.scr.st.lifecycle)
	}
}

func TestAgentStartTwice(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	if err := h.agent.Start(context.Background()); !errors.Is(err, ErrAlreadyStarted) {
		t.Fatalf("second Start = %v", err)
	}
}

func TestAgentMetricsLint(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	problems, err := testutil.GatherAndLint(h.prom)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	if n, err := testutil.GatherAndCount(h.prom, "isobar_cellagent_scrapes_total"); err != nil || n < 4 {
		t.Errorf("scrapes_total series = %d, %v; want one per source and result", n, err)
	}
}

func TestNewAgentConfigErrors(t *testing.T) {
	good := Config{CellID: "c1", Region: "r", ControllerAddr: "127.0.0.1:1", VLLMURL: "http://127.0.0.1:8000/metrics"}
	tests := []struct {
		name  string
		mod   func(c *Config)
		field string
	}{
		{"no cell id", func(c *Config) { c.CellID = "" }, "CellID"},
		{"bad cell id", func(c *Config) { c.CellID = "gpu 0" }, "CellID"},
		{"long cell id", func(c *Config) { c.CellID = strings.Repeat("a", 129) }, "CellID"},
		{"no region", func(c *Config) { c.Region = "" }, "Region"},
		{"no controller", func(c *Config) { c.ControllerAddr = "" }, "ControllerAddr"},
		{"controller without port", func(c *Config) { c.ControllerAddr = "127.0.0.1" }, "ControllerAddr"},
		{"no vllm url", func(c *Config) { c.VLLMURL = "" }, "VLLMURL"},
		{"vllm url without scheme", func(c *Config) { c.VLLMURL = "127.0.0.1:8000/metrics" }, "VLLMURL"},
		{"dcgm and nvml", func(c *Config) { c.DCGMURL = "http://127.0.0.1:9400/metrics"; c.NVML = true }, "DCGMURL"},
		{"bad gpu selector", func(c *Config) { c.DCGMGPU = "first" }, "DCGMGPU"},
		{"interval too short", func(c *Config) { c.Interval = time.Millisecond }, "Interval"},
		{"interval too long", func(c *Config) { c.Interval = time.Hour }, "Interval"},
		{"tiny body cap", func(c *Config) { c.MaxBodyBytes = 10 }, "MaxBodyBytes"},
		{"bad advertise", func(c *Config) { c.Advertise = "no-port" }, "Advertise"},
		{"tls cert only", func(c *Config) { c.TLS.Cert = "c.pem" }, "TLS.Key"},
		{"tls without ca", func(c *Config) { c.TLS = TLSFiles{Cert: "c.pem", Key: "k.pem"} }, "TLS.CA"},
		{"tls key only", func(c *Config) { c.TLS = TLSFiles{Key: "k.pem", CA: "ca.pem"} }, "TLS.Cert"},
		{"negative grace", func(c *Config) { c.StartupGrace = -time.Second }, "StartupGrace"},
		{"negative prefill rate", func(c *Config) { c.PrefillTokensPerSecond = -1 }, "PrefillTokensPerSecond"},
		{"NaN prefill rate", func(c *Config) { c.PrefillTokensPerSecond = math.NaN() }, "PrefillTokensPerSecond"},
		{"absurd prefill rate", func(c *Config) { c.PrefillTokensPerSecond = 2 * MaxPrefillTokensPerSecond }, "PrefillTokensPerSecond"},
		{"absurd batch cap", func(c *Config) { c.MaxNumSeqs = MaxMaxNumSeqs + 1 }, "MaxNumSeqs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mod(&c)
			_, err := NewAgent(c, Deps{})
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("error = %v, want a FieldError on %s", err, tc.field)
			}
		})
	}
	if _, err := NewAgent(good, Deps{}); err != nil {
		t.Fatalf("good config: %v", err)
	}
	if !NVMLSupported {
		c := good
		c.NVML = true
		if _, err := NewAgent(c, Deps{}); !errors.Is(err, ErrNoNVML) {
			t.Errorf("NVML without the tag: %v, want ErrNoNVML", err)
		}
	}
	c := good
	c.TLS = TLSFiles{Cert: "testdata/missing.pem", Key: "testdata/missing.pem", CA: "testdata/missing.pem"}
	if _, err := NewAgent(c, Deps{}); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("missing TLS files: %v", err)
	}
}

// TestAdvertiseDefault: the endpoint defaults to the metrics URL's host:port.
func TestAdvertiseDefault(t *testing.T) {
	for in, want := range map[string]string{
		"http://10.0.0.5:8000/metrics": "10.0.0.5:8000",
		"http://vllm/metrics":          "vllm:80",
		"https://[::1]/metrics":        "[::1]:443",
	} {
		c := Config{VLLMURL: in}.withDefaults()
		if c.Advertise != want {
			t.Errorf("%s: advertise %q, want %q", in, c.Advertise, want)
		}
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}

// The capacity declared in the configuration rides in every heartbeat's
// capability, beside what /v1/models says.
func TestAgentHeartbeatCarriesDeclaredCapacity(t *testing.T) {
	h := newHarness(t, func(_ *harness, c *Config) { c.PrefillTokensPerSecond, c.MaxNumSeqs = 30000, 12 })
	hb := h.start()
	if c := hb.GetCapability(); c.GetPrefillTokensPerS() != 30000 || c.GetMaxNumSeqs() != 12 || c.GetMaxModelLen() != 8192 {
		t.Errorf("capability = %v, want 30000 tokens/s, 12 sequences and max_model_len 8192", c)
	}
}
