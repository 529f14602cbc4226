package sim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/internal/quantile"
)

// TokenDist is a token-count distribution: normal with the given mean and
// standard deviation, rounded, and clamped to [max(Min,1), Max] (Max 0 means
// no upper bound). "512±200" is TokenDist{Mean: 512, StdDev: 200}.
type TokenDist struct {
	Mean, StdDev float64
	Min, Max     int
}

// Sample draws one value.
func (d TokenDist) Sample(r *rand.Rand) int {
	v := int(math.Round(d.Mean + d.StdDev*r.NormFloat64()))
	lo := max(d.Min, 1)
	if v < lo {
		v = lo
	}
	if d.Max > 0 && v > d.Max {
		v = d.Max
	}
	return v
}

// LoadSpec describes an open-loop Poisson load on one engine.
type LoadSpec struct {
	// RPS is the mean arrival rate (requests per second).
	RPS float64
	// Duration is the span over which requests arrive; the simulation then
	// runs until every request has finished.
	Duration time.Duration
	// Warmup excludes requests arriving before it from the statistics.
	Warmup time.Duration
	// Prompt is the prompt-length distribution in tokens.
	Prompt TokenDist
	// OutputTokens is max_tokens of every request (the engine always
	// generates exactly that many, finish_reason "length").
	OutputTokens int
	// Seed seeds the arrival and prompt-length random streams.
	Seed int64
}

// LoadStats are the figures of one simulated run. Durations are model time.
type LoadStats struct {
	// Requests is the number of measured requests (arrived after Warmup);
	// Rejected counts those that could never fit the KV cache.
	Requests, Rejected                  int
	TTFTMean, TTFTP50, TTFTP95, TTFTP99 time.Duration
	// ITLMean and ITLP95 are over every inter-token gap, as vLLM's
	// inter_token_latency histogram sees them.
	ITLMean, ITLP95                 time.Duration
	E2EMean, E2EP50, E2EP95, E2EP99 time.Duration
	// MeanRunning and MeanWaiting are time averages of the batch and queue
	// sizes; Busy is the fraction of time the engine was stepping.
	MeanRunning, MeanWaiting, Busy float64
	// Preemptions over the whole run.
	Preemptions int64
}

// String formats the headline figures.
func (s LoadStats) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0fms", float64(d)/1e6) }
	return fmt.Sprintf("n=%d ttft p50=%s p95=%s p99=%s itl=%s e2e p50=%s p95=%s running=%.1f waiting=%.1f busy=%.2f preempt=%d",
		s.Requests, ms(s.TTFTP50), ms(s.TTFTP95), ms(s.TTFTP99), ms(s.ITLMean), ms(s.E2EP50), ms(s.E2EP95),
		s.MeanRunning, s.MeanWaiting, s.Busy, s.Preemptions)
}

type simReq struct {
	arrive   time.Duration
	enter    time.Duration
	prompt   int
	first    time.Duration
	last     time.Duration
	done     bool
	measured bool
}

// SimulateLoad runs the timing model of profile p against a Poisson load in
// virtual time (no goroutines, no clock) and returns latency statistics. It
// is deterministic for a given profile and spec.
func SimulateLoad(p Profile, spec LoadSpec) (LoadStats, error) {
	if spec.RPS <= 0 || spec.Duration <= 0 || spec.OutputTokens < 1 {
		return LoadStats{}, errors.New("sim: SimulateLoad needs RPS > 0, Duration > 0 and OutputTokens >= 1")
	}
	b, err := NewBatcher(p)
	if err != nil {
		return LoadStats{}, err
	}
	reqs, order := simArrivals(p, spec)

	var (
		st           LoadStats
		gaps         durHist
		now          time.Duration
		next         int
		runArea      float64
		waitArea     float64
		busy         time.Duration
		lastObserved time.Duration
	)
	observe := func(t time.Duration) {
		s := b.Stats()
		dt := float64(t - lastObserved)
		runArea += dt * float64(s.Running)
		waitArea += dt * float64(s.Waiting)
		lastObserved = t
	}
	for next < len(order) || !b.Idle() {
		for next < len(order) && reqs[order[next]].enter <= now {
			r := &reqs[order[next]]
			if err := b.Add(SeqID(order[next]), r.prompt, spec.OutputTokens); err != nil {
				if !errors.Is(err, ErrExceedsKVCache) {
					return LoadStats{}, err
				}
				r.done = true
				if r.measured {
					st.Rejected++
				}
			}
			next++
		}
		if b.Idle() {
			if next < len(order) {
				observe(now)
				now = reqs[order[next]].enter
				lastObserved = now
			}
			continue
		}
		observe(now)
		step := b.Step()
		now += step.Duration
		busy += step.Duration
		for _, ev := range step.Tokens {
			r := &reqs[ev.ID]
			if ev.N == 1 {
				r.first = now
			} else {
				gap := now - r.last
				if r.measured {
					gaps.add(gap)
				}
			}
			r.last = now
			if ev.Done {
				r.done = true
			}
		}
	}
	st.Preemptions = b.Stats().Preemptions
	if now > 0 {
		st.MeanRunning = runArea / float64(now)
		st.MeanWaiting = waitArea / float64(now)
		st.Busy = float64(busy) / float64(now)
	}
	st.latencies(reqs, &gaps)
	return st, nil
}

