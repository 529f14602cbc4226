package placement

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidConfig: a Config field is out of range. Check with
// errors.Is(err, ErrInvalidConfig).
var ErrInvalidConfig = errors.New("placement: invalid config")

// Defaults of Config.
const (
	// DefaultPrefillTokensPerSecond is the prefill rate of a host whose
	// rate is unknown: a mid-range single-GPU engine for a 7–8B model.
	DefaultPrefillTokensPerSecond = 20000
	// DefaultJitterFactor turns a host's jitter (one standard deviation)
	// into an allowance: mean + 2σ.
	DefaultJitterFactor = 2.0
	// DefaultDecodeCost is the latency a request is expected to lose per
	// request already in flight on the host: each running sequence makes
	// every engine step longer (its per-sequence overhead and the
	// attention over its context), and this request runs through one step
	// per output token. For a 70B model on one GPU that is about 0.2 ms
	// per running sequence per step (50 µs + 0.26 ms per 1,000 context
	// tokens × ~600 tokens, sim's physics fit) times ~128 output tokens:
	// 25 ms.
	DefaultDecodeCost = 25 * time.Millisecond
	// DefaultAffinityBand is the relative band of expected TTFT within
	// which the pick prefers the host with the longest expected cached
	// prefix: hosts up to 25 % slower than the best qualify.
	DefaultAffinityBand = 0.25
)

// tieTolerance is the relative difference below which two expected TTFTs
// are tied.
const tieTolerance = 1e-9

// Config holds the formula's constants. Build one with DefaultConfig.
type Config struct {
	// DefaultPrefillTokensPerSecond is used for hosts with no known rate.
	// Must be > 0. Default 20,000.
	DefaultPrefillTokensPerSecond float64
	// JitterFactor multiplies a host's jitter. Must be >= 0. Default 2.
	JitterFactor float64
	// DecodeCost is the expected latency added per request in flight on
	// the host (see DefaultDecodeCost). Must be >= 0. Default 25 ms.
	DecodeCost time.Duration
	// AffinityBand: among the hosts whose expected TTFT is at most
	// (1 + AffinityBand) × the best, the pick takes the one with the most
	// expected cached prompt tokens (Host.CachedPromptTokens). 0 turns the
	// preference off (cached tokens still shorten the expected prefill).
	// Must be >= 0. Default 0.25.
	AffinityBand float64
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		DefaultPrefillTokensPerSecond: DefaultPrefillTokensPerSecond,
		JitterFactor:                  DefaultJitterFactor,
		DecodeCost:                    DefaultDecodeCost,
		AffinityBand:                  DefaultAffinityBand,
	}
}

// Validate reports, wrapping ErrInvalidConfig, a field out of range.
func (c Config) Validate() error {
	switch {
	case !(c.DefaultPrefillTokensPerSecond > 0) || math.IsInf(c.DefaultPrefillTokensPerSecond, 1):
		return fmt.Errorf("%w: DefaultPrefillTokensPerSecond %v must be a positive number", ErrInvalidConfig, c.DefaultPrefillTokensPerSecond)
	case !(c.JitterFactor >= 0) || math.IsInf(c.JitterFactor, 1):
		return fmt.Errorf("%w: JitterFactor %v must be a number >= 0", ErrInvalidConfig, c.JitterFactor)
	case c.DecodeCost < 0:
		return fmt.Errorf("%w: DecodeCost %v must be >= 0", ErrInvalidConfig, c.DecodeCost)
	case !(c.AffinityBand >= 0) || math.IsInf(c.AffinityBand, 1):
		return fmt.Errorf("%w: AffinityBand %v must be a number >= 0", ErrInvalidConfig, c.AffinityBand)
	}
	return nil
}

// Host is what the pick knows of one candidate host.
type Host struct {
	// Weight gates eligibility: 0 is never picked. Its size does not
	// matter.
	Weight uint32
	// RTT is the mean round trip to the host; 0 when unknown.
	RTT time.Duration
	// Jitter is the round trip's jitter (one standard deviation); 0 when
	// unknown.
	Jitter time.Duration
	// PendingPromptTokens are the prompt tokens sent to the host that have
	// not yet produced a first token (this request's excluded).
	PendingPromptTokens int64
	// PrefillTokensPerSecond is the host's prefill rate; 0 when unknown
	// (Config.DefaultPrefillTokensPerSecond applies).
	PrefillTokensPerSecond float64
	// InFlight is the host's requests in flight (this request's
	// excluded).
	InFlight int64
	// Slots is the engine's running-batch capacity, the requests it
	// serves at once (vLLM --max-num-seqs); 0 when unknown (no slot-wait
	// term).
	Slots int64
	// ServiceTime is the mean time a request holds one of those slots on
	// this host, as the caller measures it; 0 when unknown (no slot-wait
	// term).
	ServiceTime time.Duration
	// CachedPromptTokens are the leading tokens of this request's prompt
	// the host is expected to hold in its prefix cache (a caller's
	// approximate index, or the engine's exact cache): they are not
	// prefilled again. 0 when unknown.
	CachedPromptTokens int64
}

// HeadProgress is how many of the oldest pending prompt's tokens a host has
// prefilled after prefilling it for elapsed at rate tokens per second: the
// caller subtracts it from the host's PendingPromptTokens. The oldest prompt
// a caller has sent a host without a first token yet is the one the host
// is prefilling; it has been at it since the later of its send and the
// host's last first token to the caller. Counting it whole until its first
// token would make a host busy with one long prompt look as loaded as one
// that has not started it. The progress is at most prompt; a rate of 0 or
// less (unknown) or a negative elapsed gives none. When the engine cannot
// admit the prompt (its KV cache is full) it is not prefilling and the
// estimate is high by at most that one prompt.
func HeadProgress(prompt int64, rate float64, elapsed time.Duration) int64 {
	if prompt <= 0 || !(rate > 0) || math.IsInf(rate, 1) || elapsed <= 0 {
		return 0
	}
	done := rate * elapsed.Seconds()
	if done >= float64(prompt) {
		return prompt
	}
	return int64(done)
}

