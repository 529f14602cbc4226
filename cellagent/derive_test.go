package cellagent

import (
	"math"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func mustParse(t *testing.T, p enginePage) VLLMSample {
	t.Helper()
	s, err := ParseVLLM(p.render(), VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Invalid) > 0 {
		t.Fatalf("invalid values in a clean page: %v", s.Invalid)
	}
	return s
}

func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestWindowP95FromDeltas: the window's P95 reflects only the requests in
// the window, not the engine's whole history.
func TestWindowP95FromDeltas(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var p enginePage
	// A long quiet history: 10,000 fast requests.
	p.observeTTFT(repeat(0.03, 10000)...)
	p.respond("2xx", 10000)
	w := window{span: 10 * time.Second}
	w.add(t0, mustParse(t, p))
	// Then a slow second: 100 requests between 0.5 and 0.75 s.
	p.observeTTFT(repeat(0.6, 100)...)
	p.respond("2xx", 100)
	w.add(t0.Add(time.Second), mustParse(t, p))
	sig := w.derive()
	// All 100 window observations lie in (0.5, 0.75]: rank 95 of 100.
	want := 0.5 + 0.25*95.0/100.0
	wantVal(t, "TTFTP95Seconds", sig.TTFTP95Seconds, &want)
	cum := Derive(nil, mustParse(t, p), 0)
	if cum.TTFTP95Seconds == nil || *cum.TTFTP95Seconds > 0.05 {
		t.Fatalf("cumulative P95 = %v; the test needs it dominated by history", cum.TTFTP95Seconds)
	}
	reqs, rate := 100.0, 100.0
	wantVal(t, "WindowRequests", sig.WindowRequests, &reqs)
	wantVal(t, "RequestRate", sig.RequestRate, &rate)
	zero := 0.0
	wantVal(t, "ErrorRate", sig.ErrorRate, &zero)
}

func TestWindowErrorRate(t *testing.T) {
	tests := []struct {
		name  string
		first map[string]float64
		then  map[string]float64
		want  float64
		total float64
	}{
		{"grouped", map[string]float64{"2xx": 500, "4xx": 5}, map[string]float64{"2xx": 90, "4xx": 4, "5xx": 6}, 0.1, 100},
		{"exact codes", map[string]float64{"200": 500}, map[string]float64{"200": 75, "400": 20, "503": 5}, 0.25, 100},
		{"all errors", map[string]float64{"200": 1}, map[string]float64{"500": 8}, 1, 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1_700_000_000, 0)
			var p enginePage
			for st, n := range tc.first {
				p.respond(st, n)
			}
			w := window{span: 10 * time.Second}
			w.add(t0, mustParse(t, p))
			for st, n := range tc.then {
				p.respond(st, n)
			}
			w.add(t0.Add(2*time.Second), mustParse(t, p))
			sig := w.derive()
			wantVal(t, "ErrorRate", sig.ErrorRate, &tc.want)
			wantVal(t, "WindowRequests", sig.WindowRequests, &tc.total)
		})
	}
}

// TestWindowNoTraffic: no request in the window leaves TTFT and error rate
// absent, not 0; the evidence counts say 0.
func TestWindowNoTraffic(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var p enginePage
	p.observeTTFT(0.2, 0.3)
	p.respond("2xx", 2)
	w := window{span: 10 * time.Second}
	w.add(t0, mustParse(t, p))
	w.add(t0.Add(time.Second), mustParse(t, p))
	sig := w.derive()
	zero := 0.0
	wantVal(t, "TTFTP95Seconds", sig.TTFTP95Seconds, nil)
	wantVal(t, "ErrorRate", sig.ErrorRate, nil)
	wantVal(t, "WindowRequests", sig.WindowRequests, &zero)
	wantVal(t, "RequestRate", sig.RequestRate, &zero)

	// A single sample (the first scrape) has no window at all.
	w2 := window{span: 10 * time.Second}
	w2.add(t0, mustParse(t, p))
	s2 := w2.derive()
	if s2.TTFTP95Seconds != nil || s2.ErrorRate != nil || s2.WindowRequests != nil || s2.RequestRate != nil {
		t.Errorf("one sample gave windowed signals: %+v", s2)
	}
	if s2.QueueDepth == nil {
		t.Error("one sample lost its gauges")
	}
}