// simArrivals draws the Poisson arrivals of spec, with their prompts and
// frontend delays, and the order in which they leave the frontend.
func simArrivals(p Profile, spec LoadSpec) (reqs []simReq, order []int) {
	rng := rand.New(rand.NewPCG(uint64(spec.Seed), 0x15063a2))
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / spec.RPS * float64(time.Second))
		if t >= spec.Duration {
			break
		}
		r := simReq{arrive: t, prompt: spec.Prompt.Sample(rng), measured: t >= spec.Warmup}
		r.enter = t + p.FrontendDelay(rng)
		reqs = append(reqs, r)
	}

	// Requests join the queue in the order they leave the frontend.
	order = make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].enter, reqs[b].enter) })
	return reqs, order
}

// latencies sets the request count and latency statistics of the measured
// requests that got a first token.
func (st *LoadStats) latencies(reqs []simReq, gaps *durHist) {
	var ttft, e2e []time.Duration
	for i := range reqs {
		r := &reqs[i]
		if !r.measured || r.first == 0 {
			continue
		}
		st.Requests++
		ttft = append(ttft, r.first-r.arrive)
		e2e = append(e2e, r.last-r.arrive)
	}
	st.TTFTMean, st.TTFTP50, st.TTFTP95, st.TTFTP99 = summarize(ttft)
	st.E2EMean, st.E2EP50, st.E2EP95, st.E2EP99 = summarize(e2e)
	st.ITLMean, st.ITLP95 = gaps.mean(), gaps.quantile(0.95)
}

// summarize returns the mean and the nearest-rank P50, P95 and P99.
func summarize(d []time.Duration) (mean, p50, p95, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(d)
	var sum float64
	for _, v := range d {
		sum += float64(v)
	}
	return time.Duration(sum / float64(len(d))), quantile.Sorted(d, 0.50), quantile.Sorted(d, 0.95), quantile.Sorted(d, 0.99)
}

// durHist is a histogram of durations at 100 µs resolution up to 10 s (with
// exact values kept beyond), for percentiles over millions of samples.
type durHist struct {
	counts [100000]int64
	over   []time.Duration
	n      int64
	sum    float64
}

const durHistRes = 100 * time.Microsecond

func (h *durHist) add(d time.Duration) {
	h.n++
	h.sum += float64(d)
	i := int64(d / durHistRes)
	if i < 0 {
		i = 0
	}
	if i >= int64(len(h.counts)) {
		h.over = append(h.over, d)
		return
	}
	h.counts[i]++
}

func (h *durHist) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// quantile returns the nearest-rank q-quantile, rounded up to the bucket's
// upper bound.
func (h *durHist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(quantile.Rank(int(h.n), q)) + 1 // 1-based
	var c int64
	for i, k := range h.counts {
		c += k
		if c >= rank {
			return time.Duration(i+1) * durHistRes
		}
	}
	slices.Sort(h.over)
	return h.over[min(int(rank-c)-1, len(h.over)-1)]
}
