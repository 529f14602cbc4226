package cellagent

import (
	"math"
	"testing"
	"time"
)

// maxFuzzPage caps fuzz inputs, as the agent caps bodies.
const maxFuzzPage = 1 << 16

func addFixtureSeeds(f *testing.F, names ...string) {
	for _, n := range names {
		f.Add(readFixture(f, n))
	}
}

// FuzzParseVLLM: any page parses without panicking, and what comes out is
// finite and in range, alone and as a window delta against the fixture.
func FuzzParseVLLM(f *testing.F) {
	addFixtureSeeds(f, "vllm_v1_dp2.prom", "vllm_v0_legacy.prom")
	f.Add([]byte("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc -Inf\n"))
	f.Add([]byte("# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_bucket{le=\"1\"} 5\nvllm:time_to_first_token_seconds_count 3\n"))
	f.Add([]byte("# TYPE http_requests_total counter\nhttp_requests_total{handler=\"/v1/completions\",status=\"5xx\"} 1e308\nhttp_requests_total{handler=\"/v1/completions\",status=\"2xx\"} 1e308\n"))
	f.Add([]byte("# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\"} 100\nvllm:prefix_cache_queries_total{engine=\"1\"} NaN\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\"} 101\n"))
	f.Add([]byte("vllm:gpu_prefix_cache_queries_total 1e308\nvllm:gpu_prefix_cache_hits_total 1e308\nvllm:prefix_cache_hits_total -1\n"))
	f.Add([]byte{})
	base, err := ParseVLLM(readFixture(f, "vllm_v1_dp2.prom"), VLLMOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		if len(page) > maxFuzzPage {
			return
		}
		s, err := ParseVLLM(page, VLLMOptions{})
		if err != nil {
			return
		}
		checkSample(t, s)
		checkSignalsInRange(t, Derive(nil, s, 0))
		if !counterReset(base, s) {
			checkSignalsInRange(t, Derive(&base, s, time.Second))
		}
		w := window{span: 10 * time.Second}
		t0 := time.Unix(1_700_000_000, 0)
		w.add(t0, base)
		w.add(t0.Add(time.Second), s)
		checkSignalsInRange(t, w.derive())
	})
}

// checkSample fails when a parsed sample holds a value it should have
// dropped.
func checkSample(t *testing.T, s VLLMSample) {
	t.Helper()
	for name, v := range map[string]*float64{"queue": s.QueueDepth, "running": s.Running, "success": s.RequestSuccess} {
		if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0) {
			t.Fatalf("%s = %v", name, *v)
		}
	}
	for name, v := range map[string]*float64{"prefix queries": s.PrefixQueries, "prefix hits": s.PrefixHits} {
		if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0) {
			t.Fatalf("%s = %v", name, *v)
		}
	}
	if s.PrefixQueries != nil && s.PrefixHits != nil && *s.PrefixHits > *s.PrefixQueries {
		t.Fatalf("prefix hits %v above queries %v", *s.PrefixHits, *s.PrefixQueries)
	}
	if v := s.KVCacheUsage; v != nil && !(*v >= 0 && *v <= 1) {
		t.Fatalf("kv = %v", *v)
	}
	if c := s.Completions; c != nil && !(c.Total >= 0 && c.Errors >= 0 && c.Errors <= c.Total && !math.IsInf(c.Total, 0)) {
		t.Fatalf("completions = %+v", *c)
	}
	if h := s.TTFT; h != nil {
		if len(h.Buckets) == 0 || !math.IsInf(h.Buckets[len(h.Buckets)-1].UpperBound, 1) {
			t.Fatalf("histogram without +Inf bucket: %+v", h.Buckets)
		}
		for i, b := range h.Buckets {
			if math.IsNaN(b.Count) || math.IsInf(b.Count, 0) || b.Count < 0 {
				t.Fatalf("bucket count %v", b.Count)
			}
			if i > 0 && !(b.UpperBound > h.Buckets[i-1].UpperBound) {
				t.Fatalf("bucket bounds not increasing: %+v", h.Buckets)
			}
		}
	}
}

// FuzzParseDCGM: any page and selector parse without panicking, and the
// hardware values are finite and in range.
func FuzzParseDCGM(f *testing.F) {
	for _, n := range []string{"dcgm_2gpu.prom", "dcgm_1gpu_tensor.prom"} {
		page := readFixture(f, n)
		f.Add(page, "")
		f.Add(page, "0")
		f.Add(page, "3")
		f.Add(page, "GPU-9b2e7c44-03af-4d1e-a8c2-71f0be6d2f35")
	}
	f.Add([]byte("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} NaN\nDCGM_FI_DEV_FB_USED{gpu=\"0\"} 1e308\nDCGM_FI_DEV_FB_FREE{gpu=\"0\"} 1e308\n"), "0")
	f.Add([]byte("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{UUID=\"GPU-x\"} 9.1e15\n"), "GPU-x")
	f.Fuzz(func(t *testing.T, page []byte, selector string) {
		if len(page) > maxFuzzPage {
			return
		}
		hw, err := ParseDCGM(page, selector)
		if err != nil {
			return
		}
		s := Signals{}.mergeHardware(hw)
		checkSignalsInRange(t, s)
		if v := s.TemperatureCelsius; v != nil && *v > maxTemperatureC {
			t.Fatalf("temperature %v", *v)
		}
		if v := s.PowerWatts; v != nil && *v > maxPowerWatts {
			t.Fatalf("power %v", *v)
		}
		if v := s.ClockThrottleReasons; v != nil && *v >= maxThrottleMask {
			t.Fatalf("throttle mask %v", *v)
		}
	})
}

// FuzzParseModels: any body parses without panicking; a model id is
// bounded and a max_model_len is either 0 or a positive 32-bit count.
func FuzzParseModels(f *testing.F) {
	f.Add(readFixture(f, "models.json"))
	f.Add(readFixture(f, "models_lora.json"))
	f.Add([]byte(`{"data":[{"id":"m","max_model_len":1e400}]}`))
	f.Add([]byte(`{"data":[{"id":"m","parent":"","max_model_len":[1]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > maxFuzzPage {
			return
		}
		ms, err := ParseModels(body)
		if err != nil {
			return
		}
		if ms.Model == "" || len(ms.Model) > maxModelIDLen {
			t.Fatalf("model id %q", ms.Model)
		}
	})
}
