package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// Names of the built-in profiles.
const (
	// Profile70BAWQ is the default: a 70B-parameter AWQ (4-bit) model served
	// by vLLM on one 80 GB GPU, calibrated as described on Profile70B.
	Profile70BAWQ = "70b-awq"
	// ProfileTiny is a fast, small profile for tests: steps of a few
	// milliseconds and a small KV cache so that admission limits are easy to
	// reach.
	ProfileTiny = "tiny"
	// Profile70BAWQFlat is Profile70B calibrated on round-robin in the
	// published flat topology (see Profile70BFlat); isobar bench paper
	// runs it.
	Profile70BAWQFlat = "70b-awq-flat"
)

// DefaultProfile is the profile an engine uses when EngineConfig.Profile is
// empty.
const DefaultProfile = Profile70BAWQ

// ErrUnknownProfile is returned by LookupProfile for a name that is not a
// built-in profile; check with errors.Is.
var ErrUnknownProfile = errors.New("sim: unknown profile")

// Profile holds the parameters of the continuous-batching timing model and of
// the simulated GPU. Every duration is model time: an engine multiplies it by
// EngineConfig.TimeScale.
//
// One engine step (one forward pass over the running batch) lasts
//
//	StepBase
//	  + DecodePerSeq  × (sequences decoding one token this step)
//	  + AttnPerKToken × (context tokens of those sequences) / 1000
//	  + (prompt tokens prefilled this step) / PrefillTokensPerSec
//
// StepBase is the cost of reading the weights once per step, DecodePerSeq the
// per-sequence compute and sampling, AttnPerKToken the KV reads of attention,
// and the last term the compute-bound prefill of chunked prompts. A profile
// with Physics set (PhysicsProfile) times its steps by the roofline instead.
type Profile struct {
	// Name identifies the profile in logs and reports.
	Name string

	// StepBase is the fixed cost of one engine step.
	StepBase time.Duration
	// DecodePerSeq is the added cost per decoding sequence in a step.
	DecodePerSeq time.Duration
	// AttnPerKToken is the added cost per 1000 context tokens (prompt and
	// generated so far) of the decoding sequences in a step.
	AttnPerKToken time.Duration
	// PrefillTokensPerSec is the prefill throughput: prompt tokens computed
	// per second of step time.
	PrefillTokensPerSec float64
	// FrontendLatency is the time a request spends in the API server
	// (parsing, tokenisation, hand-off to the engine core) before it joins the
	// scheduler's waiting queue. It adds to TTFT but uses no GPU time.
	FrontendLatency time.Duration
	// FrontendJitter is the mean of an exponentially distributed extra
	// frontend latency drawn per request (0: none). It models the API
	// server's queueing and the variability a client sees before the engine
	// core starts on a request, and shapes the TTFT tail at light load.
	FrontendJitter time.Duration

	// MaxNumSeqs caps the running batch (vLLM --max-num-seqs).
	MaxNumSeqs int
	// MaxBatchedTokens is the per-step token budget shared by decodes (one
	// token each) and prefill chunks (vLLM --max-num-batched-tokens). A prompt
	// longer than what is left of the budget is prefilled over several steps
	// (chunked prefill).
	MaxBatchedTokens int
	// KVCacheTokens is the KV-cache capacity in tokens.
	KVCacheTokens int
	// BlockSize is the KV-cache block size in tokens (vLLM's default is 16).
	BlockSize int
	// Preemption selects how KV blocks are allocated. False: a sequence
	// reserves blocks for prompt+max_tokens when admitted and is never
	// preempted. True (vLLM's behaviour): a sequence gets blocks for its
	// prompt on admission and one more block whenever its context crosses a
	// block boundary; when none is free the most recently admitted running
	// sequence is preempted (its blocks are freed and it is recomputed later).
	Preemption bool

	// GPU holds the simulated GPU's hardware parameters.
	GPU GPUProfile

	// Physics, when set, replaces the linear step formula above with the
	// roofline of a catalogue GPU and model (see Roofline and
	// PhysicsProfile). The fitted profiles leave it nil.
	Physics *Roofline
}

// GPUProfile describes the simulated GPU.
type GPUProfile struct {
	// ModelName is reported in dcgm-exporter's modelName label.
	ModelName string
	// MemoryMiB is the frame-buffer size.
	MemoryMiB int
	// WeightsMiB is what the model weights occupy once loaded.
	WeightsMiB int
	// MemoryUtilization is the fraction of MemoryMiB vLLM preallocates when
	// ready (vLLM --gpu-memory-utilization, 0.9 by default).
	MemoryUtilization float64
	// IdleWatts and MaxWatts bound the power draw (MaxWatts is the TDP).
	IdleWatts, MaxWatts float64
	// IdleSMClockMHz is the SM clock of an idle GPU, MaxSMClockMHz the boost
	// clock under load, MemClockMHz the (fixed) memory clock.
	IdleSMClockMHz, MaxSMClockMHz, MemClockMHz int
	// AmbientC is the idle temperature; a fully loaded GPU settles about
	// LoadRiseC above it.
	AmbientC, LoadRiseC float64
}

