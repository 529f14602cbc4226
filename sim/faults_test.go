package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

func TestKillClosesConnectionsAndRestartStartsFresh(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cfg := tinyConfig()
	cfg.TimeScale = 10 // 20 ms steps: requests stay in flight
	e := startEngine(t, cfg, Deps{Registerer: reg})
	c := newClient(t)
	addr := e.Addr()
	post(t, c, url(e, "/v1/completions"), `{"prompt":"abcd","max_tokens":2}`)

	// A streaming request in flight, and a non-streaming one.
	req, _ := http.NewRequest(http.MethodPost, url(e, "/v1/completions"), strings.NewReader(`{"prompt":"abcd","max_tokens":4000,"stream":true}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := sseEvents(resp.Body)
	if ev := <-events; !strings.Contains(ev, `"text"`) {
		t.Fatalf("first event %q", ev)
	}
	plain := make(chan error, 1)
	go func() {
		r, err := c.Post(url(e, "/v1/completions"), "application/json", strings.NewReader(`{"prompt":"abcd","max_tokens":3000}`))
		if err == nil {
			_, err = io.ReadAll(r.Body)
			r.Body.Close()
			if err == nil {
				err = fmt.Errorf("got a complete response with status %d", r.StatusCode)
			}
		}
		plain <- err
	}()
	eventually.True(t, pollTimeout, "two requests running", func() bool { return e.Stats().Running == 2 })

	e.Kill()
	if e.State() != StateKilled {
		t.Fatalf("state %v after kill", e.State())
	}
	if err := <-plain; err == nil {
		t.Fatal("in-flight request survived the kill")
	}
	var last string
	for ev := range events {
		last = ev
	}
	if last == "[DONE]" {
		t.Fatal("stream ended cleanly after a kill")
	}
	if _, err := c.Get("http://" + addr + "/health"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("health after kill: %v, want connection refused", err)
	}
	if got := testutil.ToFloat64(e.m.kills); got != 1 {
		t.Fatalf("kills counter = %v", got)
	}

	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	if e.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", e.Addr(), addr)
	}
	mfs := scrape(t, c, url(e, "/metrics"))
	if v, _ := metricValue(mfs, "vllm:generation_tokens_total", nil); v != 0 {
		t.Fatalf("generation tokens after restart = %v, want 0 (fresh process)", v)
	}
	if _, ok := mfs["http_requests_total"]; ok {
		t.Fatal("http_requests_total survived the restart")
	}
	resp2, body := post(t, c, url(e, "/v1/completions"), `{"prompt":"abcd","max_tokens":2}`)
	if resp2.StatusCode != 200 {
		t.Fatalf("after restart: %d %s", resp2.StatusCode, body)
	}
	if got := testutil.ToFloat64(e.m.restarts); got != 1 {
		t.Fatalf("restarts counter = %v", got)
	}
}

func TestHangFreezesEngine(t *testing.T) {
	t.Parallel()
	fc := clockwork.NewFakeClock()
	e := startEngine(t, tinyConfig(), Deps{Clock: fc})
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A stream in flight: one token out.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url(e, "/v1/completions"), strings.NewReader(`{"prompt":"abcd","max_tokens":5,"stream":true}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := sseEvents(resp.Body)
	if err := fc.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Second)
	<-events

	// Hang while the second step is under way: the scheduler finishes it,
	// then freezes.
	if err := fc.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	e.Hang(true)
	fc.Advance(time.Second)
	<-events
	frozen := e.Stats().GeneratedTokens
	health := make(chan int, 1)
	go func() {
		r, err := c.Get(url(e, "/health"))
		if err != nil {
			health <- -1
			return
		}
		r.Body.Close()
		health <- r.StatusCode
	}()
	in := e.current()
	eventually.True(t, pollTimeout, "health request held by the hang", func() bool { return in.hangWaiting.Load() == 1 })
	fc.Advance(time.Hour)
	if got := e.Stats().GeneratedTokens; got != frozen {
		t.Fatalf("hung engine produced tokens: %d -> %d", frozen, got)
	}
	select {
	case code := <-health:
		t.Fatalf("health answered %d while hung", code)
	default:
	}
	if s := e.GPU().GPUSample(); s.UtilPct != 100 {
		t.Fatalf("hung GPU util = %v", s.UtilPct)
	}
	if !hasFault(e.Faults(), FaultHang) || e.Ready() {
		t.Fatalf("faults %+v ready %v", e.Faults(), e.Ready())
	}

	e.Hang(false)
	if code := <-health; code != 200 {
		t.Fatalf("health after hang = %d", code)
	}
	for range 3 {
		if err := fc.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		fc.Advance(time.Second)
	}
	var last string
	for ev := range events {
		last = ev
	}
	if last != "[DONE]" {
		t.Fatalf("stream after thaw ended with %q", last)
	}
}

func TestKillEndsHang(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	e.Hang(true)
	health := make(chan error, 1)
	go func() {
		r, err := c.Get(url(e, "/health"))
		if err == nil {
			r.Body.Close()
		}
		health <- err
	}()
	in := e.current()
	eventually.True(t, pollTimeout, "health request held by the hang", func() bool { return in.hangWaiting.Load() == 1 })
	e.Kill()
	if err := <-health; err == nil {
		t.Fatal("held request answered after the kill")
	}
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, c, url(e, "/health")); resp.StatusCode != 200 {
		t.Fatalf("health after restart = %d (hang should not survive a kill)", resp.StatusCode)
	}
}