// TestWindowCounterReset: an engine restart (counters fall) never yields a
// negative delta; the window restarts from the reset sample.
func TestWindowCounterReset(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var p enginePage
	p.observeTTFT(repeat(0.05, 1000)...)
	p.respond("2xx", 990)
	p.respond("5xx", 10)
	w := window{span: 10 * time.Second}
	w.add(t0, mustParse(t, p))
	p.observeTTFT(repeat(0.05, 10)...)
	p.respond("2xx", 10)
	if w.add(t0.Add(time.Second), mustParse(t, p)) {
		t.Fatal("reset reported for growing counters")
	}

	// The engine restarts: fresh counters with a little new traffic.
	var fresh enginePage
	fresh.observeTTFT(2, 2, 2)
	fresh.respond("2xx", 2)
	fresh.respond("5xx", 1)
	if !w.add(t0.Add(2*time.Second), mustParse(t, fresh)) {
		t.Fatal("counter reset not detected")
	}
	sig := w.derive()
	if sig.TTFTP95Seconds != nil || sig.ErrorRate != nil || sig.WindowRequests != nil || sig.RequestRate != nil {
		t.Fatalf("windowed signals right after a reset: %+v", sig)
	}
	// The next sample measures from the reset sample.
	fresh.observeTTFT(repeat(0.3, 20)...)
	fresh.respond("2xx", 16)
	fresh.respond("5xx", 4)
	if w.add(t0.Add(3*time.Second), mustParse(t, fresh)) {
		t.Fatal("reset reported again")
	}
	sig = w.derive()
	wantErr, wantReqs, wantRate := 0.2, 20.0, 16.0
	wantVal(t, "ErrorRate", sig.ErrorRate, &wantErr)
	wantVal(t, "WindowRequests", sig.WindowRequests, &wantReqs)
	wantVal(t, "RequestRate", sig.RequestRate, &wantRate)
	if sig.TTFTP95Seconds == nil || *sig.TTFTP95Seconds > 0.5 || *sig.TTFTP95Seconds < 0.25 {
		t.Fatalf("P95 after reset = %v, want within the 0.3 s bucket (0.25, 0.5]", sig.TTFTP95Seconds)
	}
	checkSignalsInRange(t, sig)
}

func TestCounterResetDetectsEachCounter(t *testing.T) {
	base := func() VLLMSample {
		var p enginePage
		p.observeTTFT(0.1, 0.2)
		p.respond("2xx", 5)
		p.respond("5xx", 2)
		p.admit(900, 300)
		s, _ := ParseVLLM(p.render(), VLLMOptions{})
		return s
	}
	tests := []struct {
		name   string
		mutate func(s *VLLMSample)
	}{
		{"request success down", func(s *VLLMSample) { *s.RequestSuccess-- }},
		{"completions total down", func(s *VLLMSample) { s.Completions.Total-- }},
		{"errors down", func(s *VLLMSample) { s.Completions.Errors-- }},
		{"bucket down", func(s *VLLMSample) { s.TTFT.Buckets[10].Count-- }},
		{"histogram gone", func(s *VLLMSample) { s.TTFT = nil }},
		{"layout changed", func(s *VLLMSample) { s.TTFT.Buckets = s.TTFT.Buckets[1:] }},
		{"http series gone", func(s *VLLMSample) { s.Completions = nil }},
		{"prefix queries down", func(s *VLLMSample) { *s.PrefixQueries-- }},
		{"prefix hits down", func(s *VLLMSample) { *s.PrefixHits-- }},
		{"prefix counters gone", func(s *VLLMSample) { s.PrefixQueries, s.PrefixHits = nil, nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prev, cur := base(), base()
			tc.mutate(&cur)
			if !counterReset(prev, cur) {
				t.Fatal("reset not detected")
			}
			if counterReset(prev, base()) {
				t.Fatal("reset detected for equal samples")
			}
		})
	}
}

