package cellagent

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func approx(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// want checks an optional value: nil want means the value must be absent.
func wantVal(t *testing.T, name string, got *float64, want *float64) {
	t.Helper()
	switch {
	case want == nil && got != nil:
		t.Errorf("%s = %v, want absent", name, *got)
	case want != nil && got == nil:
		t.Errorf("%s absent, want %v", name, *want)
	case want != nil && !approx(*got, *want):
		t.Errorf("%s = %v, want %v", name, *got, *want)
	}
}

func TestParseVLLMFixtures(t *testing.T) {
	tests := []struct {
		name                   string
		file                   string
		waiting, running, kv   float64
		success                float64
		total, errs            float64
		p95, errRate           float64
		model                  string
		ttftCount, ttftBuckets float64
		prefixQ, prefixH       *float64
	}{
		{
			// vLLM v1, two data-parallel engines, grouped status codes.
			name: "v1 dp2 grouped status", file: "vllm_v1_dp2.prom",
			waiting: 4, running: 22, kv: 0.40, success: 1000,
			total: 1000, errs: 15,
			// rank 950 falls in (0.75, 1.0] holding 40 of which 10 are needed.
			p95: 0.75 + 0.25*10.0/40.0, errRate: 0.015,
			model: "meta-llama/Llama-3.1-70B-Instruct", ttftCount: 1000, ttftBuckets: 23,
			prefixQ: ptr(812345.0 + 712345), prefixH: ptr(301223.0 + 201223),
		},
		{
			// Older engine: no engine label, gpu_cache_usage_perc, exact codes.
			name: "legacy kv name exact status", file: "vllm_v0_legacy.prom",
			waiting: 0, running: 5, kv: 0.73, success: 190,
			total: 200, errs: 10,
			// rank 190 falls in (1.0, 2.5] holding 8 of which 2 are needed.
			p95: 1.0 + 1.5*2.0/8.0, errRate: 0.05,
			model: "meta-llama/Llama-3.1-70B-Instruct", ttftCount: 200, ttftBuckets: 17,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseVLLM(readFixture(t, tc.file), VLLMOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Invalid) != 0 {
				t.Errorf("Invalid = %v, want none", s.Invalid)
			}
			wantVal(t, "QueueDepth", s.QueueDepth, &tc.waiting)
			wantVal(t, "Running", s.Running, &tc.running)
			wantVal(t, "KVCacheUsage", s.KVCacheUsage, &tc.kv)
			wantVal(t, "RequestSuccess", s.RequestSuccess, &tc.success)
			if s.Completions == nil {
				t.Fatal("Completions absent")
			}
			if s.Completions.Total != tc.total || s.Completions.Errors != tc.errs {
				t.Errorf("Completions = %+v, want total %v errors %v", *s.Completions, tc.total, tc.errs)
			}
			if s.TTFT.Count() != tc.ttftCount || float64(len(s.TTFT.Buckets)) != tc.ttftBuckets {
				t.Errorf("TTFT count %v with %d buckets, want %v with %v", s.TTFT.Count(), len(s.TTFT.Buckets), tc.ttftCount, tc.ttftBuckets)
			}
			if s.Model != tc.model {
				t.Errorf("Model = %q, want %q", s.Model, tc.model)
			}
			wantVal(t, "PrefixQueries", s.PrefixQueries, tc.prefixQ)
			wantVal(t, "PrefixHits", s.PrefixHits, tc.prefixH)
			sig := Derive(nil, s, 0)
			var hitRate *float64
			if tc.prefixQ != nil {
				hitRate = ptr(*tc.prefixH / *tc.prefixQ)
			}
			wantVal(t, "PrefixCacheHitRate", sig.PrefixCacheHitRate, hitRate)
			wantVal(t, "TTFTP95Seconds", sig.TTFTP95Seconds, &tc.p95)
			wantVal(t, "ErrorRate", sig.ErrorRate, &tc.errRate)
			wantVal(t, "WindowRequests", sig.WindowRequests, &tc.total)
			wantVal(t, "RequestRate", sig.RequestRate, nil)
		})
	}
}

