package sim

import (
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// catalogueProfiles returns a physics profile for every catalogue GPU,
// model, TP 1/2/4 and KV dtype that fits.
func catalogueProfiles(t *testing.T) []Profile {
	t.Helper()
	var ps []Profile
	for _, g := range GPUNames() {
		for _, m := range ModelNames() {
			for _, tp := range []int{1, 2, 4} {
				for _, kv := range KVDtypeNames() {
					p, err := PhysicsProfile(PhysicsSpec{GPU: g, Model: m, TP: tp, KVDtype: kv})
					if errors.Is(err, ErrBadPhysicsSpec) {
						continue // does not fit
					}
					if err != nil {
						t.Fatal(err)
					}
					ps = append(ps, p)
				}
			}
		}
	}
	if len(ps) < 20 {
		t.Fatalf("only %d catalogue combinations fit", len(ps))
	}
	return ps
}

func TestPhysicsDecodeStepAtLeastWeightStream(t *testing.T) {
	t.Parallel()
	for _, p := range catalogueProfiles(t) {
		r := p.Physics
		floor := time.Duration(r.Model.WeightBytes / float64(r.TP) / r.GPU.MemBandwidth * float64(time.Second))
		for _, batch := range []int{1, 8, 64} {
			if got := p.EstimateDecodeStep(batch, batch*1000); got < floor {
				t.Errorf("%s: decode step of %d = %v, below the weight stream at peak bandwidth %v", p.Name, batch, got, floor)
			}
		}
	}
}

func TestPhysicsPrefillAtLeastComputePeak(t *testing.T) {
	t.Parallel()
	for _, p := range catalogueProfiles(t) {
		r := p.Physics
		peak := r.GPU.FP16FLOPS
		if r.Model.Compute == DtypeFP8 && r.GPU.FP8FLOPS > 0 {
			peak = r.GPU.FP8FLOPS
		}
		for _, n := range []int{512, 4000, 20000} {
			floor := time.Duration(2 * r.Model.Params * float64(n) / float64(r.TP) / peak * float64(time.Second))
			if got := p.EstimatePrefill(n); got < floor {
				t.Errorf("%s: prefill of %d tokens = %v, below FLOPs/peak %v", p.Name, n, got, floor)
			}
		}
	}
}

func TestPhysicsStepMonotone(t *testing.T) {
	t.Parallel()
	for _, p := range catalogueProfiles(t) {
		prev := time.Duration(0)
		for batch := 1; batch <= 1024; batch *= 2 {
			d := p.EstimateDecodeStep(batch, batch*2000)
			if d < prev {
				t.Errorf("%s: decode step shrinks from %v to %v at batch %d", p.Name, prev, d, batch)
			}
			prev = d
		}
		prev = 0
		for ctx := 0; ctx <= 1<<20; ctx += 1 << 16 {
			d := p.EstimateDecodeStep(32, ctx)
			if d < prev {
				t.Errorf("%s: decode step shrinks from %v to %v at context %d", p.Name, prev, d, ctx)
			}
			prev = d
		}
		prev = 0
		for n := 256; n <= 65536; n *= 2 {
			d := p.EstimatePrefill(n)
			if d < prev {
				t.Errorf("%s: prefill shrinks from %v to %v at %d tokens", p.Name, prev, d, n)
			}
			prev = d
		}
	}
}

func TestPhysicsKVCapacity(t *testing.T) {
	t.Parallel()
	// vLLM's sizing by hand for 70B AWQ on one RTX PRO 6000: 0.9 × 97887
	// MiB − 37 GiB of weights − (1.5 GiB + 8192 tokens × (2 × 28672 + 4 ×
	// 8192) × 2 B of activations), over 80 × 8 × 128 × 2 × 2 B per token.
	free := 0.9*97887*(1<<20) - 37*(1<<30) - (1.5*(1<<30) + 8192*(2*28672+4*8192)*2)
	for _, tc := range []struct {
		kv       string
		perToken float64
	}{
		{"fp16", 80 * 8 * 128 * 2 * 2},
		{"fp8", 80 * 8 * 128 * 2 * 1},
	} {
		p, err := PhysicsProfile(PhysicsSpec{GPU: GPURTXPro6000, Model: ModelLlama31_70BAWQ, TP: 1, KVDtype: tc.kv})
		if err != nil {
			t.Fatal(err)
		}
		want := int(free/tc.perToken) / 16 * 16
		if p.KVCacheTokens != want {
			t.Errorf("kv %s: KVCacheTokens = %d, want %d", tc.kv, p.KVCacheTokens, want)
		}
	}
	fp16, _ := PhysicsProfile(PhysicsSpec{GPU: GPURTXPro6000, Model: ModelLlama31_70BAWQ, TP: 1})
	fp8, _ := PhysicsProfile(PhysicsSpec{GPU: GPURTXPro6000, Model: ModelLlama31_70BAWQ, TP: 1, KVDtype: "fp8"})
	if d := fp8.KVCacheTokens - 2*fp16.KVCacheTokens; d < 0 || d > 16 {
		t.Errorf("fp8 KV holds %d tokens, fp16 %d: want twice as many", fp8.KVCacheTokens, fp16.KVCacheTokens)
	}
	if got := (ModelSpec{Layers: 80, KVHeads: 8, HeadDim: 128}).KVBytesPerToken(DtypeFP16); got != 327680 {
		t.Errorf("Llama-3.1-70B fp16 KV bytes per token = %v, want 327680", got)
	}
	// Tensor parallelism spreads the weights: two GPUs hold more KV than
	// twice one.
	tp2, _ := PhysicsProfile(PhysicsSpec{GPU: GPURTXPro6000, Model: ModelLlama31_70BAWQ, TP: 2})
	if tp2.KVCacheTokens <= 2*fp16.KVCacheTokens {
		t.Errorf("TP 2 holds %d tokens, TP 1 %d", tp2.KVCacheTokens, fp16.KVCacheTokens)
	}
}

func TestPhysicsSchedulerDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		gpu          string
		seqs, budget int
	}{
		{GPURTXPro6000, 1024, 8192},
		{GPUH100SXM, 1024, 8192},
		{GPUH200SXM, 1024, 8192},
		{GPUA10080GB, 256, 2048}, // vLLM's A100 exception
	} {
		p, err := PhysicsProfile(PhysicsSpec{GPU: tc.gpu, Model: ModelLlama31_8B, TP: 1})
		if err != nil {
			t.Fatal(err)
		}
		if p.MaxNumSeqs != tc.seqs || p.MaxBatchedTokens != tc.budget {
			t.Errorf("%s: max_num_seqs %d, max_num_batched_tokens %d; want %d, %d", tc.gpu, p.MaxNumSeqs, p.MaxBatchedTokens, tc.seqs, tc.budget)
		}
		g, _ := LookupGPU(tc.gpu)
		if p.GPU.ModelName != g.DCGM.ModelName || p.GPU.ModelName == "" || p.Name != tc.gpu+"/llama-3.1-8b/tp1/kv-fp16" {
			t.Errorf("%s: profile %q reports GPU %q", tc.gpu, p.Name, p.GPU.ModelName)
		}
	}
}

func TestPhysicsProfileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		spec PhysicsSpec
		is   error
		want string
	}{
		{"unknown GPU", PhysicsSpec{GPU: "b300", Model: ModelLlama31_8B, TP: 1}, ErrUnknownGPU, GPUH100SXM},
		{"unknown model", PhysicsSpec{GPU: GPUH100SXM, Model: "gpt-5", TP: 1}, ErrUnknownModel, ModelLlama33_70BFP8},
		{"negative TP", PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B, TP: -1}, ErrBadPhysicsSpec, "tensor parallelism"},
		{"no TP", PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B}, ErrBadPhysicsSpec, "tensor parallelism"},
		{"bad KV dtype", PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B, TP: 1, KVDtype: "int3"}, ErrBadPhysicsSpec, "fp8"},
		{"does not fit", PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama33_70BFP8, TP: 1}, ErrBadPhysicsSpec, "does not fit"},
		{"bad efficiency", PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B, TP: 1, Efficiency: &Efficiency{MemBW: 1.5, MFU: 0.5, AllReduce: 0.5}}, ErrBadPhysicsSpec, "MemBW"},
	} {
		_, err := PhysicsProfile(tc.spec)
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %v naming %q", tc.name, err, tc.is, tc.want)
		}
	}
}

// TestPhysicsNIMCurve holds the frozen efficiencies to NVIDIA NIM's
// published load curve (Llama-3.3-70B FP8, 2×H100 SXM, 5000/500 tokens),
// each figure within ±30 %.
func TestPhysicsNIMCurve(t *testing.T) {
	t.Parallel()
	errs, rows := nimErrors(t, nil, 0)
	for i, r := range rows {
		pt := nimPublished[i]
		t.Logf("c=%d: TTFT %v (published %v), ITL %v (published %v), %d requests, %d preemptions",
			r.Concurrency, r.TTFTP50, pt.ttft, r.ITLMean, pt.itl, r.Requests, r.Preemptions)
		for j, what := range []string{"TTFT", "ITL"} {
			if e := math.Exp(errs[2*i+j]) - 1; math.Abs(e) > 0.30 {
				t.Errorf("c=%d: %s off by %+.0f%%, want within ±30%%", pt.c, what, 100*e)
			}
		}
	}
	// The curve has the published shape: ITL grows with concurrency and
	// c=100 saturates the KV cache (TTFT jumps by far more than the rest).
	for i := 1; i < len(rows); i++ {
		if rows[i].ITLMean <= rows[i-1].ITLMean {
			t.Errorf("ITL at c=%d (%v) not above c=%d (%v)", rows[i].Concurrency, rows[i].ITLMean, rows[i-1].Concurrency, rows[i-1].ITLMean)
		}
	}
	if rows[3].TTFTP50 < 4*rows[2].TTFTP50 {
		t.Errorf("TTFT at c=100 (%v) does not saturate over c=50 (%v)", rows[3].TTFTP50, rows[2].TTFTP50)
	}
}