func hasFault(fs []FaultStatus, name string) bool {
	for _, f := range fs {
		if f.Fault == name {
			return true
		}
	}
	return false
}

func TestSlowStart(t *testing.T) {
	t.Parallel()
	fc := clockwork.NewFakeClock()
	cfg := tinyConfig()
	cfg.StartupDelay = 30 * time.Second
	e := startEngine(t, cfg, Deps{Clock: fc})
	c := newClient(t)
	check := func(wantHealth, wantAPI int) {
		t.Helper()
		if resp, _ := get(t, c, url(e, "/health")); resp.StatusCode != wantHealth {
			t.Fatalf("health = %d, want %d", resp.StatusCode, wantHealth)
		}
		if resp, body := get(t, c, url(e, "/v1/models")); resp.StatusCode != wantAPI {
			t.Fatalf("models = %d %s, want %d", resp.StatusCode, body, wantAPI)
		}
	}
	check(503, 503)
	if resp, body := post(t, c, url(e, "/v1/completions"), `{"prompt":"a","max_tokens":1}`); resp.StatusCode != 503 || !strings.Contains(string(body), "ServiceUnavailableError") {
		t.Fatalf("completion while loading = %d %s", resp.StatusCode, body)
	}
	if fb := e.GPU().GPUSample().FBUsedMiB; fb >= 0.9*81920 {
		t.Fatalf("FB used %v while loading, want less than the ready preallocation", fb)
	}
	fc.Advance(30 * time.Second)
	check(200, 200)

	e.SlowStart(10 * time.Second)
	check(503, 503)
	if !hasFault(e.Faults(), FaultSlowStart) {
		t.Fatalf("faults %+v", e.Faults())
	}
	fc.Advance(10 * time.Second)
	check(200, 200)

	e.Kill()
	if err := e.RestartLoading(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	check(503, 503)
	fc.Advance(5 * time.Second)
	check(200, 200)
}

func TestErrorInjection(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	e.SetErrorRate(1, 503)
	resp, body := post(t, c, url(e, "/v1/completions"), `{"prompt":"a","max_tokens":1}`)
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"object":"error"`) {
		t.Fatalf("with rate 1: %d %s", resp.StatusCode, body)
	}
	e.SetErrorRate(0.5, 0)
	failed := 0
	const n = 200
	for range n {
		resp, _ := post(t, c, url(e, "/v1/chat/completions"), `{"messages":[{"role":"user","content":"a"}],"max_tokens":1}`)
		switch resp.StatusCode {
		case 500:
			failed++
		case 200:
		default:
			t.Fatalf("unexpected status %d", resp.StatusCode)
		}
	}
	if failed < 70 || failed > 130 {
		t.Fatalf("%d of %d failed at rate 0.5", failed, n)
	}
	if got := testutil.ToFloat64(e.m.injectedErrors); got != float64(failed+1) {
		t.Fatalf("injected errors counter = %v, want %d", got, failed+1)
	}
	mfs := scrape(t, c, url(e, "/metrics"))
	if v, _ := metricValue(mfs, "http_requests_total", map[string]string{"handler": "/v1/chat/completions", "status": "5xx"}); v != float64(failed) {
		t.Fatalf("http_requests_total 5xx = %v, want %d", v, failed)
	}
	e.ClearFaults()
	if resp, _ := post(t, c, url(e, "/v1/completions"), `{"prompt":"a","max_tokens":1}`); resp.StatusCode != 200 {
		t.Fatalf("after clear: %d", resp.StatusCode)
	}
}

func TestMaxModelLenFault(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	prompt := `{"prompt":"` + strings.Repeat("z", 4000) + `"}` // 1000 tokens + 128
	if resp, body := post(t, c, url(e, "/v1/completions"), prompt); resp.StatusCode != 200 {
		t.Fatalf("before fault: %d %s", resp.StatusCode, body)
	}
	advertised := func() float64 {
		_, body := get(t, c, url(e, "/v1/models"))
		m := decode[modelList](t, body)
		return float64(m.Data[0].MaxModelLen)
	}
	e.SetMaxModelLen(1024, false)
	resp, body := post(t, c, url(e, "/v1/completions"), prompt)
	if resp.StatusCode != 400 || !strings.Contains(string(body), "maximum context length is 1024 tokens. However, you requested 1128 tokens (1000 in the messages, 128 in the completion)") {
		t.Fatalf("with fault: %d %s", resp.StatusCode, body)
	}
	if a := advertised(); a != 4096 {
		t.Fatalf("undeclared constraint advertised %v, want the original 4096", a)
	}
	e.SetMaxModelLen(1024, true)
	if a := advertised(); a != 1024 {
		t.Fatalf("declared constraint advertised %v", a)
	}
	e.ClearFaults()
	if a := advertised(); a != 4096 {
		t.Fatalf("after clear advertised %v", a)
	}
}

// TestThrottleMovesHardwareBeforeLatency measures step times exactly with a
// fake clock: before the lead time a request's single step takes d0, after
// it 2·d0 (severity 1 halves the SM clock), while the DCGM fields move at
// once.
func TestThrottleMovesHardwareBeforeLatency(t *testing.T) {
	t.Parallel()
	fc := clockwork.NewFakeClock()
	e := startEngine(t, tinyConfig(), Deps{Clock: fc})
	x := NewDCGMExporter(DCGMConfig{}, Deps{Logger: testLogger(t)}, e.GPU())
	if err := x.Start(listenLoopback(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Stop(context.Background()) })
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := e.Profile()
	d0 := p.StepBase + time.Duration(float64(time.Second)/p.PrefillTokensPerSec) // 1-token prompt, first token

	// oneToken sends a 1-token request and advances the clock in steps of d0
	// until it completes; it returns how many d0 it took.
	oneToken := func() int {
		done := make(chan int, 1)
		go func() {
			r, err := c.Post(url(e, "/v1/completions"), "application/json", strings.NewReader(`{"prompt":"a","max_tokens":1}`))
			if err != nil {
				done <- -1
				return
			}
			r.Body.Close()
			done <- r.StatusCode
		}()
		if err := fc.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		for k := 1; k <= 10; k++ {
			fc.Advance(d0)
			if fc.BlockUntilContext(ctxDone(), 1) != nil { // timer fired
				if code := <-done; code != 200 {
					t.Fatalf("status %d", code)
				}
				return k
			}
		}
		t.Fatal("request did not finish within 10 steps")
		return 0
	}
	dcgmField := func(name string) float64 {
		v, ok := metricValue(scrape(t, c, "http://"+x.Addr()+"/metrics"), name, map[string]string{"gpu": "0"})
		if !ok {
			t.Fatalf("%s missing", name)
		}
		return v
	}

	if k := oneToken(); k != 1 {
		t.Fatalf("unthrottled step took %d·d0", k)
	}
	// Keep the GPU busy as under load, so that its clock is the boost clock.
	busy := func() {
		now := fc.Now()
		e.GPU().RecordStep(now.Add(-2*time.Second), now, StepLoad{Batch: 8, Tokens: 8})
	}
	busy()
	clockBefore, tempBefore := dcgmField("DCGM_FI_DEV_SM_CLOCK"), dcgmField("DCGM_FI_DEV_GPU_TEMP")
	e.Throttle(1, 10*time.Second)
	if reasons := uint64(dcgmField("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")); reasons&ThrottleHWThermal == 0 || reasons&ThrottleHWSlowdown == 0 {
		t.Fatalf("throttle reasons %#x right after the fault", reasons)
	}
	busy()
	if clk := dcgmField("DCGM_FI_DEV_SM_CLOCK"); clk >= clockBefore {
		t.Fatalf("SM clock %v did not drop from %v", clk, clockBefore)
	}
	if k := oneToken(); k != 1 {
		t.Fatalf("step within the lead time took %d·d0, want 1 (latency must lag the hardware)", k)
	}
	fc.Advance(10 * time.Second)
	if temp := dcgmField("DCGM_FI_DEV_GPU_TEMP"); temp <= tempBefore {
		t.Fatalf("temperature %v did not climb from %v", temp, tempBefore)
	}
	if k := oneToken(); k != 2 {
		t.Fatalf("step after the lead took %d·d0, want 2", k)
	}
}

// ctxDone returns an already cancelled context: BlockUntilContext with it
// reports at once whether the clock has a waiter.
func ctxDone() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func TestDCGMExporter(t *testing.T) {
	t.Parallel()
	fc := clockwork.NewFakeClock()
	var gpus []GPUSource
	for i := range 3 {
		g, err := NewGPU(GPUConfig{Info: GPUInfo{Index: i}}, fc)
		if err != nil {
			t.Fatal(err)
		}
		gpus = append(gpus, g)
	}
	x := NewDCGMExporter(DCGMConfig{Hostname: "node-a"}, Deps{Logger: testLogger(t)}, gpus...)
	if err := x.Start(listenLoopback(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Stop(context.Background()) })
	c := newClient(t)
	mfs := scrape(t, c, "http://"+x.Addr()+"/metrics")
	for _, f := range dcgmFields {
		mf, ok := mfs[f.name]
		if !ok {
			t.Errorf("missing %s", f.name)
			continue
		}
		if len(mf.GetMetric()) != 3 {
			t.Errorf("%s: %d series, want 3", f.name, len(mf.GetMetric()))
		}
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			for _, k := range dcgmLabels {
				if l[k] == "" {
					t.Errorf("%s: label %s missing in %v", f.name, k, l)
				}
			}
			if l["Hostname"] != "node-a" || l["DCGM_FI_DRIVER_VERSION"] != DefaultDCGMDriverVersion || l["device"] != "nvidia"+l["gpu"] {
				t.Errorf("%s labels %v", f.name, l)
			}
		}
	}
	if v, _ := metricValue(mfs, "DCGM_FI_DEV_FB_FREE", map[string]string{"gpu": "1"}); v < 80000 {
		t.Errorf("idle GPU FB free = %v", v)
	}

	addr := x.Addr()
	if err := x.SetDown(true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("http://" + addr + "/metrics"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("scrape while down: %v, want connection refused", err)
	}
	if err := x.SetDown(false); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, c, "http://"+addr+"/metrics"); resp.StatusCode != 200 {
		t.Fatalf("scrape after up: %d", resp.StatusCode)
	}
}

func adminDo(t *testing.T, c *http.Client, srvURL, method, token, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, srvURL+"/admin/faults", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

const testToken = "s3cret-token-0123456789"

func TestAdminAuth(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := startEngine(t, tinyConfig(), Deps{})
	a, err := NewAdminHandler(AdminConfig{Token: testToken}, Deps{Registerer: reg, Logger: testLogger(t)}, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	c := newClient(t)

	resp, body := adminDo(t, c, srv.URL, http.MethodGet, "", "")
	if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" || !strings.Contains(string(body), `"object":"error"`) {
		t.Fatalf("no token: %d %s", resp.StatusCode, body)
	}
	resp, body = adminDo(t, c, srv.URL, http.MethodPost, "wrong-token-0123456789", `{"fault":"kill"}`)
	if resp.StatusCode != 403 || e.State() != StateRunning {
		t.Fatalf("wrong token: %d %s, engine %v", resp.StatusCode, body, e.State())
	}
	if got := testutil.ToFloat64(a.m.authFailures.WithLabelValues("missing")); got != 1 {
		t.Fatalf("missing counter = %v", got)
	}
	if got := testutil.ToFloat64(a.m.authFailures.WithLabelValues("invalid")); got != 1 {
		t.Fatalf("invalid counter = %v", got)
	}
	resp, body = adminDo(t, c, srv.URL, http.MethodGet, testToken, "")
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"state":"running"`) {
		t.Fatalf("good token: %d %s", resp.StatusCode, body)
	}
	if _, err := NewAdminHandler(AdminConfig{Token: "short"}, Deps{}, e, nil); err == nil {
		t.Fatal("short token accepted")
	}
}

