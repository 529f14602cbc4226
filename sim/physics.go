package sim

import (
	"fmt"
	"math"
	"time"
)

// Efficiency holds the only fitted constants of the physics engine: how
// much of the spec-sheet peaks a vLLM engine achieves, and its fixed
// overheads. One set serves every GPU and model of the catalogue.
type Efficiency struct {
	// MemBW is the fraction of peak memory bandwidth achieved when a step
	// streams the weights and the KV cache.
	MemBW float64
	// MFU is the fraction of the dense tensor-core peak (of the model's
	// compute dtype) achieved by the matrix multiplications and attention.
	MFU float64
	// AllReduce is the fraction of the GPU-to-GPU link bandwidth achieved by
	// the tensor-parallel all-reduces.
	AllReduce float64
	// AllReduceLatency is the fixed cost of one all-reduce (kernel launch and
	// synchronisation); a TP step does two per layer.
	AllReduceLatency time.Duration
	// Step is the fixed cost of one engine step (scheduling, input
	// preparation, sampling launch).
	Step time.Duration
	// Seq is the added cost per scheduled sequence in a step (per-sequence
	// scheduling, detokenisation and output processing).
	Seq time.Duration
	// Frontend is the fixed time a request spends in the API server before
	// the engine core sees it (there is no random frontend jitter).
	Frontend time.Duration
}

// FittedEfficiency returns the frozen efficiencies and overheads.
//
// How they were fitted. The only data are single-engine load curves: NVIDIA
// NIM's published figures for Llama-3.3-70B FP8 on 2×H100 SXM (TP 2), 5000
// input and 500 output tokens, closed loop at a fixed concurrency:
//
//	c=1:   TTFT 407 ms, ITL 18.6 ms
//	c=25:  TTFT 689 ms, ITL 38.8 ms
//	c=50:  TTFT 835 ms, ITL 59.7 ms
//	c=100: TTFT 8.0 s (saturated), ITL 92.9 ms
//
// The model is h100-sxm/llama-3.3-70b-fp8, TP 2, FP8 KV cache (NIM's FP8
// profile keeps the KV cache in FP8: with an fp16 cache 2×H100 hold only
// about 40 requests of 5500 tokens, so c=50 would queue, which the
// published TTFT does not show). TestPhysicsFit (ISOBAR_FIT=1) ran Sweep
// with its default 40×c requests per level and minimised the largest |ln(model ÷
// published)| over the eight figures (TTFT P50 and mean ITL at each
// concurrency), by coordinate descent over the grids MemBW 0.55–0.95,
// MFU 0.30–0.80, AllReduce 0.40–0.90, AllReduceLatency 0–30 µs, Step
// 0–6 ms, Seq 0–400 µs, Frontend 0–60 ms, from three starting points,
// until no single coordinate improved it (ties broken by the sum of
// squares). The best point has a largest error of 13.8 % (TTFT at c=25);
// the landscape is flat around it (a start at MemBW 0.85 ended at 14.2 %).
// The fit puts the all-reduce latency at zero: at TP 2 on NVLink it is
// absorbed in the per-step overhead. docs/bench.md ("The physics
// engine") lists the resulting figures and the error of each;
// TestPhysicsNIMCurve holds the frozen values to ±30 % of every figure.
func FittedEfficiency() Efficiency {
	return Efficiency{
		MemBW:            0.70,
		MFU:              0.55,
		AllReduce:        0.60,
		AllReduceLatency: 0,
		Step:             time.Millisecond,
		Seq:              50 * time.Microsecond,
		Frontend:         20 * time.Millisecond,
	}
}

func (e Efficiency) validate() error {
	bad := func(f float64) bool { return !(f > 0) || f > 1 }
	switch {
	case bad(e.MemBW) || bad(e.MFU) || bad(e.AllReduce):
		return fmt.Errorf("%w: efficiencies MemBW, MFU and AllReduce must be in (0,1]", ErrBadPhysicsSpec)
	case e.AllReduceLatency < 0 || e.Step < 0 || e.Seq < 0 || e.Frontend < 0:
		return fmt.Errorf("%w: overheads must be >= 0", ErrBadPhysicsSpec)
	}
	return nil
}