func TestParseVLLMCompletionHandlers(t *testing.T) {
	page := readFixture(t, "vllm_v1_dp2.prom")
	s, err := ParseVLLM(page, VLLMOptions{CompletionHandlers: []string{"/v1/completions"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Completions == nil || s.Completions.Total != 48 || s.Completions.Errors != 3 {
		t.Fatalf("Completions = %+v, want total 48 errors 3 (only /v1/completions)", s.Completions)
	}
}

func TestClassifyStatus(t *testing.T) {
	tests := []struct {
		in        string
		isErr, ok bool
	}{
		{"2xx", false, true}, {"200", false, true}, {"204", false, true},
		{"4xx", true, true}, {"400", true, true}, {"5xx", true, true}, {"503", true, true},
		{"3xx", true, true}, {"1xx", true, true},
		{"", false, false}, {"6xx", false, false}, {"2x", false, false}, {"20a", false, false},
		{"2000", false, false}, {"xx2", false, false}, {"0xx", false, false},
	}
	for _, tc := range tests {
		isErr, ok := classifyStatus(tc.in)
		if isErr != tc.isErr || ok != tc.ok {
			t.Errorf("classifyStatus(%q) = %v,%v; want %v,%v", tc.in, isErr, ok, tc.isErr, tc.ok)
		}
	}
}

// vllmGaugePage renders a minimal vLLM page around the given gauge lines.
func vllmGaugePage(lines ...string) []byte {
	var b strings.Builder
	b.WriteString("# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\n")
	b.WriteString("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n")
	b.WriteString("# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\n")
	b.WriteString("# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter\n")
	b.WriteString("# HELP http_requests_total Total number of requests by method, status and handler.\n# TYPE http_requests_total counter\n")
	b.WriteString("# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n# TYPE vllm:time_to_first_token_seconds histogram\n")
	b.WriteString("# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.\n# TYPE vllm:prefix_cache_queries_total counter\n")
	b.WriteString("# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n# TYPE vllm:prefix_cache_hits_total counter\n")
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return []byte(b.String())
}

func TestParseVLLMInvalidValues(t *testing.T) {
	const m = `engine="0",model_name="m"`
	tests := []struct {
		name        string
		lines       []string
		absent      string // the field that must be dropped
		invalidHint string
	}{
		{"NaN waiting", []string{`vllm:num_requests_waiting{` + m + `} NaN`}, "QueueDepth", "NaN"},
		{"negative running", []string{`vllm:num_requests_running{` + m + `} -3`}, "Running", "negative"},
		{"infinite kv", []string{`vllm:kv_cache_usage_perc{` + m + `} +Inf`}, "KVCacheUsage", "infinite"},
		{"kv far above 1", []string{`vllm:kv_cache_usage_perc{` + m + `} 1.7`}, "KVCacheUsage", "outside [0,1]"},
		{"kv percent not fraction", []string{`vllm:kv_cache_usage_perc{` + m + `} 41`}, "KVCacheUsage", "outside [0,1]"},
		{"one engine bad drops sum", []string{
			`vllm:num_requests_waiting{engine="0",model_name="m"} 3`,
			`vllm:num_requests_waiting{engine="1",model_name="m"} -Inf`}, "QueueDepth", "infinite"},
		{"negative counter", []string{`vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} -1`}, "RequestSuccess", "negative"},
		{"NaN http counter", []string{`http_requests_total{handler="/v1/completions",method="POST",status="2xx"} NaN`}, "Completions", "NaN"},
		{"bad status label", []string{`http_requests_total{handler="/v1/completions",method="POST",status="ok"} 5`}, "Completions", "unrecognised status"},
		{"NaN bucket", []string{
			`vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} NaN`,
			`vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4`}, "TTFT", "NaN"},
		{"NaN prefix queries", []string{`vllm:prefix_cache_queries_total{` + m + `} NaN`}, "PrefixQueries", "NaN"},
		{"negative prefix hits", []string{`vllm:prefix_cache_hits_total{` + m + `} -5`}, "PrefixHits", "negative"},
		{"prefix hits exceed queries", []string{
			`vllm:prefix_cache_queries_total{` + m + `} 100`,
			`vllm:prefix_cache_hits_total{` + m + `} 160`}, "PrefixHits", "exceeds vllm:prefix_cache_queries_total"},
		{"engines disagree on buckets", []string{
			`vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1`,
			`vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4`,
			`vllm:time_to_first_token_seconds_bucket{engine="1",le="0.2",model_name="m"} 1`,
			`vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 4`}, "TTFT", "bucket layout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseVLLM(vllmGaugePage(tc.lines...), VLLMOptions{})
			if err != nil {
				t.Fatal(err)
			}
			present := map[string]bool{
				"QueueDepth": s.QueueDepth != nil, "Running": s.Running != nil, "KVCacheUsage": s.KVCacheUsage != nil,
				"RequestSuccess": s.RequestSuccess != nil, "Completions": s.Completions != nil, "TTFT": s.TTFT != nil,
				"PrefixQueries": s.PrefixQueries != nil, "PrefixHits": s.PrefixHits != nil,
			}
			if present[tc.absent] {
				t.Errorf("%s present, want dropped", tc.absent)
			}
			joined := strings.Join(s.Invalid, "; ")
			if len(s.Invalid) == 0 || !strings.Contains(joined, tc.invalidHint) {
				t.Errorf("Invalid = %q, want a mention of %q", joined, tc.invalidHint)
			}
			sig := Derive(nil, s, 0)
			checkSignalsInRange(t, sig)
		})
	}
}

func TestParseVLLMClampsNearFractions(t *testing.T) {
	s, err := ParseVLLM(vllmGaugePage(`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 1.004`), VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.KVCacheUsage == nil || *s.KVCacheUsage != 1 || len(s.Invalid) != 0 {
		t.Fatalf("kv = %v, invalid %v; want clamped to 1 with nothing dropped", s.KVCacheUsage, s.Invalid)
	}
}

func TestParseVLLMMalformed(t *testing.T) {
	for _, page := range []string{
		"vllm:num_requests_waiting{engine=\"0\" 3\n",
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting abc\n",
		"# TYPE vllm:num_requests_waiting gauge\n# TYPE vllm:num_requests_waiting counter\n",
		"# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_bucket{le=\"0.1\"} -1\n",
	} {
		if _, err := ParseVLLM([]byte(page), VLLMOptions{}); !errors.Is(err, ErrParse) {
			t.Errorf("ParseVLLM(%q) error = %v, want ErrParse", page, err)
		}
	}
	// An empty page parses: everything absent.
	s, err := ParseVLLM(nil, VLLMOptions{})
	if err != nil || s.QueueDepth != nil || s.TTFT != nil || s.Completions != nil {
		t.Errorf("empty page: %+v, %v; want all absent, no error", s, err)
	}
}

func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name    string
		q       float64
		buckets []Bucket
		want    float64
		ok      bool
	}{
		{"interpolates in bucket", 0.95, []Bucket{{0.1, 10}, {0.5, 60}, {1, 100}, {inf, 100}}, 0.5 + 0.5*35.0/40.0, true},
		{"median first bucket from zero", 0.5, []Bucket{{0.2, 10}, {1, 10}, {inf, 10}}, 0.1, true},
		{"rank in +Inf bucket gives highest bound", 0.95, []Bucket{{0.1, 10}, {1, 50}, {inf, 100}}, 1, true},
		{"exact bucket edge", 0.5, []Bucket{{1, 50}, {2, 100}, {inf, 100}}, 1, true},
		{"negative first bound", 0.5, []Bucket{{-1, 60}, {1, 100}, {inf, 100}}, -1, true},
		{"non monotonic counts fixed up", 0.75, []Bucket{{1, 10}, {2, 8}, {3, 20}, {inf, 20}}, 2.5, true},
		{"no observations", 0.95, []Bucket{{1, 0}, {inf, 0}}, 0, false},
		{"no +Inf bucket", 0.95, []Bucket{{1, 5}, {2, 10}}, 0, false},
		{"single bucket", 0.95, []Bucket{{inf, 10}}, 0, false},
		{"q out of range", 1.5, []Bucket{{1, 5}, {inf, 10}}, 0, false},
		{"NaN count", 0.5, []Bucket{{1, math.NaN()}, {inf, 10}}, 0, false},
		{"unsorted bounds", 0.5, []Bucket{{2, 5}, {1, 8}, {inf, 10}}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := HistogramQuantile(tc.q, tc.buckets)
			if ok != tc.ok || (ok && !approx(got, tc.want)) {
				t.Fatalf("HistogramQuantile = %v,%v; want %v,%v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseDCGM(t *testing.T) {
	two := readFixture(t, "dcgm_2gpu.prom")
	one := readFixture(t, "dcgm_1gpu_tensor.prom")
	tests := []struct {
		name     string
		page     []byte
		selector string
		device   string
		util     float64
		vram     float64
		sm, dram float64
		temp     float64
		power    float64
		throttle uint64
	}{
		{"index 0", two, "0", "gpu 0 (GPU-5fd4a5d0-1c3b-8e0a-2b71-6d3f1e0c9a11)",
			0.87, 75689.0 / (75689 + 5312), 0.802117, 0.612, 71, 612.479, 4},
		{"index 1", two, "1", "gpu 1 (GPU-9b2e7c44-03af-4d1e-a8c2-71f0be6d2f35)",
			0.12, 2048.0 / (2048 + 78953), 0.08, 0.05, 38, 118.204, 1},
		{"UUID", two, "GPU-9b2e7c44-03af-4d1e-a8c2-71f0be6d2f35", "gpu 1 (GPU-9b2e7c44-03af-4d1e-a8c2-71f0be6d2f35)",
			0.12, 2048.0 / (2048 + 78953), 0.08, 0.05, 38, 118.204, 1},
		{"UUID any case", two, "gpu-5FD4A5D0-1c3b-8e0a-2b71-6d3f1e0c9a11", "gpu 0 (GPU-5fd4a5d0-1c3b-8e0a-2b71-6d3f1e0c9a11)",
			0.87, 75689.0 / (75689 + 5312), 0.802117, 0.612, 71, 612.479, 4},
		// No SM_ACTIVE: tensor pipe stands in; CLOCKS_EVENT_REASONS; pod labels.
		{"only GPU, tensor fallback", one, "", "gpu 3 (GPU-0e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9)",
			0.64, 0.75, 0.355, 0.498, 58, 301.115, 96},
		{"only GPU by index", one, "3", "gpu 3 (GPU-0e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9)",
			0.64, 0.75, 0.355, 0.498, 58, 301.115, 96},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hw, err := ParseDCGM(tc.page, tc.selector)
			if err != nil {
				t.Fatal(err)
			}
			if hw.Device != tc.device {
				t.Errorf("Device = %q, want %q", hw.Device, tc.device)
			}
			if len(hw.Invalid) != 0 {
				t.Errorf("Invalid = %v", hw.Invalid)
			}
			wantVal(t, "GPUUtil", hw.GPUUtil, &tc.util)
			wantVal(t, "VRAMUsed", hw.VRAMUsed, &tc.vram)
			wantVal(t, "SMActive", hw.SMActive, &tc.sm)
			wantVal(t, "DRAMActive", hw.DRAMActive, &tc.dram)
			wantVal(t, "TemperatureCelsius", hw.TemperatureCelsius, &tc.temp)
			wantVal(t, "PowerWatts", hw.PowerWatts, &tc.power)
			if hw.ClockThrottleReasons == nil || *hw.ClockThrottleReasons != tc.throttle {
				t.Errorf("ClockThrottleReasons = %v, want %d", hw.ClockThrottleReasons, tc.throttle)
			}
		})
	}
}

func TestParseDCGMSelectionErrors(t *testing.T) {
	two := readFixture(t, "dcgm_2gpu.prom")
	mig := []byte(`# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aa",GPU_I_ID="1",GPU_I_PROFILE="3g.40gb"} 50
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aa",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb"} 20
`)
	tests := []struct {
		name     string
		page     []byte
		selector string
		want     error
		hint     string
	}{
		{"no selector, two GPUs", two, "", ErrGPUAmbiguous, "--dcgm-gpu"},
		{"index not served", two, "7", ErrGPUNotFound, "gpu 0"},
		{"UUID not served", two, "GPU-00000000-0000-0000-0000-000000000000", ErrGPUNotFound, "gpu 1"},
		{"MIG instances", mig, "0", ErrGPUAmbiguous, "MIG"},
		{"no DCGM series", []byte("# TYPE up gauge\nup 1\n"), "", ErrGPUNotFound, "no DCGM_FI_"},
		{"malformed", []byte("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 1\n"), "", ErrParse, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDCGM(tc.page, tc.selector)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.hint) {
				t.Fatalf("error = %v, want %v mentioning %q", err, tc.want, tc.hint)
			}
		})
	}
	if _, err := ParseDCGM(two, "nvidia0"); err == nil || !strings.Contains(err.Error(), "index") {
		t.Errorf("bad selector error = %v, want a hint about index or UUID", err)
	}
}

func TestParseDCGMInvalidValues(t *testing.T) {
	const l = `{gpu="0",UUID="GPU-aa"}`
	tests := []struct {
		name   string
		lines  []string
		absent func(HardwareSample) bool
		hint   string
	}{
		{"util above 100%", []string{"DCGM_FI_DEV_GPU_UTIL" + l + " 250"}, func(h HardwareSample) bool { return h.GPUUtil == nil }, "DCGM_FI_DEV_GPU_UTIL"},
		{"NaN temperature", []string{"DCGM_FI_DEV_GPU_TEMP" + l + " NaN"}, func(h HardwareSample) bool { return h.TemperatureCelsius == nil }, "NaN"},
		{"negative power", []string{"DCGM_FI_DEV_POWER_USAGE" + l + " -5"}, func(h HardwareSample) bool { return h.PowerWatts == nil }, "outside"},
		{"negative FB used", []string{"DCGM_FI_DEV_FB_USED" + l + " -1", "DCGM_FI_DEV_FB_FREE" + l + " 10"}, func(h HardwareSample) bool { return h.VRAMUsed == nil }, "negative"},
		{"zero framebuffer", []string{"DCGM_FI_DEV_FB_USED" + l + " 0", "DCGM_FI_DEV_FB_FREE" + l + " 0"}, func(h HardwareSample) bool { return h.VRAMUsed == nil }, "no framebuffer"},
		{"SM active as percent", []string{"DCGM_FI_PROF_SM_ACTIVE" + l + " 80"}, func(h HardwareSample) bool { return h.SMActive == nil }, "outside [0,1]"},
		{"fractional throttle mask", []string{"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" + l + " 1.5"}, func(h HardwareSample) bool { return h.ClockThrottleReasons == nil }, "not an integer"},
		{"infinite DRAM", []string{"DCGM_FI_PROF_DRAM_ACTIVE" + l + " +Inf"}, func(h HardwareSample) bool { return h.DRAMActive == nil }, "infinite"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hw, err := ParseDCGM([]byte(strings.Join(tc.lines, "\n")+"\n"), "0")
			if err != nil {
				t.Fatal(err)
			}
			if !tc.absent(hw) {
				t.Errorf("value present, want dropped: %+v", hw)
			}
			if j := strings.Join(hw.Invalid, "; "); !strings.Contains(j, tc.hint) {
				t.Errorf("Invalid = %q, want a mention of %q", j, tc.hint)
			}
		})
	}
}

