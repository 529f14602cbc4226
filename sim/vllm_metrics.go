package sim

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
	"github.com/prometheus/common/expfmt"
)

// Histogram buckets exactly as vLLM (v1 engine) defines them.
var (
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	vllmITLBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	vllmRequestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// prometheus-fastapi-instrumentator's default "lowr" buckets.
	httpDurationBuckets = []float64{0.1, 0.5, 1}
)

// vLLM finish reasons, the values of request_success_total's
// finished_reason label.
const (
	finishStop   = "stop"
	finishLength = "length"
	finishAbort  = "abort"
)

// vllmMetrics are the metrics one engine incarnation exposes on /metrics,
// with vLLM's names, help texts, labels and buckets, in a registry of their
// own (a restarted engine starts from zero, like a restarted process).
type vllmMetrics struct {
	reg *prometheus.Registry

	running, waiting, kvUsage                   prometheus.Gauge
	preemptions, promptTokens, generationTokens prometheus.Counter
	prefixQueries, prefixHits                   prometheus.Counter
	success                                     map[string]prometheus.Counter
	ttft, itl, e2e, queue, prefill, decode      prometheus.Observer
	inference                                   prometheus.Observer
	promptHist, genHist, iterTokens             prometheus.Observer

	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
}

// build125Buckets mirrors vLLM's build_1_2_5_buckets(max).
func build125Buckets(maxValue int) []float64 {
	var b []float64
	for e := 1; ; e *= 10 {
		for _, m := range []int{1, 2, 5} {
			v := m * e
			if v > maxValue {
				return b
			}
			b = append(b, float64(v))
		}
	}
}

// newVLLMMetrics builds one incarnation's metric set in a registry of its
// own; it fails only if the set does not register (a duplicate name).
func newVLLMMetrics(model string, maxModelLen int) (*vllmMetrics, error) {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	// The collectors, registered in this order at the end.
	var cs []prometheus.Collector
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
		cs = append(cs, g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		cs = append(cs, c)
		return c
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		cs = append(cs, h)
		return h
	}
	m := &vllmMetrics{reg: reg}
	m.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
	m.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
	m.kvUsage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	// Counted in prompt tokens at every admission, as vLLM v1 counts them;
	// they stay at 0 with prefix caching off (vLLM registers them anyway).
	m.prefixQueries = counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.")
	m.prefixHits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
	m.preemptions = counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
	m.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	m.generationTokens = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")

	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
	}, []string{"model_name", "engine", "finished_reason"})
	cs = append(cs, success)
	m.success = make(map[string]prometheus.Counter)
	for _, r := range []string{finishStop, finishLength, finishAbort} {
		m.success[r] = success.WithLabelValues(model, "0", r)
	}

	tokBuckets := build125Buckets(maxModelLen)
	m.promptHist = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokBuckets)
	m.genHist = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokBuckets)
	m.iterTokens = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
		[]float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384})
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", vllmTTFTBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", vllmITLBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", vllmRequestLatencyBuckets)
	m.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", vllmRequestLatencyBuckets)
	m.inference = hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", vllmRequestLatencyBuckets)
	m.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", vllmRequestLatencyBuckets)
	m.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", vllmRequestLatencyBuckets)

	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "http_requests_total", Help: "Total number of requests by method, status and handler.",
	}, []string{"method", "status", "handler"})
	m.httpDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "http_request_duration_seconds",
		Help:    "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
		Buckets: httpDurationBuckets,
	}, []string{"method", "handler"})
	cs = append(cs, m.httpRequests, m.httpDuration)
	if err := promreg.Register(reg, cs...); err != nil {
		return nil, fmt.Errorf("sim: register vLLM metrics: %w", err)
	}
	return m, nil
}

// observeHTTP records one request the way prometheus-fastapi-instrumentator
// does in vLLM's API server: status grouped as "2xx", "4xx", "5xx".
func (m *vllmMetrics) observeHTTP(method, handler string, status int, seconds float64) {
	m.httpRequests.WithLabelValues(method, strconv.Itoa(status/100)+"xx", handler).Inc()
	m.httpDuration.WithLabelValues(method, handler).Observe(seconds)
}

// serveMetrics writes the registry in the Prometheus text format (version
// 0.0.4), which is what vLLM's prometheus_client serves.
func (m *vllmMetrics) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	serveText(w, m.reg)
}

func serveText(w http.ResponseWriter, g prometheus.Gatherer) {
	mfs, err := g.Gather()
	if err != nil {
		http.Error(w, "gather: "+err.Error(), http.StatusInternalServerError)
		return
	}
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	w.Header().Set("Content-Type", string(format))
	enc := expfmt.NewEncoder(w, format)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return // the client went away; nothing more to do
		}
	}
}
