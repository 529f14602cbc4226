package sim

import (
	"errors"
	"fmt"
	"time"
)

// ErrBadSweep wraps every SweepSpec error; check with errors.Is.
var ErrBadSweep = errors.New("sim: bad sweep")

// SweepSpec describes a single-engine closed-loop load curve, like vLLM's
// `vllm bench serve --max-concurrency C` with an infinite request rate:
// at each concurrency C, C clients each send a request, wait for its last
// token and send the next at once, until Requests requests have been sent.
type SweepSpec struct {
	// Concurrency lists the levels, each >= 1.
	Concurrency []int
	// PromptTokens and OutputTokens are every request's prompt length and
	// max_tokens (generation runs to max_tokens).
	PromptTokens, OutputTokens int
	// Requests per level. Default 40 × C. The figures cover the requests
	// from the middle of the run to the last C (the drain) when Requests >=
	// 3 × C, and all of them otherwise: a closed loop of identical requests
	// starts with every client at once and needs many rounds before its
	// prefills settle into their steady interleaving with the decodes.
	Requests int
}

// Bounds of a SweepSpec, which keep a sweep to seconds and its memory small.
const (
	MaxSweepConcurrency = 4096
	MaxSweepRequests    = 1 << 20
)

// SweepRow is one concurrency level's figures. Durations are model time.
type SweepRow struct {
	Concurrency int
	// Requests is the number of requests measured.
	Requests int
	// TTFT is from the client's send (frontend latency included) to the
	// first token.
	TTFTP50, TTFTP95, TTFTMean time.Duration
	// ITL is over every inter-token gap of the measured requests (what
	// vLLM's inter_token_latency histogram sees); its mean equals the
	// per-request (E2E − TTFT) ÷ (output − 1) averaged over requests, as
	// NIM and genai-perf report ITL, since every request has the same
	// output length.
	ITLP50, ITLP95, ITLMean time.Duration
	E2EP50, E2EP95, E2EMean time.Duration
	// RequestsPerSec is the throughput C ÷ mean E2E (Little's law for a
	// closed loop without think time); OutputTokensPerSec is it times
	// OutputTokens.
	RequestsPerSec, OutputTokensPerSec float64
	// Preemptions over the whole level.
	Preemptions int64
}

func (s SweepSpec) validate(p Profile) error {
	if len(s.Concurrency) == 0 {
		return fmt.Errorf("%w: no concurrency level", ErrBadSweep)
	}
	for _, c := range s.Concurrency {
		if c < 1 || c > MaxSweepConcurrency {
			return fmt.Errorf("%w: concurrency %d: want 1-%d", ErrBadSweep, c, MaxSweepConcurrency)
		}
		if s.Requests > 0 && s.Requests < c {
			return fmt.Errorf("%w: %d requests at concurrency %d: want at least one per client", ErrBadSweep, s.Requests, c)
		}
	}
	switch {
	case s.PromptTokens < 1 || s.OutputTokens < 1:
		return fmt.Errorf("%w: prompt %d and output %d tokens: want >= 1", ErrBadSweep, s.PromptTokens, s.OutputTokens)
	case s.PromptTokens+s.OutputTokens > p.MaxContext():
		return fmt.Errorf("%w: prompt+output %d tokens exceed the context of %s (%d tokens)", ErrBadSweep, s.PromptTokens+s.OutputTokens, p.Name, p.MaxContext())
	case s.Requests < 0 || s.Requests > MaxSweepRequests:
		return fmt.Errorf("%w: requests %d: want 0-%d", ErrBadSweep, s.Requests, MaxSweepRequests)
	}
	return nil
}

// Sweep runs the closed-loop load curve of spec on one engine of profile
// p, in virtual time (no goroutines, no clock), one row per concurrency
// level in the order given. It is deterministic: every request spends the
// fixed FrontendLatency in the API server (a fitted profile's random
// FrontendJitter is left out; physics profiles have none).
func Sweep(p Profile, spec SweepSpec) ([]SweepRow, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := spec.validate(p); err != nil {
		return nil, err
	}
	rows := make([]SweepRow, 0, len(spec.Concurrency))
	for _, c := range spec.Concurrency {
		r, err := sweepLevel(p, spec, c)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

type sweepReq struct {
	sent, first, last time.Duration
}

func sweepLevel(p Profile, spec SweepSpec, c int) (SweepRow, error) {
	b, err := NewBatcher(p)
	if err != nil {
		return SweepRow{}, err
	}
	n := spec.Requests
	if n == 0 {
		n = 40 * c
	}
	reqs := make([]sweepReq, 0, n)
	// Requests enter the engine FrontendLatency after they are sent; sends
	// happen in time order, so the pending ones form a FIFO.
	var pending []int
	send := func(now time.Duration) {
		reqs = append(reqs, sweepReq{sent: now})
		pending = append(pending, len(reqs)-1)
	}
	for range c {
		send(0)
	}
	var (
		now  time.Duration
		done int
		lo   = 0
		hi   = n
		gaps durHist
	)
	if n >= 3*c {
		lo, hi = max(c, n/2), n-c
	}
	for done < n {
		for len(pending) > 0 && reqs[pending[0]].sent+p.FrontendLatency <= now {
			id := pending[0]
			pending = pending[1:]
			if err := b.Add(SeqID(id), spec.PromptTokens, spec.OutputTokens); err != nil {
				return SweepRow{}, err
			}
		}
		if b.Idle() {
			if len(pending) == 0 {
				return SweepRow{}, errors.New("sim: sweep stalled with no request in flight")
			}
			now = reqs[pending[0]].sent + p.FrontendLatency
			continue
		}
		st := b.Step()
		now += st.Duration
		for _, ev := range st.Tokens {
			id := int(ev.ID)
			r := &reqs[id]
			if ev.N == 1 {
				r.first = now
			} else if id >= lo && id < hi {
				gaps.add(now - r.last)
			}
			r.last = now
			if ev.Done {
				done++
				if len(reqs) < n {
					send(now)
				}
			}
		}
	}
	row := SweepRow{Concurrency: c, Requests: hi - lo, Preemptions: b.Stats().Preemptions}
	ttft := make([]time.Duration, 0, hi-lo)
	e2e := make([]time.Duration, 0, hi-lo)
	for _, r := range reqs[lo:hi] {
		ttft = append(ttft, r.first-r.sent)
		e2e = append(e2e, r.last-r.sent)
	}
	row.TTFTMean, row.TTFTP50, row.TTFTP95, _ = summarize(ttft)
	row.E2EMean, row.E2EP50, row.E2EP95, _ = summarize(e2e)
	row.ITLMean, row.ITLP50, row.ITLP95 = gaps.mean(), gaps.quantile(0.5), gaps.quantile(0.95)
	if row.E2EMean > 0 {
		row.RequestsPerSec = float64(c) / row.E2EMean.Seconds()
		row.OutputTokensPerSec = row.RequestsPerSec * float64(spec.OutputTokens)
	}
	return row, nil
}
