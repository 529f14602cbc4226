package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Delta        *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func url(e *Engine, path string) string { return "http://" + e.Addr() + path }

func TestCompletionsNonStreaming(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	resp, body := post(t, c, url(e, "/v1/completions"), `{"model":"`+DefaultModel+`","prompt":"`+strings.Repeat("x", 40)+`","max_tokens":5}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	r := decode[completionResp](t, body)
	if !strings.HasPrefix(r.ID, "cmpl-") || r.Object != "text_completion" || r.Model != DefaultModel {
		t.Fatalf("envelope = %+v", r)
	}
	if len(r.Choices) != 1 || r.Choices[0].Text != " the engine streams simulated tokens" || *r.Choices[0].FinishReason != "length" {
		t.Fatalf("choices = %s", body)
	}
	if r.Usage == nil || *r.Usage != (usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}) {
		t.Fatalf("usage = %+v", r.Usage)
	}
}

func TestCompletionsBatchedPrompts(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	resp, body := post(t, newClient(t), url(e, "/v1/completions"), `{"prompt":["abcd","abcdabcd","abcdabcdabc"],"max_tokens":2}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	r := decode[completionResp](t, body)
	if len(r.Choices) != 3 || r.Usage.PromptTokens != 1+2+3 || r.Usage.CompletionTokens != 6 {
		t.Fatalf("response = %s", body)
	}
	for i, ch := range r.Choices {
		if ch.Index != i || ch.Text != fillerToken(i, 1)+fillerToken(i, 2) {
			t.Fatalf("choice %d = %+v", i, ch)
		}
	}
}

func TestChatNonStreaming(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	resp, body := post(t, newClient(t), url(e, "/v1/chat/completions"),
		`{"messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":3}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	r := decode[completionResp](t, body)
	if !strings.HasPrefix(r.ID, "chatcmpl-") || r.Object != "chat.completion" || len(r.Choices) != 1 {
		t.Fatalf("response = %s", body)
	}
	m := r.Choices[0].Message
	if m == nil || m.Role != "assistant" || m.Content != " the engine streams" || r.Usage.PromptTokens != 2+4 {
		t.Fatalf("response = %s", body)
	}
}

// TestStreamingFlushesEachToken drives the engine with a fake clock: the
// first SSE chunk reaches the client while the engine has produced only the
// first of 20 tokens, so chunks are flushed as tokens are produced, not
// buffered.
func TestStreamingFlushesEachToken(t *testing.T) {
	t.Parallel()
	fc := clockwork.NewFakeClock()
	e := startEngine(t, tinyConfig(), Deps{Clock: fc})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 20
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url(e, "/v1/completions"),
		strings.NewReader(fmt.Sprintf(`{"prompt":"abcd","max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, n)))
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := sseEvents(resp.Body)

	// One step: prefill plus the first token.
	if err := fc.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Second)
	first := <-events
	if got := e.Stats().GeneratedTokens; got != 1 {
		t.Fatalf("engine generated %d tokens when the first chunk arrived, want 1", got)
	}
	var chunks []completionResp
	chunks = append(chunks, decode[completionResp](t, []byte(first)))
	select {
	case ev := <-events:
		t.Fatalf("second event %q before the second step", ev)
	default:
	}
	for range n - 1 {
		if err := fc.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		fc.Advance(time.Second)
	}
	var usageSeen, doneSeen bool
	for ev := range events {
		switch {
		case ev == "[DONE]":
			doneSeen = true
		case strings.HasPrefix(ev, "ERR"):
			t.Fatal(ev)
		default:
			r := decode[completionResp](t, []byte(ev))
			if len(r.Choices) == 0 {
				usageSeen = r.Usage != nil && r.Usage.CompletionTokens == n && r.Usage.PromptTokens == 1
				continue
			}
			chunks = append(chunks, r)
		}
	}
	if len(chunks) != n || !usageSeen || !doneSeen {
		t.Fatalf("%d token chunks (want %d), usage %v, [DONE] %v", len(chunks), n, usageSeen, doneSeen)
	}
	for i, ch := range chunks {
		fr := ch.Choices[0].FinishReason
		if ch.Choices[0].Text != fillerToken(0, i+1) || (fr != nil) != (i == n-1) || (fr != nil && *fr != "length") {
			t.Fatalf("chunk %d = %+v", i, ch.Choices[0])
		}
	}
}

func TestChatStreaming(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	req, _ := http.NewRequest(http.MethodPost, url(e, "/v1/chat/completions"),
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`))
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []completionResp
	for ev := range sseEvents(resp.Body) {
		if ev == "[DONE]" {
			break
		}
		got = append(got, decode[completionResp](t, []byte(ev)))
	}
	if len(got) != 5 {
		t.Fatalf("got %d chunks, want role + 4 tokens", len(got))
	}
	if d := got[0].Choices[0].Delta; d == nil || d.Role != "assistant" || got[0].Object != "chat.completion.chunk" {
		t.Fatalf("first chunk = %+v", got[0])
	}
	var text string
	for _, ch := range got[1:] {
		text += ch.Choices[0].Delta.Content
	}
	if text != " the engine streams simulated" || *got[4].Choices[0].FinishReason != "length" {
		t.Fatalf("text %q, last %+v", text, got[4].Choices[0])
	}
}

// TestChatRoleChunkWaitsForFirstToken: the role chunk leaves with the
// first token, as vLLM's serving_chat.py sends it, so a client's first
// byte is its first token: when it arrives the engine has generated one.
func TestChatRoleChunkWaitsForFirstToken(t *testing.T) {
	t.Parallel()
	clk := clockwork.NewFakeClock()
	cfg := tinyConfig()
	// One prompt token per second of prefill: the first token takes
	// seconds of engine time, in which a role chunk sent at once would
	// arrive with nothing generated.
	p := ProfileTinyFast()
	p.PrefillTokensPerSec = 1
	cfg.CustomProfile = &p
	e := startEngine(t, cfg, Deps{Clock: clk})
	req, _ := http.NewRequest(http.MethodPost, url(e, "/v1/chat/completions"),
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`))
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make(chan int64, 1)
	go func() {
		for range sseEvents(resp.Body) {
			first <- e.Stats().GeneratedTokens
			return
		}
		close(first)
	}()
	// The engine's clock moves only here; the first chunk cannot leave
	// before a step has produced a token.
	for range 1_000_000 {
		select {
		case n, ok := <-first:
			if !ok || n < 1 {
				t.Fatalf("first chunk with %d tokens generated (stream ended: %v)", n, !ok)
			}
			return
		default:
		}
		clk.Advance(time.Millisecond)
		runtime.Gosched()
	}
	t.Fatal("no chunk after 1,000 s of engine time")
}

func TestRequestErrors(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cfg := tinyConfig()
	cfg.MaxModelLen = 1024
	cfg.MaxBodyBytes = 4096
	e := startEngine(t, cfg, Deps{Registerer: reg})
	c := newClient(t)
	tests := []struct {
		name, path, body string
		status           int
		want             string
		reason           string
	}{
		{"too long", "/v1/completions", `{"prompt":"` + strings.Repeat("y", 1372*4) + `"}`, 413, `"type":"RequestEntityTooLargeError"`, reasonTooLarge},
		{"context", "/v1/completions", `{"prompt":[` + strings.TrimSuffix(strings.Repeat("1,", 1372), ",") + `]}`, 400,
			`{"object":"error","message":"This model's maximum context length is 1024 tokens. However, you requested 1500 tokens (1372 in the messages, 128 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}`, reasonContextLen},
		{"unknown model", "/v1/completions", `{"model":"X","prompt":"a"}`, 404,
			`{"object":"error","message":"The model ` + "`X`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}`, reasonUnknownModel},
		{"malformed", "/v1/chat/completions", `{"messages":`, 400, `"type":"BadRequestError"`, reasonMalformed},
	}
	for _, tt := range tests {
		resp, body := post(t, c, url(e, tt.path), tt.body)
		if resp.StatusCode != tt.status || !strings.Contains(string(body), tt.want) {
			t.Errorf("%s: %d %s, want %d containing %s", tt.name, resp.StatusCode, body, tt.status, tt.want)
		}
		if got := testutil.ToFloat64(e.m.badRequests.WithLabelValues(tt.reason)); got != 1 {
			t.Errorf("%s: isobar_sim_bad_requests_total{reason=%q} = %v, want 1", tt.name, tt.reason, got)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "isobar_sim_bad_requests_total"); err != nil || n != 4 {
		t.Fatalf("registered bad-request series = %d, %v", n, err)
	}
}

func TestModelsAndHealth(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	resp, body := get(t, c, url(e, "/v1/models"))
	if resp.StatusCode != 200 {
		t.Fatalf("models %d", resp.StatusCode)
	}
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	data := raw["data"].([]any)
	card := data[0].(map[string]any)
	if raw["object"] != "list" || len(data) != 1 || card["id"] != DefaultModel || card["object"] != "model" ||
		card["owned_by"] != "vllm" || card["root"] != DefaultModel || card["parent"] != nil ||
		card["max_model_len"] != float64(4096) || len(card["permission"].([]any)) != 1 {
		t.Fatalf("models = %s", body)
	}
	resp, body = get(t, c, url(e, "/health"))
	if resp.StatusCode != 200 || len(body) != 0 {
		t.Fatalf("health %d %q", resp.StatusCode, body)
	}
}

// bucketBounds returns a histogram's finite bucket bounds (the text format
// carries +Inf explicitly).
func bucketBounds(m *dto.Metric) []float64 {
	var b []float64
	for _, x := range m.GetHistogram().GetBucket() {
		if !math.IsInf(x.GetUpperBound(), 1) {
			b = append(b, x.GetUpperBound())
		}
	}
	return b
}

func TestVLLMMetricsExposition(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	for range 2 {
		post(t, c, url(e, "/v1/completions"), `{"prompt":"abcdabcd","max_tokens":3}`)
	}
	post(t, c, url(e, "/v1/completions"), `{"model":"nope","prompt":"a"}`)
	get(t, c, url(e, "/v1/models"))
	get(t, c, url(e, "/health"))
	get(t, c, url(e, "/no/such/path"))
	engineLabels := map[string]string{"engine": "0", "model_name": DefaultModel}
	// The scheduler counts a step's tokens once the step ends, which may
	// be just after the last one reached the client: await the counters.
	var mfs map[string]*dto.MetricFamily
	eventually.True(t, pollTimeout, "the generation tokens counted", func() bool {
		mfs = scrape(t, c, url(e, "/metrics"))
		v, _ := metricValue(mfs, "vllm:generation_tokens_total", engineLabels)
		return v >= 6
	})

	want := []struct {
		name    string
		typ     dto.MetricType
		buckets []float64
	}{
		{"vllm:num_requests_running", dto.MetricType_GAUGE, nil},
		{"vllm:num_requests_waiting", dto.MetricType_GAUGE, nil},
		{"vllm:kv_cache_usage_perc", dto.MetricType_GAUGE, nil},
		{"vllm:time_to_first_token_seconds", dto.MetricType_HISTOGRAM, vllmTTFTBuckets},
		{"vllm:inter_token_latency_seconds", dto.MetricType_HISTOGRAM, vllmITLBuckets},
		{"vllm:e2e_request_latency_seconds", dto.MetricType_HISTOGRAM, vllmRequestLatencyBuckets},
		{"vllm:prompt_tokens_total", dto.MetricType_COUNTER, nil},
		{"vllm:generation_tokens_total", dto.MetricType_COUNTER, nil},
		{"vllm:num_preemptions_total", dto.MetricType_COUNTER, nil},
		{"vllm:prefix_cache_queries_total", dto.MetricType_COUNTER, nil},
		{"vllm:prefix_cache_hits_total", dto.MetricType_COUNTER, nil},
		{"vllm:request_success_total", dto.MetricType_COUNTER, nil},
	}
	for _, w := range want {
		mf, ok := mfs[w.name]
		if !ok {
			t.Errorf("missing %s", w.name)
			continue
		}
		if mf.GetType() != w.typ {
			t.Errorf("%s type %v, want %v", w.name, mf.GetType(), w.typ)
		}
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			if l["engine"] != "0" || l["model_name"] != DefaultModel {
				t.Errorf("%s labels %v", w.name, l)
			}
			if w.buckets != nil && !slices.Equal(bucketBounds(m), w.buckets) {
				t.Errorf("%s buckets %v, want %v", w.name, bucketBounds(m), w.buckets)
			}
		}
	}
	// Exact figures: 2 requests × 2 prompt tokens, 3 tokens each.
	if v, _ := metricValue(mfs, "vllm:prompt_tokens_total", engineLabels); v != 4 {
		t.Errorf("prompt tokens = %v, want 4", v)
	}
	if v, _ := metricValue(mfs, "vllm:generation_tokens_total", engineLabels); v != 6 {
		t.Errorf("generation tokens = %v, want 6", v)
	}
	if v, _ := metricValue(mfs, "vllm:request_success_total", map[string]string{"finished_reason": "length"}); v != 2 {
		t.Errorf("request_success_total{length} = %v, want 2", v)
	}
	if h := mfs["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleCount() != 2 {
		t.Errorf("TTFT count = %d, want 2", h.GetSampleCount())
	}
	if h := mfs["vllm:inter_token_latency_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleCount() != 4 {
		t.Errorf("ITL count = %d, want 4 (2 gaps per request)", h.GetSampleCount())
	}

	// prometheus-fastapi-instrumentator's series, status grouped.
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"handler": "/v1/completions", "method": "POST", "status": "2xx"}, 2},
		{map[string]string{"handler": "/v1/completions", "method": "POST", "status": "4xx"}, 1},
		{map[string]string{"handler": "/v1/models", "method": "GET", "status": "2xx"}, 1},
		{map[string]string{"handler": "none", "method": "GET", "status": "4xx"}, 1},
	} {
		if v, ok := metricValue(mfs, "http_requests_total", c.labels); !ok || v != c.want {
			t.Errorf("http_requests_total%v = %v (found %v), want %v", c.labels, v, ok, c.want)
		}
	}
	for _, m := range mfs["http_requests_total"].GetMetric() {
		if h := labelsOf(m)["handler"]; h == "/health" || h == "/metrics" {
			t.Errorf("%s is instrumented; vLLM excludes it", h)
		}
	}
	dur := mfs["http_request_duration_seconds"]
	if dur == nil || dur.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatal("http_request_duration_seconds missing")
	}
	for _, m := range dur.GetMetric() {
		l := labelsOf(m)
		if len(l) != 2 || l["handler"] == "" || l["method"] == "" || !slices.Equal(bucketBounds(m), httpDurationBuckets) {
			t.Errorf("http_request_duration_seconds series %v buckets %v", l, bucketBounds(m))
		}
	}
}

func TestEngineConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  EngineConfig
		want string
	}{
		{"profile", EngineConfig{Profile: "huge"}, "EngineConfig.Profile"},
		{"time scale", EngineConfig{TimeScale: -1}, "EngineConfig.TimeScale"},
		{"max model len vs kv", EngineConfig{Profile: ProfileTiny, MaxModelLen: 1 << 20}, "exceeds the KV cache"},
		{"gpu index", EngineConfig{GPUIndex: -1}, "EngineConfig.GPUIndex"},
		{"body", EngineConfig{MaxBodyBytes: 10}, "EngineConfig.MaxBodyBytes"},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate() = %v, want error naming %q", tt.name, err, tt.want)
		}
	}
	if err := (EngineConfig{}).Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := NewEngine(EngineConfig{Name: "a"}, Deps{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewEngine(EngineConfig{Name: "a"}, Deps{Registerer: reg}); err == nil {
		t.Fatal("two engines with one name registered in one registry")
	}
	if _, err := NewEngine(EngineConfig{Name: "b"}, Deps{Registerer: reg}); err != nil {
		t.Fatalf("second engine with its own name: %v", err)
	}
}

func TestStopGracefulFinishesInFlight(t *testing.T) {
	t.Parallel()
	e, err := NewEngine(tinyConfig(), Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(listenLoopback(t)); err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	done := make(chan int, 1)
	go func() {
		resp, err := c.Post(url(e, "/v1/completions"), "application/json", strings.NewReader(`{"prompt":"a","max_tokens":40}`))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	eventually.True(t, pollTimeout, "request running", func() bool { return e.Stats().Running == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != http.StatusOK {
		t.Fatalf("in-flight request during graceful stop: %d", code)
	}
	if err := e.Stop(ctx); err != nil || e.State() != StateStopped {
		t.Fatalf("second Stop = %v, state %v", err, e.State())
	}
	if err := e.Start(listenLoopback(t)); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
}

// TestTimeScaleScalesSteps: with TimeScale 0.5 a one-token request's single
// step lasts exactly half the model's d0 on a fake clock.
func TestTimeScaleScalesSteps(t *testing.T) {
	t.Parallel()
	fc := clockwork.NewFakeClock()
	cfg := tinyConfig()
	cfg.TimeScale = 0.5
	e := startEngine(t, cfg, Deps{Clock: fc})
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := e.Profile()
	d0 := p.StepBase + time.Duration(float64(time.Second)/p.PrefillTokensPerSec)
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
	fc.Advance(d0/2 - time.Nanosecond)
	if err := fc.BlockUntilContext(ctxDone(), 1); err != nil {
		t.Fatal("step ended before d0/2")
	}
	fc.Advance(time.Nanosecond)
	if code := <-done; code != 200 {
		t.Fatalf("status %d", code)
	}
	mfs := scrape(t, c, url(e, "/metrics"))
	if v, _ := metricValue(mfs, "vllm:time_to_first_token_seconds", nil); math.Abs(v-(d0/2).Seconds()) > 1e-9 {
		t.Fatalf("TTFT = %v s, want %v", v, (d0 / 2).Seconds())
	}
}