func TestAdminAppliesFaults(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	x := NewDCGMExporter(DCGMConfig{}, Deps{Logger: testLogger(t)}, e.GPU())
	if err := x.Start(listenLoopback(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Stop(context.Background()) })
	a, err := NewAdminHandler(AdminConfig{Token: testToken}, Deps{Logger: testLogger(t)}, e, x)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	c := newClient(t)
	apply := func(body string, wantStatus int) FaultsResponse {
		t.Helper()
		resp, b := adminDo(t, c, srv.URL, http.MethodPost, testToken, body)
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		if wantStatus != 200 {
			return FaultsResponse{}
		}
		return decode[FaultsResponse](t, b)
	}
	st := apply(`{"fault":"errors","rate":0.25,"status":503}`, 200)
	st = apply(`{"fault":"max_model_len","n":512,"advertise":false}`, 200)
	st = apply(`{"fault":"throttle","severity":0.4,"lead":"2s"}`, 200)
	st = apply(`{"fault":"pcie","severity":0.3}`, 200)
	st = apply(`{"fault":"dcgm_down"}`, 200)
	for _, f := range []string{FaultErrors, FaultMaxModelLen, FaultThrottle, FaultPCIe, FaultDCGMDown} {
		if !hasFault(st.Faults, f) {
			t.Fatalf("fault %s not listed: %+v", f, st.Faults)
		}
	}
	if !x.Down() || st.DCGM == nil || !st.DCGM.Down {
		t.Fatal("dcgm_down not applied")
	}
	if n, _ := e.maxModelLen(); n != 512 {
		t.Fatalf("max_model_len = %d", n)
	}
	apply(`{"fault":"hang"}`, 200)
	if e.Ready() {
		t.Fatal("hung engine ready")
	}
	apply(`{"fault":"hang","on":false}`, 200)
	st = apply(`{"fault":"clear"}`, 200)
	if len(st.Faults) != 0 || x.Down() {
		t.Fatalf("after clear: %+v", st)
	}
	st = apply(`{"fault":"kill"}`, 200)
	if st.Engine.State != "killed" || !hasFault(st.Faults, FaultKill) {
		t.Fatalf("after kill: %+v", st)
	}
	st = apply(`{"fault":"restart","slow_start":"1h"}`, 200)
	if st.Engine.State != "running" || st.Engine.Ready || !hasFault(st.Faults, FaultSlowStart) {
		t.Fatalf("after restart with slow start: %+v", st)
	}
	apply(`{"fault":"slow_start","duration":"0s"}`, 200)
	if !e.Ready() {
		t.Fatal("slow_start 0s did not make the engine ready")
	}
	for _, bad := range []string{`{"fault":"nope"}`, `{"fault":"errors","rate":2}`, `{"fault":"throttle","severity":0.5,"lead":"soon"}`,
		`{"fault":"kill","extra":true}`, `{`, `{"fault":"slow_start"}`, `{}`} {
		apply(bad, 400)
	}
	if got := testutil.ToFloat64(a.m.badRequests); got != 7 {
		t.Fatalf("admin bad requests = %v, want 7", got)
	}
}