// ContextCeiling is the rejection memory's rule: the largest request (in
// context tokens) a caller should still send a host that has refused one
// as too long, or 0 for no limit. served is the largest it has answered,
// refused the smallest it refused (0: none), stated the limit a refusal
// stated (vLLM's "maximum context length is N tokens"; 0: none). Without a
// refusal there is no limit; a stated limit wins; else the largest served
// when below the smallest refused; else one below the smallest refused.
// So a context limit nobody declared is caught at its first refusal, and
// the host keeps serving what it has shown it holds.
func ContextCeiling(served, refused, stated int64) int64 {
	switch {
	case refused <= 0:
		return 0
	case stated > 0:
		return stated
	case served > 0 && served < refused:
		return served
	default:
		return max(refused-1, 1)
	}
}

// Rand is the random source for tie-breaks. *math/rand/v2.Rand satisfies
// it.
type Rand interface {
	Uint64() uint64
}

// ExpectedTTFT is the formula of the package doc for a request of
// promptTokens tokens on h, in seconds.
func ExpectedTTFT(c Config, h Host, promptTokens int64) float64 {
	rate := h.PrefillTokensPerSecond
	if !(rate > 0) || math.IsInf(rate, 1) {
		rate = c.DefaultPrefillTokensPerSecond
	}
	tokens := float64(max(h.PendingPromptTokens, 0)) + float64(UncachedTokens(promptTokens, h.CachedPromptTokens))
	inFlight := max(h.InFlight, 0)
	return max(h.RTT, 0).Seconds() + c.JitterFactor*max(h.Jitter, 0).Seconds() +
		tokens/rate + float64(inFlight)*c.DecodeCost.Seconds() +
		slotWait(inFlight, h.Slots, h.ServiceTime)
}

// UncachedTokens is how many of a prompt's tokens a host must prefill
// when it holds cached of them: at least one (an engine always computes
// the last prompt token), none for an empty prompt.
func UncachedTokens(prompt, cached int64) int64 {
	prompt = max(prompt, 0)
	return max(prompt-max(cached, 0), min(prompt, 1))
}

// slotWait is the slot-wait term of the package doc, in seconds: with
// inFlight (>= 0) requests on a host of slots batch slots, each held for
// serviceTime on average, a new request finds k = inFlight + 1 − slots
// requests (itself included) without a slot; slots busy slots free one
// every serviceTime/slots on average, so the k-th frees after
// k × serviceTime / slots. 0 when k <= 0, and when slots or serviceTime
// is unknown (<= 0). inFlight − slots cannot overflow once both are
// known to be >= 0.
func slotWait(inFlight, slots int64, serviceTime time.Duration) float64 {
	if slots <= 0 || serviceTime <= 0 || inFlight < slots {
		return 0
	}
	k := float64(inFlight-slots) + 1
	return k * serviceTime.Seconds() / float64(slots)
}

// Pick returns the index of the eligible host with the least expected TTFT
// for a request of promptTokens tokens, ties broken by r (one r.Uint64()
// per tied host met after the first), or -1 and false when no host has a
// positive weight. With Config.AffinityBand > 0 and some host expected to
// hold part of the prompt, the hosts within the band of the least
// expected TTFT compete on their expected cached tokens first (see
// Config.AffinityBand); the package doc gives the rule.
func Pick(c Config, hosts []Host, promptTokens int64, r Rand) (int, bool) {
	best, bestT := -1, math.Inf(1)
	var tied uint64
	cachedAny := false
	for i := range hosts {
		if hosts[i].Weight == 0 {
			continue
		}
		cachedAny = cachedAny || hosts[i].CachedPromptTokens > 0
		t := ExpectedTTFT(c, hosts[i], promptTokens)
		switch {
		case best < 0 || t < bestT-tieTolerance*bestT:
			best, bestT, tied = i, t, 1
		case t <= bestT+tieTolerance*bestT:
			tied++
			if r.Uint64()%tied == 0 {
				best = i
			}
			bestT = min(bestT, t)
		}
	}
	if best < 0 || !cachedAny || !(c.AffinityBand > 0) {
		return best, best >= 0
	}
	return pickInBand(c, hosts, promptTokens, bestT, r), true
}

// pickInBand is the affinity rule: among the eligible hosts whose expected
// TTFT is within (1 + AffinityBand) × bestT, the most expected cached
// tokens, then the least expected TTFT, then at random (as Pick).
func pickInBand(c Config, hosts []Host, promptTokens int64, bestT float64, r Rand) int {
	limit := bestT * (1 + c.AffinityBand) * (1 + tieTolerance)
	best, bestC, bestT2 := -1, int64(-1), math.Inf(1)
	var tied uint64
	for i := range hosts {
		if hosts[i].Weight == 0 {
			continue
		}
		t := ExpectedTTFT(c, hosts[i], promptTokens)
		if t > limit {
			continue
		}
		cached := min(max(hosts[i].CachedPromptTokens, 0), max(promptTokens, 0))
		switch {
		case cached > bestC || cached == bestC && t < bestT2-tieTolerance*bestT2:
			best, bestC, bestT2, tied = i, cached, t, 1
		case cached == bestC && t <= bestT2+tieTolerance*bestT2:
			tied++
			if r.Uint64()%tied == 0 {
				best = i
			}
			bestT2 = min(bestT2, t)
		}
	}
	return best
}