func TestParseModels(t *testing.T) {
	tests := []struct {
		name    string
		body    []byte
		model   string
		maxLen  uint32
		invalid bool
		err     bool
	}{
		{"fixture", readFixture(t, "models.json"), "meta-llama/Llama-3.1-70B-Instruct", 8192, false, false},
		{"base model after LoRA adapter", readFixture(t, "models_lora.json"), "Qwen/Qwen2.5-7B-Instruct", 32768, false, false},
		{"no max_model_len", []byte(`{"data":[{"id":"m"}]}`), "m", 0, false, false},
		{"string max_model_len", []byte(`{"data":[{"id":"m","max_model_len":"8k"}]}`), "m", 0, true, false},
		{"negative max_model_len", []byte(`{"data":[{"id":"m","max_model_len":-1}]}`), "m", 0, true, false},
		{"huge max_model_len", []byte(`{"data":[{"id":"m","max_model_len":1e12}]}`), "m", 0, true, false},
		{"fractional max_model_len", []byte(`{"data":[{"id":"m","max_model_len":8192.5}]}`), "m", 0, true, false},
		{"no models", []byte(`{"object":"list","data":[]}`), "", 0, false, true},
		{"not JSON", []byte(`<html>`), "", 0, false, true},
		{"no id", []byte(`{"data":[{"max_model_len":10}]}`), "", 0, false, true},
		{"control character id", []byte(`{"data":[{"id":"a\u0000b"}]}`), "", 0, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := ParseModels(tc.body)
			if tc.err {
				if !errors.Is(err, ErrParse) {
					t.Fatalf("error = %v, want ErrParse", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ms.Model != tc.model || ms.MaxModelLen != tc.maxLen || (len(ms.Invalid) > 0) != tc.invalid {
				t.Fatalf("got %+v, want model %q max %d invalid %v", ms, tc.model, tc.maxLen, tc.invalid)
			}
		})
	}
}

// checkSignalsInRange fails when a set signal is not finite or out of its
// range.
func checkSignalsInRange(t testing.TB, s Signals) {
	t.Helper()
	for name, v := range map[string]*float64{
		"kv_cache_usage": s.KVCacheUsage, "error_rate": s.ErrorRate, "gpu_util": s.GPUUtil,
		"vram_used": s.VRAMUsed, "sm_active": s.SMActive, "dram_active": s.DRAMActive,
		"prefix_cache_hit_rate": s.PrefixCacheHitRate,
	} {
		if v != nil && (math.IsNaN(*v) || *v < 0 || *v > 1) {
			t.Errorf("%s = %v, want a fraction in [0,1]", name, *v)
		}
	}
	for name, v := range map[string]*float64{
		"queue_depth": s.QueueDepth, "running": s.Running, "ttft_p95_seconds": s.TTFTP95Seconds,
		"request_rate": s.RequestRate, "window_requests": s.WindowRequests,
		"temperature_celsius": s.TemperatureCelsius, "power_watts": s.PowerWatts,
	} {
		if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0) {
			t.Errorf("%s = %v, want finite and >= 0", name, *v)
		}
	}
}