// TestFrontendDelayKeyedByRequest: a request's frontend latency depends on
// its body only — the same on engines of different seeds and on a repeat —
// so runs that replay the same requests under different load balancers
// see the same draws; distinct requests still draw distinct latencies from
// the profile's distribution (FrontendLatency plus an exponential).
func TestFrontendDelayKeyedByRequest(t *testing.T) {
	mk := func(seed int64) *Engine {
		e, err := NewEngine(EngineConfig{Name: fmt.Sprintf("fe-%d", seed), Profile: Profile70BAWQ, Seed: seed}, Deps{Logger: testLogger(t), Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	a, b := mk(1), mk(2)
	p := a.Profile()
	seen := map[time.Duration]bool{}
	var sum time.Duration
	const n = 2000
	for i := range n {
		body := []byte(fmt.Sprintf(`{"model":"m","prompt":"request %d","max_tokens":16}`, i))
		d := a.frontendDelay(body)
		if d2, d3 := b.frontendDelay(body), a.frontendDelay(body); d2 != d || d3 != d {
			t.Fatalf("request %d: %v, %v on another engine, %v again: want one latency", i, d, d2, d3)
		}
		if d < p.FrontendLatency {
			t.Fatalf("request %d: %v below the fixed %v", i, d, p.FrontendLatency)
		}
		seen[d] = true
		sum += d - p.FrontendLatency
	}
	if len(seen) < n*9/10 {
		t.Fatalf("%d distinct latencies over %d requests: the draws are not per request", len(seen), n)
	}
	// The exponential part's mean, within 10 % (its standard error over
	// 2,000 draws is about 2 %).
	if m := sum / n; m < p.FrontendJitter*9/10 || m > p.FrontendJitter*11/10 {
		t.Fatalf("mean extra latency %v, want about %v", m, p.FrontendJitter)
	}
}