// Roofline is the physics timing model of one vLLM engine: a model from
// the catalogue on TP GPUs from the catalogue. It is immutable once built
// by PhysicsProfile.
//
// One step of the engine, with d decoding sequences of C context tokens in
// all, prefill chunks of P tokens in all (whose attention spans A
// query-key pairs, causal, from each chunk's position in its prompt, and
// which read K tokens already cached), and n sequences scheduled, lasts
//
//	memory  = (W/TP + (C + K + P + d) × kv/TP) ÷ (bandwidth × MemBW)
//	compute = (2 × params × (P + d) + 4 × layers × q_heads × head_dim × (A + C)) / TP
//	          ÷ (dense peak of the compute dtype × MFU)
//	step    = max(memory, compute)
//	        + [TP > 1] 2 × layers × (AllReduceLatency + (P + d) × hidden × 2 B × 2(TP−1)/TP
//	                                  ÷ (link bandwidth × AllReduce))
//	        + Step + Seq × n
//
// where W is the weight bytes and kv the KV bytes per token of the whole
// model. Memory traffic and tensor-core work overlap within a step (the
// kernels of one forward pass stream weights while they multiply), so the
// step is bound by the larger: a small decode batch is bound by reading
// the weights, a step with a long prefill chunk by compute — the roofline.
// All-reduces and the fixed overheads do not overlap and add.
type Roofline struct {
	GPU   GPUSpec
	Model ModelSpec
	TP    int
	// KVDtype is the KV cache's dtype.
	KVDtype Dtype
	Eff     Efficiency
}

// stepLoad is what one step computes, as the roofline needs it.
type stepLoad struct {
	scheduled int
	decodes   int
	decodeCtx int // context tokens of the decoding sequences
	prefill   int // prompt tokens computed
	// prefillCtx counts, over the prefill chunks, the tokens of the same
	// prompt already in the KV cache (which the chunk's attention reads).
	prefillCtx int
	// prefillPairs counts the causal query-key pairs of the prefill chunks'
	// attention: chunk×start + chunk×(chunk+1)/2 for a chunk at start.
	prefillPairs float64
}

// addChunk adds a prefill chunk of n tokens starting at position start.
func (l *stepLoad) addChunk(start, n int) {
	l.prefill += n
	l.prefillCtx += start
	l.prefillPairs += float64(n)*float64(start) + float64(n)*float64(n+1)/2
}

func (r *Roofline) peakFLOPS() float64 {
	if r.Model.Compute == DtypeFP8 && r.GPU.FP8FLOPS > 0 {
		return r.GPU.FP8FLOPS
	}
	return r.GPU.FP16FLOPS
}

// seconds returns the step time in seconds (0 for an empty step).
func (r *Roofline) seconds(l stepLoad) float64 {
	if l.scheduled == 0 {
		return 0
	}
	tp := float64(r.TP)
	kv := r.Model.KVBytesPerToken(r.KVDtype) / tp
	tokens := float64(l.prefill + l.decodes)
	bytes := r.Model.WeightBytes/tp + float64(l.decodeCtx+l.prefillCtx+l.prefill+l.decodes)*kv
	mem := bytes / (r.GPU.MemBandwidth * r.Eff.MemBW)
	attn := 4 * float64(r.Model.Layers*r.Model.QHeads*r.Model.HeadDim) * (l.prefillPairs + float64(l.decodeCtx))
	flops := (2*r.Model.Params*tokens + attn) / tp
	compute := flops / (r.peakFLOPS() * r.Eff.MFU)
	s := math.Max(mem, compute)
	if r.TP > 1 {
		per := tokens * float64(r.Model.Hidden) * 2 * 2 * (tp - 1) / tp / (r.GPU.LinkBandwidth * r.Eff.AllReduce)
		s += 2 * float64(r.Model.Layers) * (r.Eff.AllReduceLatency.Seconds() + per)
	}
	s += r.Eff.Step.Seconds() + r.Eff.Seq.Seconds()*float64(l.scheduled)
	return s
}

func secondsToDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// stepDuration returns how long a step with load l lasts and the part of
// it due to prefill. For a fitted profile the prefill part is prefill ÷
// PrefillTokensPerSec; for a physics profile it is the step's duration
// less that of the same step without its prefill chunks (the whole step
// when nothing decodes).
func (p *Profile) stepDuration(l stepLoad) (total, prefill time.Duration) {
	if r := p.Physics; r != nil {
		total = secondsToDuration(r.seconds(l))
		if l.prefill > 0 {
			rest := l
			rest.prefill, rest.prefillCtx, rest.prefillPairs = 0, 0, 0
			rest.scheduled = l.decodes
			prefill = total - secondsToDuration(r.seconds(rest))
		}
		return total, prefill
	}
	prefill = time.Duration(float64(l.prefill) / p.PrefillTokensPerSec * float64(time.Second))
	total = p.StepBase +
		time.Duration(l.decodes)*p.DecodePerSeq +
		time.Duration(float64(p.AttnPerKToken)*float64(l.decodeCtx)/1000) +
		prefill
	return total, prefill
}

// EstimatePrefill returns the time to prefill a prompt of tokens on an
// otherwise idle engine: the steps of its chunks under the token budget
// (MaxBatchedTokens), frontend latency excluded. It works for fitted and
// physics profiles alike; tokens < 1 gives 0.
func (p Profile) EstimatePrefill(tokens int) time.Duration {
	var d time.Duration
	for start := 0; start < tokens && p.MaxBatchedTokens > 0; {
		n := min(tokens-start, p.MaxBatchedTokens)
		l := stepLoad{scheduled: 1}
		l.addChunk(start, n)
		t, _ := p.stepDuration(l)
		d += t
		start += n
	}
	return d
}

// EstimateDecodeStep returns the duration of a step in which batch
// sequences with contextTokens tokens of context in all each decode one
// token, with no prefill. batch < 1 gives 0.
func (p Profile) EstimateDecodeStep(batch, contextTokens int) time.Duration {
	if batch < 1 {
		return 0
	}
	d, _ := p.stepDuration(stepLoad{scheduled: batch, decodes: batch, decodeCtx: max(contextTokens, 0)})
	return d
}

// PhysicsSpec selects a physics engine: a catalogue GPU and model, the
// tensor-parallel degree and the KV-cache dtype.
type PhysicsSpec struct {
	// GPU and Model are catalogue names (GPUNames, ModelNames).
	GPU, Model string
	// TP is the tensor-parallel degree (GPUs per engine), 1–64.
	TP int
	// KVDtype is "fp16" (the default: vLLM's auto for these models) or
	// "fp8".
	KVDtype string
	// Efficiency overrides FittedEfficiency (used to fit it); nil uses it.
	Efficiency *Efficiency
}

// Memory vLLM keeps out of the KV cache on each GPU besides the weights:
// non-torch memory (CUDA context, NCCL buffers, CUDA graphs), estimated
// at 1.5 GiB, plus the activations of the profiling forward pass over
// max_num_batched_tokens tokens (gate/up projections of the MLP shard and
// four hidden-sized buffers, 2 bytes each).
const nonTorchReserve = 1.5 * (1 << 30)

// activationReserve is what one GPU keeps for activations and non-torch
// memory.
func activationReserve(m ModelSpec, tp, maxBatchedTokens int) float64 {
	perToken := float64(2*m.Intermediate/tp+4*m.Hidden) * 2
	return nonTorchReserve + float64(maxBatchedTokens)*perToken
}

// KVCacheTokensFor returns the KV-cache capacity in tokens that vLLM
// derives for the model on tp GPUs of g with the given KV dtype and token
// budget, in whole 16-token blocks: on each GPU, gpu_memory_utilization
// (0.9) × memory − weights/TP − the activation reserve, divided by the KV
// bytes per token held on one GPU (the KV bytes per token ÷ TP, as each GPU
// holds its share of the KV heads). It is negative or zero when the model
// does not fit.
func KVCacheTokensFor(g GPUSpec, m ModelSpec, tp int, kv Dtype, maxBatchedTokens int) int {
	free := g.DCGM.MemoryUtilization*float64(g.MemoryBytes) - m.WeightBytes/float64(tp) - activationReserve(m, tp, maxBatchedTokens)
	tokens := int(math.Floor(free / (m.KVBytesPerToken(kv) / float64(tp))))
	return tokens / 16 * 16
}