// TestEstimatesMatchBatcher checks EstimatePrefill and EstimateDecodeStep
// against the Batcher's own steps, for fitted and physics profiles.
func TestEstimatesMatchBatcher(t *testing.T) {
	t.Parallel()
	phys, err := PhysicsProfile(PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B, TP: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []Profile{Profile70B(), ProfileTinyFast(), phys} {
		for _, prompt := range []int{1, 700, 8192, 20000} {
			if prompt+4 > p.KVCacheTokens {
				continue
			}
			b := mustBatcher(t, p)
			mustAdd(t, b, 1, prompt, 4)
			var until time.Duration
			for {
				st := b.Step()
				until += st.Duration
				if st.PrefillDuration <= 0 || st.PrefillDuration > st.Duration {
					t.Fatalf("%s: prefill step %+v: PrefillDuration out of (0, Duration]", p.Name, st)
				}
				if len(st.Tokens) == 1 {
					break
				}
				if q := b.QueuedPrefillTokens(); q <= 0 || q >= prompt {
					t.Fatalf("%s: %d of %d prompt tokens queued mid-prefill", p.Name, q, prompt)
				}
			}
			if got := p.EstimatePrefill(prompt); got != until {
				t.Errorf("%s: EstimatePrefill(%d) = %v, batcher took %v", p.Name, prompt, got, until)
			}
			if q := b.QueuedPrefillTokens(); q != 0 {
				t.Errorf("%s: %d prompt tokens queued after the prefill", p.Name, q)
			}
			st := b.Step() // one decode: context prompt+1
			if want := p.EstimateDecodeStep(1, prompt+1); st.Duration != want || st.PrefillDuration != 0 {
				t.Errorf("%s: decode step %v (prefill %v), EstimateDecodeStep %v", p.Name, st.Duration, st.PrefillDuration, want)
			}
		}
	}
}

func TestFittedPrefillDuration(t *testing.T) {
	t.Parallel()
	p := testProfile() // 1000 prefill tokens/s
	b := mustBatcher(t, p)
	mustAdd(t, b, 1, 100, 2)
	mustAdd(t, b, 2, 50, 2)
	if q := b.QueuedPrefillTokens(); q != 150 {
		t.Fatalf("queued prefill = %d, want 150", q)
	}
	st := b.Step()
	if st.PrefillDuration != 150*time.Millisecond || st.Duration != 160*time.Millisecond {
		t.Fatalf("step = %v with prefill %v, want 160ms with 150ms", st.Duration, st.PrefillDuration)
	}
}

func TestQueuedPrefillTokensCountsChunksAndWaiting(t *testing.T) {
	t.Parallel()
	p := testProfile() // 256-token budget, 8 sequences
	b := mustBatcher(t, p)
	mustAdd(t, b, 1, 600, 2)
	mustAdd(t, b, 2, 100, 2)
	b.Step() // 256 of the first prompt
	if q := b.QueuedPrefillTokens(); q != 600-256+100 {
		t.Fatalf("queued prefill = %d, want %d", q, 600-256+100)
	}
}

func TestSweepShape(t *testing.T) {
	t.Parallel()
	p, err := PhysicsProfile(PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B, TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	spec := SweepSpec{Concurrency: []int{1, 8, 64}, PromptTokens: 1000, OutputTokens: 64}
	rows, err := Sweep(p, spec)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Sweep(p, spec)
	for i, r := range rows {
		if r != again[i] {
			t.Fatalf("not deterministic:\n%+v\n%+v", r, again[i])
		}
		if r.Concurrency != spec.Concurrency[i] || r.Requests < 1 || r.TTFTP50 <= 0 || r.ITLMean <= 0 || r.OutputTokensPerSec <= 0 {
			t.Fatalf("row %+v", r)
		}
		if r.TTFTP50 < p.FrontendLatency+p.EstimatePrefill(1000)-time.Microsecond {
			t.Errorf("c=%d: TTFT %v below frontend + idle prefill %v", r.Concurrency, r.TTFTP50, p.FrontendLatency+p.EstimatePrefill(1000))
		}
		if i > 0 {
			prev := rows[i-1]
			if r.ITLMean < prev.ITLMean || r.OutputTokensPerSec <= prev.OutputTokensPerSec {
				t.Errorf("c=%d: ITL %v, %.0f tok/s; c=%d: ITL %v, %.0f tok/s: want slower tokens, more throughput",
					r.Concurrency, r.ITLMean, r.OutputTokensPerSec, prev.Concurrency, prev.ITLMean, prev.OutputTokensPerSec)
			}
		}
	}
	// At c=1 nothing queues: ITL is the decode step of one sequence.
	if d := rows[0].ITLP50 - p.EstimateDecodeStep(1, 1032); d < 0 || d > 200*time.Microsecond {
		t.Errorf("c=1 ITL P50 %v, decode step %v", rows[0].ITLP50, p.EstimateDecodeStep(1, 1032))
	}
}

func TestSweepErrors(t *testing.T) {
	t.Parallel()
	p, err := PhysicsProfile(PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B, TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec SweepSpec
		want string
	}{
		{"no levels", SweepSpec{PromptTokens: 10, OutputTokens: 10}, "no concurrency"},
		{"zero concurrency", SweepSpec{Concurrency: []int{1, 0}, PromptTokens: 10, OutputTokens: 10}, "concurrency 0"},
		{"huge concurrency", SweepSpec{Concurrency: []int{1 << 30}, PromptTokens: 10, OutputTokens: 10}, "concurrency 1073741824"},
		{"huge requests", SweepSpec{Concurrency: []int{1}, PromptTokens: 10, OutputTokens: 10, Requests: 1 << 30}, "requests"},
		{"zero output", SweepSpec{Concurrency: []int{1}, PromptTokens: 10}, "output 0"},
		{"beyond context", SweepSpec{Concurrency: []int{1}, PromptTokens: 131000, OutputTokens: 1000}, "exceed the context"},
		{"fewer requests than clients", SweepSpec{Concurrency: []int{8}, PromptTokens: 10, OutputTokens: 10, Requests: 4}, "at least one per client"},
	} {
		_, err := Sweep(p, tc.spec)
		if !errors.Is(err, ErrBadSweep) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrBadSweep naming %q", tc.name, err, tc.want)
		}
	}
	// A fitted profile's context is its KV cache.
	if _, err := Sweep(ProfileTinyFast(), SweepSpec{Concurrency: []int{1}, PromptTokens: 40000, OutputTokens: 1}); !errors.Is(err, ErrBadSweep) {
		t.Errorf("tiny profile beyond its KV cache: err = %v", err)
	}
}

// TestEngineRunsPhysicsProfile serves a request from a live engine on a
// physics profile and checks the GPU identity comes from the catalogue.
func TestEngineRunsPhysicsProfile(t *testing.T) {
	t.Parallel()
	p, err := PhysicsProfile(PhysicsSpec{GPU: GPUH200SXM, Model: ModelLlama31_8B, TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	e := startEngine(t, EngineConfig{CustomProfile: &p, Model: ModelLlama31_8B, MaxModelLen: 8192, TimeScale: 0.01, Seed: 1}, Deps{})
	if got := e.GPU().GPUInfo().ModelName; got != "NVIDIA H200" {
		t.Fatalf("GPU model name %q, want NVIDIA H200", got)
	}
	c := newClient(t)
	resp, body := post(t, c, url(e, "/v1/completions"), `{"model":"`+ModelLlama31_8B+`","prompt":"`+strings.Repeat("x", 400)+`","max_tokens":3}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	mfs := scrape(t, c, url(e, "/metrics"))
	if v, ok := metricValue(mfs, "vllm:generation_tokens_total", nil); !ok || v != 3 {
		t.Errorf("vllm:generation_tokens_total = %v (found %v), want 3", v, ok)
	}
}

func TestValidateRejectsBrokenRoofline(t *testing.T) {
	t.Parallel()
	good, err := PhysicsProfile(PhysicsSpec{GPU: GPUH100SXM, Model: ModelLlama31_8B, TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(r *Roofline)
	}{
		{"TP 0", func(r *Roofline) { r.TP = 0 }},
		{"no bandwidth", func(r *Roofline) { r.GPU.MemBandwidth = 0 }},
		{"no model", func(r *Roofline) { r.Model = ModelSpec{} }},
		{"bad KV dtype", func(r *Roofline) { r.KVDtype = "int2" }},
		{"zero MFU", func(r *Roofline) { r.Eff.MFU = 0 }},
	} {
		p := good
		r := *good.Physics
		tc.mutate(&r)
		p.Physics = &r
		if err := p.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", tc.name)
		}
		if _, err := NewBatcher(p); err == nil {
			t.Errorf("%s: NewBatcher accepted it", tc.name)
		}
	}
}

// BenchmarkSweepNIM times the NIM curve (four levels, 7,600 requests of
// 5000/500 tokens) in virtual time.
func BenchmarkSweepNIM(b *testing.B) {
	p, err := PhysicsProfile(nimSpec(nil))
	if err != nil {
		b.Fatal(err)
	}
	spec := SweepSpec{Concurrency: []int{1, 25, 50, 100}, PromptTokens: 5000, OutputTokens: 500}
	for b.Loop() {
		if _, err := Sweep(p, spec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBatcherStepPhysics times one step of a 64-sequence decode batch
// with a prefill chunk on a physics profile.
func BenchmarkBatcherStepPhysics(b *testing.B) {
	p, err := PhysicsProfile(PhysicsSpec{GPU: GPURTXPro6000, Model: ModelLlama31_70BAWQ, TP: 1})
	if err != nil {
		b.Fatal(err)
	}
	bt, err := NewBatcher(p)
	if err != nil {
		b.Fatal(err)
	}
	id := SeqID(0)
	for range 64 {
		id++
		if err := bt.Add(id, 512, 128); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		st := bt.Step()
		for _, ev := range st.Tokens {
			if ev.Done {
				id++
				if err := bt.Add(id, 512, 128); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}