// TestWindowPrefixCacheHitRate: the hit rate is the hits delta over the
// queries delta; absent when the window looked nothing up (no admission,
// or prefix caching off); never outside [0,1]; restarted with the window
// when the engine restarts.
func TestWindowPrefixCacheHitRate(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var p enginePage
	p.admit(100000, 90000) // a history of hits
	w := window{span: 10 * time.Second}
	w.add(t0, mustParse(t, p))
	p.admit(4000, 1000)
	w.add(t0.Add(time.Second), mustParse(t, p))
	quarter := 0.25
	wantVal(t, "PrefixCacheHitRate", w.derive().PrefixCacheHitRate, &quarter)

	// No admission since the window's start: absent, not 0.
	idle := window{span: 10 * time.Second}
	idle.add(t0, mustParse(t, p))
	idle.add(t0.Add(time.Second), mustParse(t, p))
	wantVal(t, "PrefixCacheHitRate (idle)", idle.derive().PrefixCacheHitRate, nil)

	// Prefix caching off: the counters stay at 0.
	var off enginePage
	off.respond("2xx", 5)
	w0 := window{span: 10 * time.Second}
	w0.add(t0, mustParse(t, off))
	off.respond("2xx", 5)
	w0.add(t0.Add(time.Second), mustParse(t, off))
	wantVal(t, "PrefixCacheHitRate (off)", w0.derive().PrefixCacheHitRate, nil)

	// The engine restarts: counters fall, the window restarts from there.
	var fresh enginePage
	fresh.admit(500, 0)
	if !w.add(t0.Add(2*time.Second), mustParse(t, fresh)) {
		t.Fatal("prefix counters falling not taken as a reset")
	}
	wantVal(t, "PrefixCacheHitRate (after reset)", w.derive().PrefixCacheHitRate, nil)
	fresh.admit(1000, 500)
	w.add(t0.Add(3*time.Second), mustParse(t, fresh))
	half := 0.5
	sig := w.derive()
	wantVal(t, "PrefixCacheHitRate (from the reset sample)", sig.PrefixCacheHitRate, &half)
	checkSignalsInRange(t, sig)

	// The older names (vLLM 0.8) are read when the current ones are
	// absent.
	legacy := []byte("# TYPE vllm:gpu_prefix_cache_queries_total counter\nvllm:gpu_prefix_cache_queries_total{engine=\"0\"} 40\n" +
		"# TYPE vllm:gpu_prefix_cache_hits_total counter\nvllm:gpu_prefix_cache_hits_total{engine=\"0\"} 10\n")
	s, err := ParseVLLM(legacy, VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantVal(t, "PrefixCacheHitRate (legacy names)", Derive(nil, s, 0).PrefixCacheHitRate, &quarter)
}

// TestWindowSpan: the base is the newest sample at or before now−span.
func TestWindowSpan(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	w := window{span: 10 * time.Second}
	var p enginePage
	for i := 0; i <= 15; i++ {
		p.respond("2xx", 10) // 10 per second
		w.add(t0.Add(time.Duration(i)*time.Second), mustParse(t, p))
	}
	if got := w.samples[0].at; !got.Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("base at %v, want t0+5s", got.Sub(t0))
	}
	sig := w.derive()
	reqs, rate := 100.0, 10.0
	wantVal(t, "WindowRequests", sig.WindowRequests, &reqs)
	wantVal(t, "RequestRate", sig.RequestRate, &rate)

	// A sample at the same instant replaces the last one.
	n := len(w.samples)
	p.respond("2xx", 5)
	w.add(t0.Add(15*time.Second), mustParse(t, p))
	if len(w.samples) != n {
		t.Fatalf("same-instant sample appended: %d samples, want %d", len(w.samples), n)
	}
	w.clear()
	if s := w.derive(); s.QueueDepth != nil {
		t.Fatal("cleared window still derives")
	}
}

// TestHistogramQuantileProperties checks HistogramQuantile against a
// reference over random histograms: the answer lies in the bucket where the
// cumulative count first reaches the rank, and grows with q.
func TestHistogramQuantileProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(rt, "buckets")
		bounds := make([]float64, 0, n)
		seen := map[float64]bool{}
		for len(bounds) < n {
			b := float64(rapid.IntRange(1, 10000).Draw(rt, "bound")) / 1000
			if !seen[b] {
				seen[b] = true
				bounds = append(bounds, b)
			}
		}
		sort.Float64s(bounds)
		buckets := make([]Bucket, 0, n+1)
		cum := 0.0
		for _, b := range bounds {
			cum += float64(rapid.IntRange(0, 50).Draw(rt, "count"))
			buckets = append(buckets, Bucket{UpperBound: b, Count: cum})
		}
		cum += float64(rapid.IntRange(0, 5).Draw(rt, "overflow"))
		buckets = append(buckets, Bucket{UpperBound: math.Inf(1), Count: cum})
		q := rapid.Float64Range(0.01, 1).Draw(rt, "q")
		v, ok := HistogramQuantile(q, buckets)
		if cum == 0 {
			if ok {
				rt.Fatalf("ok with no observations")
			}
			return
		}
		if !ok {
			rt.Fatalf("not ok for %v", buckets)
		}
		rank := q * cum
		i := 0
		for i < len(buckets)-1 && buckets[i].Count < rank {
			i++
		}
		lo, hi := 0.0, buckets[len(buckets)-2].UpperBound
		if i < len(buckets)-1 {
			hi = buckets[i].UpperBound
			if i > 0 {
				lo = buckets[i-1].UpperBound
			}
		} else {
			lo = hi
		}
		if v < lo-1e-12 || v > hi+1e-12 {
			rt.Fatalf("q=%v: %v outside its bucket [%v, %v] (%v)", q, v, lo, hi, buckets)
		}
		if v2, ok2 := HistogramQuantile(math.Min(1, q+0.05), buckets); !ok2 || v2 < v-1e-12 {
			rt.Fatalf("quantile not monotonic in q: %v then %v", v, v2)
		}
	})
}