// minKVTokens is the smallest KV cache PhysicsProfile accepts: below it the
// model is said not to fit (vLLM would refuse to start at any useful
// max_model_len).
const minKVTokens = 4096

// PhysicsProfile returns a Profile whose steps follow the roofline of the
// GPU and model named by s (see Roofline), with vLLM's scheduler defaults
// for the GPU (max_num_seqs, max_num_batched_tokens), 16-token KV blocks,
// preemption by recompute, a KV cache sized as vLLM sizes it
// (KVCacheTokensFor) and the GPU's DCGM identity. The Name is
// "<gpu>/<model>/tp<N>/kv-<dtype>". Its linear fields (StepBase,
// DecodePerSeq, AttnPerKToken, PrefillTokensPerSec) are informational
// equivalents for readers of a Profile; the Batcher uses the roofline.
//
// Errors wrap ErrUnknownGPU or ErrUnknownModel (listing the catalogue) or
// ErrBadPhysicsSpec (TP < 1, an unknown KV dtype, a model that does not fit
// the memory of TP GPUs).
func PhysicsProfile(s PhysicsSpec) (Profile, error) {
	g, err := LookupGPU(s.GPU)
	if err != nil {
		return Profile{}, err
	}
	m, err := LookupModel(s.Model)
	if err != nil {
		return Profile{}, err
	}
	if s.TP < 1 || s.TP > 64 {
		return Profile{}, fmt.Errorf("%w: tensor parallelism %d: want 1-64", ErrBadPhysicsSpec, s.TP)
	}
	if s.KVDtype == "" {
		s.KVDtype = string(DtypeFP16)
	}
	kv := Dtype(s.KVDtype)
	if kv != DtypeFP16 && kv != DtypeFP8 {
		return Profile{}, fmt.Errorf("%w: KV-cache dtype %q: want one of %v", ErrBadPhysicsSpec, s.KVDtype, KVDtypeNames())
	}
	eff := FittedEfficiency()
	if s.Efficiency != nil {
		eff = *s.Efficiency
	}
	if err := eff.validate(); err != nil {
		return Profile{}, err
	}
	seqs, budget := vllmSchedulerDefaults(g)
	kvTokens := KVCacheTokensFor(g, m, s.TP, kv, budget)
	if kvTokens < minKVTokens {
		return Profile{}, fmt.Errorf("%w: %s does not fit %d× %s: %.1f GB of weights per GPU leave room for %d KV tokens (%s KV), want at least %d; raise the tensor parallelism or use a larger GPU",
			ErrBadPhysicsSpec, m.Name, s.TP, g.Name, m.WeightBytes/float64(s.TP)/1e9, max(kvTokens, 0), kv, minKVTokens)
	}
	r := &Roofline{GPU: g, Model: m, TP: s.TP, KVDtype: kv, Eff: eff}
	dcgm := g.DCGM
	dcgm.WeightsMiB = int(m.WeightBytes / float64(s.TP) / mib)
	p := Profile{
		Name:             fmt.Sprintf("%s/%s/tp%d/kv-%s", g.Name, m.Name, s.TP, kv),
		FrontendLatency:  eff.Frontend,
		MaxNumSeqs:       seqs,
		MaxBatchedTokens: budget,
		KVCacheTokens:    kvTokens,
		BlockSize:        16,
		Preemption:       true,
		GPU:              dcgm,
		Physics:          r,
	}
	// Informational linear equivalents.
	base := p.EstimateDecodeStep(1, 0)
	p.StepBase = max(base, time.Microsecond)
	p.DecodePerSeq = max(p.EstimateDecodeStep(2, 0)-base, 0)
	p.AttnPerKToken = max(p.EstimateDecodeStep(1, 1000)-base, 0)
	chunk := p.EstimatePrefill(budget)
	p.PrefillTokensPerSec = float64(budget) / chunk.Seconds()
	return p, nil
}

// MaxContext returns the longest sequence (prompt + output) the profile
// serves: the model's context for a physics profile, capped by the KV
// cache; the KV cache for a fitted one.
func (p Profile) MaxContext() int {
	if p.Physics != nil {
		return min(p.Physics.Model.MaxContext, p.KVCacheTokens)
	}
	return p.KVCacheTokens
}