// a100 is an NVIDIA A100 80 GB (SXM4): 400 W TDP, 1410 MHz boost clock,
// 1593 MHz HBM2e clock, 210 MHz idle clock.
var a100 = GPUProfile{
	ModelName:         "NVIDIA A100-SXM4-80GB",
	MemoryMiB:         81920,
	WeightsMiB:        37600,
	MemoryUtilization: 0.90,
	IdleWatts:         62,
	MaxWatts:          400,
	IdleSMClockMHz:    210,
	MaxSMClockMHz:     1410,
	MemClockMHz:       1593,
	AmbientC:          32,
	LoadRiseC:         36,
}

// Profile70B returns the default profile: a 70B AWQ-class model served by
// vLLM on one 80 GB GPU (an A100 80 GB for the DCGM fields).
//
// Calibration. The timing parameters were fitted with SimulateLoad (virtual
// time, Poisson arrivals) to the figures of a published 9-GPU deployment
// served round-robin, and are frozen here. Baseline load is 10 RPS over 9
// engines (1.11 RPS per engine), prompts 512±200 tokens, 128 output tokens;
// the targets were TTFT P50 ≈ 300 ms (P95 ≈ 650 ms, P99 ≈ 850 ms in the
// published run), about 40 ms per output token, E2E P95 ≈ 5.8 s, and a
// sustainable 12 RPS over 9 engines at a 1.5 s P95-TTFT SLO. The fit gives
// TTFT P50 300 ms, P95 630–670 ms, P99 1.0–1.2 s, 40 ms mean inter-token
// latency and E2E P95 6.0 s at 1.11 RPS; P95 TTFT is 0.9–1.0 s at 1.3 RPS
// and 1.9 s at 1.5 RPS per engine (it crosses 1.5 s near 1.43). The same
// parameters reproduce the published sustainable rates of the long-prompt
// classes within ±25 % (code_heavy 9.1 vs 10, rag_multidoc 10.6 vs 13,
// long_context 7.2 vs 7, very_long 3.4 vs 4 RPS over 9 engines).
// calibration_test.go holds the profile to all of these.
//
// Shape of the model. A decode step at small batch is bound by reading the
// ~37 GB of AWQ weights (StepBase); per-sequence and attention costs make
// steps grow with the batch. Prefill is fast per token (30k tokens/s, more
// than one GPU computes for a 70B model, but what the published long-prompt
// rates require), so most of the ~300 ms TTFT at light load is frontend
// latency (130 ms fixed plus an exponential 130 ms mean, which reproduces the
// published TTFT tail) plus waiting for the step in flight. The knee comes
// from the running-batch cap: when arrivals outrun the 12 slots, requests
// queue and TTFT climbs steeply while running requests keep their per-token
// pace, as in a deployment sized by --max-num-seqs. The KV cache (about 90k
// tokens of 0.3125 MiB each: what is left of 90 % of 80 GB after the
// weights) limits concurrency only for long prompts, where vLLM-style
// preemption also occurs.
func Profile70B() Profile {
	return Profile{
		Name:                Profile70BAWQ,
		StepBase:            34 * time.Millisecond,
		DecodePerSeq:        800 * time.Microsecond,
		AttnPerKToken:       100 * time.Microsecond,
		PrefillTokensPerSec: 30000,
		FrontendLatency:     130 * time.Millisecond,
		FrontendJitter:      130 * time.Millisecond,
		MaxNumSeqs:          12,
		MaxBatchedTokens:    8192,
		KVCacheTokens:       90000,
		BlockSize:           16,
		Preemption:          true,
		GPU:                 a100,
	}
}

// ProfileTinyFast returns the "tiny" test profile: 2 ms steps, 4 sequences at
// most, a 512-token step budget and a 32768-token KV cache (one request of
// the default max_model_len fits).
func ProfileTinyFast() Profile {
	g := a100
	g.ModelName = "NVIDIA A10G"
	g.MemoryMiB = 23028
	g.WeightsMiB = 1200
	g.MaxWatts = 300
	return Profile{
		Name:                ProfileTiny,
		StepBase:            2 * time.Millisecond,
		DecodePerSeq:        200 * time.Microsecond,
		AttnPerKToken:       50 * time.Microsecond,
		PrefillTokensPerSec: 200000,
		FrontendLatency:     0,
		MaxNumSeqs:          4,
		MaxBatchedTokens:    512,
		KVCacheTokens:       32768,
		BlockSize:           16,
		Preemption:          false,
		GPU:                 g,
	}
}

