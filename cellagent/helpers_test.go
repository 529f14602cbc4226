package cellagent

import (
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// v1TTFTBuckets are vLLM v1's time_to_first_token_seconds bucket bounds.
var v1TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// enginePage is the cumulative state of a simulated vLLM engine, rendered
// the way vLLM v1 (prometheus_client + prometheus-fastapi-instrumentator)
// renders it.
type enginePage struct {
	Model            string
	Waiting, Running float64
	KV               float64
	KVRaw            string // overrides KV when set (e.g. "NaN")
	TTFT             []float64
	Success          float64
	HTTP             map[string]float64 // status label → count on /v1/chat/completions
	// PrefixQueries and PrefixHits are the prefix-cache counters, in
	// prompt tokens.
	PrefixQueries, PrefixHits float64
}

// admit counts prompt tokens looked up in the prefix cache and those hit.
func (p *enginePage) admit(queried, hit float64) {
	p.PrefixQueries += queried
	p.PrefixHits += hit
}

func (p *enginePage) observeTTFT(vs ...float64) { p.TTFT = append(p.TTFT, vs...) }

func (p *enginePage) respond(status string, n float64) {
	if p.HTTP == nil {
		p.HTTP = map[string]float64{}
	}
	p.HTTP[status] += n
	if strings.HasPrefix(status, "2") {
		p.Success += n
	}
}

func pyFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func (p enginePage) render() []byte {
	model := p.Model
	if model == "" {
		model = "meta-llama/Llama-3.1-70B-Instruct"
	}
	l := fmt.Sprintf(`engine="0",model_name=%q`, model)
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# HELP python_info Python platform information")
	w("# TYPE python_info gauge")
	w(`python_info{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"} 1.0`)
	w("# HELP vllm:num_requests_running Number of requests in model execution batches.")
	w("# TYPE vllm:num_requests_running gauge")
	w("vllm:num_requests_running{%s} %s", l, pyFloat(p.Running))
	w("# HELP vllm:num_requests_waiting Number of requests waiting to be processed.")
	w("# TYPE vllm:num_requests_waiting gauge")
	w("vllm:num_requests_waiting{%s} %s", l, pyFloat(p.Waiting))
	kv := pyFloat(p.KV)
	if p.KVRaw != "" {
		kv = p.KVRaw
	}
	w("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.")
	w("# TYPE vllm:kv_cache_usage_perc gauge")
	w("vllm:kv_cache_usage_perc{%s} %s", l, kv)
	w("# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.")
	w("# TYPE vllm:prefix_cache_queries_total counter")
	w("vllm:prefix_cache_queries_total{%s} %s", l, pyFloat(p.PrefixQueries))
	w("# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.")
	w("# TYPE vllm:prefix_cache_hits_total counter")
	w("vllm:prefix_cache_hits_total{%s} %s", l, pyFloat(p.PrefixHits))
	w("# HELP vllm:request_success_total Count of successfully processed requests.")
	w("# TYPE vllm:request_success_total counter")
	w(`vllm:request_success_total{engine="0",finished_reason="stop",model_name=%q} %s`, model, pyFloat(p.Success))
	w("# HELP vllm:request_success_created Count of successfully processed requests.")
	w("# TYPE vllm:request_success_created gauge")
	w(`vllm:request_success_created{engine="0",finished_reason="stop",model_name=%q} 1.7523610912734e+09`, model)
	w("# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.")
	w("# TYPE vllm:time_to_first_token_seconds histogram")
	sum := 0.0
	for _, v := range p.TTFT {
		sum += v
	}
	for _, ub := range v1TTFTBuckets {
		n := 0
		for _, v := range p.TTFT {
			if v <= ub {
				n++
			}
		}
		w(`vllm:time_to_first_token_seconds_bucket{engine="0",le=%q,model_name=%q} %s`, pyFloat(ub), model, pyFloat(float64(n)))
	}
	w(`vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name=%q} %s`, model, pyFloat(float64(len(p.TTFT))))
	w("vllm:time_to_first_token_seconds_count{%s} %s", l, pyFloat(float64(len(p.TTFT))))
	w("vllm:time_to_first_token_seconds_sum{%s} %s", l, pyFloat(sum))
	w("# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.")
	w("# TYPE vllm:time_to_first_token_seconds_created gauge")
	w("vllm:time_to_first_token_seconds_created{%s} 1.7523610912734e+09", l)
	w("# HELP http_requests_total Total number of requests by method, status and handler.")
	w("# TYPE http_requests_total counter")
	for _, st := range []string{"2xx", "4xx", "5xx", "200", "400", "429", "500", "503"} {
		if n, ok := p.HTTP[st]; ok {
			w(`http_requests_total{handler="/v1/chat/completions",method="POST",status=%q} %s`, st, pyFloat(n))
		}
	}
	w(`http_requests_total{handler="/metrics",method="GET",status="2xx"} 12.0`)
	return []byte(b.String())
}

// fakeEngine is an httptest vLLM: /metrics, /health, /v1/models.
type fakeEngine struct {
	*httptest.Server
	mu     sync.Mutex
	page   enginePage
	raw    []byte // served instead of page when set
	health int
	models string
}

func newFakeEngine(t testing.TB) *fakeEngine {
	e := &fakeEngine{health: http.StatusOK, models: `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-70B-Instruct","object":"model","owned_by":"vllm","root":"meta-llama/Llama-3.1-70B-Instruct","parent":null,"max_model_len":8192}]}`}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		body := e.raw
		if body == nil {
			body = e.page.render()
		}
		e.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(body)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		code := e.health
		e.mu.Unlock()
		w.WriteHeader(code)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		body := e.models
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	})
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	return e
}

func (e *fakeEngine) update(f func(p *enginePage)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(&e.page)
}

func (e *fakeEngine) setHealth(code int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.health = code
}

func (e *fakeEngine) metricsURL() string { return e.URL + "/metrics" }

// fakeDCGM is an httptest dcgm-exporter serving a fixed page.
type fakeDCGM struct {
	*httptest.Server
	mu   sync.Mutex
	page []byte
}

func newFakeDCGM(t testing.TB, page []byte) *fakeDCGM {
	d := &fakeDCGM{page: page}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		d.mu.Lock()
		body := d.page
		d.mu.Unlock()
		_, _ = w.Write(body)
	}))
	t.Cleanup(d.Close)
	return d
}

func (d *fakeDCGM) metricsURL() string { return d.URL + "/metrics" }

// testLogger logs through t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