// Profile70BFlat returns the profile isobar bench paper runs: Profile70B
// with a running batch of 9 sequences instead of 12.
//
// Calibration. Profile70B was fitted to one engine under Poisson arrivals;
// behind a round-robin ingress each of 9 engines sees smoother arrivals and
// sustains more (17 RPS at the 1.5 s SLO against the published 12). Fitted
// once, on rr only, in bench paper's flat topology (quick windows, seed 1)
// over MaxNumSeqs 8–10 and prefill 10k–30k tokens/s, this keeps the
// calibration row (TTFT P50 324 ms, P95 621 ms, P99 792 ms, E2E P95 5.7 s
// at 10 RPS; published 350/650/850 ms, 5.8 s) and brings six of the eight
// published rr sustainable rates within ±25 % (baseline_mixed 13.5 vs 12,
// rapid_shift 11.6 vs 11, code_heavy 9.0 vs 10, rag_multidoc 11.2 vs 13,
// long_context 8.6 vs 7, very_long 4.9 vs 4). adversarial_spike (10.1 vs
// 17) and multiturn (13.5 vs 9) stay outside at every point of the sweep:
// the published figures count those workloads differently (burst requests
// in the rate; longer turns). Frozen: never changed per policy.
func Profile70BFlat() Profile {
	p := Profile70B()
	p.Name = Profile70BAWQFlat
	p.MaxNumSeqs = 9
	return p
}

// LookupProfile returns the built-in profile with the given name, or an error
// wrapping ErrUnknownProfile that lists the known names.
func LookupProfile(name string) (Profile, error) {
	switch name {
	case Profile70BAWQ:
		return Profile70B(), nil
	case ProfileTiny:
		return ProfileTinyFast(), nil
	case Profile70BAWQFlat:
		return Profile70BFlat(), nil
	}
	return Profile{}, fmt.Errorf("%w %q: want one of %v", ErrUnknownProfile, name, ProfileNames())
}

// ProfileNames lists the built-in profiles, sorted.
func ProfileNames() []string {
	n := []string{Profile70BAWQ, Profile70BAWQFlat, ProfileTiny}
	sort.Strings(n)
	return n
}

// Validate reports the first parameter that makes the profile unusable.
func (p Profile) Validate() error {
	switch {
	case p.StepBase <= 0:
		return fmt.Errorf("sim: profile %q: StepBase must be > 0", p.Name)
	case p.DecodePerSeq < 0 || p.AttnPerKToken < 0 || p.FrontendLatency < 0 || p.FrontendJitter < 0:
		return fmt.Errorf("sim: profile %q: DecodePerSeq, AttnPerKToken, FrontendLatency and FrontendJitter must be >= 0", p.Name)
	case !(p.PrefillTokensPerSec > 0):
		return fmt.Errorf("sim: profile %q: PrefillTokensPerSec must be > 0", p.Name)
	case p.MaxNumSeqs < 1:
		return fmt.Errorf("sim: profile %q: MaxNumSeqs must be >= 1", p.Name)
	case p.MaxBatchedTokens < p.MaxNumSeqs+1:
		return fmt.Errorf("sim: profile %q: MaxBatchedTokens must exceed MaxNumSeqs so prefill can progress", p.Name)
	case p.BlockSize < 1:
		return fmt.Errorf("sim: profile %q: BlockSize must be >= 1", p.Name)
	case p.KVCacheTokens < p.BlockSize:
		return fmt.Errorf("sim: profile %q: KVCacheTokens must hold at least one block", p.Name)
	case p.GPU.MemoryMiB <= 0 || p.GPU.MaxWatts <= p.GPU.IdleWatts || p.GPU.MaxSMClockMHz <= 0:
		return fmt.Errorf("sim: profile %q: GPU MemoryMiB, MaxWatts > IdleWatts and MaxSMClockMHz must be set", p.Name)
	case p.GPU.MemoryUtilization <= 0 || p.GPU.MemoryUtilization > 1:
		return fmt.Errorf("sim: profile %q: GPU MemoryUtilization must be in (0,1]", p.Name)
	}
	if r := p.Physics; r != nil {
		switch {
		case r.TP < 1:
			return fmt.Errorf("sim: profile %q: Physics.TP must be >= 1", p.Name)
		case !(r.GPU.MemBandwidth > 0) || !(r.GPU.FP16FLOPS > 0) || (r.TP > 1 && !(r.GPU.LinkBandwidth > 0)):
			return fmt.Errorf("sim: profile %q: Physics.GPU needs MemBandwidth, FP16FLOPS and (with TP > 1) LinkBandwidth > 0", p.Name)
		case !(r.Model.Params > 0) || !(r.Model.WeightBytes > 0) || r.Model.Layers < 1 || r.KVDtype.Bytes() == 0:
			return fmt.Errorf("sim: profile %q: Physics.Model needs Params, WeightBytes, Layers and a KV dtype", p.Name)
		}
		if err := r.Eff.validate(); err != nil {
			return fmt.Errorf("sim: profile %q: %w", p.Name, err)
		}
	}
	return nil
}

// FrontendDelay draws the time a request spends before it joins the
// scheduler's waiting queue (FrontendLatency plus an exponential
// FrontendJitter), from r.
func (p Profile) FrontendDelay(r *rand.Rand) time.Duration {
	d := p.FrontendLatency
	if p.FrontendJitter > 0 {
		d += time.Duration(r.ExpFloat64() * float64(p.FrontendJitter))
	}
	return d
}
