package cellagent

import (
	"math"
	"time"
)

// TTFTQuantile is the quantile of time to first token the agent reports.
const TTFTQuantile = 0.95

// HistogramQuantile returns the q-quantile (0 <= q <= 1) of a cumulative
// histogram the way PromQL's histogram_quantile does: find the bucket that
// holds the rank q·count and interpolate linearly inside it, taking 0 as the
// lower bound of the first bucket (when its upper bound is positive) and
// answering the highest finite bound when the rank falls in the +Inf bucket.
// Counts that decrease from one bucket to the next (float noise) are raised
// to their predecessor, as PromQL does. ok is false when the histogram has
// no observations, no +Inf bucket or fewer than two buckets.
func HistogramQuantile(q float64, buckets []Bucket) (v float64, ok bool) {
	if math.IsNaN(q) || q < 0 || q > 1 || len(buckets) < 2 {
		return 0, false
	}
	last := buckets[len(buckets)-1]
	if !math.IsInf(last.UpperBound, 1) {
		return 0, false
	}
	// Monotonic cumulative counts, without modifying the caller's slice.
	counts := make([]float64, len(buckets))
	for i, b := range buckets {
		if math.IsNaN(b.Count) || math.IsInf(b.Count, 0) || math.IsNaN(b.UpperBound) {
			return 0, false
		}
		if i > 0 && buckets[i].UpperBound <= buckets[i-1].UpperBound {
			return 0, false
		}
		counts[i] = b.Count
		if i > 0 && counts[i] < counts[i-1] {
			counts[i] = counts[i-1]
		}
	}
	observations := counts[len(counts)-1]
	if observations <= 0 {
		return 0, false
	}
	rank := q * observations
	b := 0
	for b < len(buckets)-1 && counts[b] < rank {
		b++
	}
	if b == len(buckets)-1 {
		return buckets[len(buckets)-2].UpperBound, true
	}
	if b == 0 && buckets[0].UpperBound <= 0 {
		return buckets[0].UpperBound, true
	}
	start, end, count := 0.0, buckets[b].UpperBound, counts[b]
	if b > 0 {
		start = buckets[b-1].UpperBound
		count -= counts[b-1]
		rank -= counts[b-1]
	}
	if count <= 0 {
		return end, true
	}
	v = start + (end-start)*(rank/count)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// counterReset reports whether any cumulative value of cur is below prev (an
// engine restart), or a cumulative series that prev had is gone.
func counterReset(prev, cur VLLMSample) bool {
	if prev.RequestSuccess != nil && (cur.RequestSuccess == nil || *cur.RequestSuccess < *prev.RequestSuccess) {
		return true
	}
	if prev.Completions != nil && (cur.Completions == nil ||
		cur.Completions.Total < prev.Completions.Total ||
		cur.Completions.Errors < prev.Completions.Errors) {
		return true
	}
	for _, c := range [][2]*float64{{prev.PrefixQueries, cur.PrefixQueries}, {prev.PrefixHits, cur.PrefixHits}} {
		if c[0] != nil && (c[1] == nil || *c[1] < *c[0]) {
			return true
		}
	}
	if prev.TTFT != nil {
		if cur.TTFT == nil || !prev.TTFT.sameLayout(cur.TTFT) {
			return true
		}
		for i := range prev.TTFT.Buckets {
			if cur.TTFT.Buckets[i].Count < prev.TTFT.Buckets[i].Count {
				return true
			}
		}
	}
	return false
}

// Derive computes the application signals from the vLLM samples at the two
// ends of a window: gauges from latest, TTFT P95, error rate, window
// requests and request rate from the counter deltas latest − base over
// elapsed. A nil base means "since the engine started": deltas are the
// cumulative values and request rate is absent (there is no time base).
// The caller must have checked counterReset(base, latest) is false.
//
// TTFT P95 and error rate are absent when the window saw no request;
// window requests and request rate are then 0. The prefix-cache hit rate
// is the hits delta over the queries delta (both in prompt tokens), absent
// when the window queried nothing (no admission, or prefix caching off).
func Derive(base *VLLMSample, latest VLLMSample, elapsed time.Duration) Signals {
	s := Signals{
		QueueDepth:   latest.QueueDepth,
		Running:      latest.Running,
		KVCacheUsage: latest.KVCacheUsage,
	}
	cumulative := base == nil
	if cumulative {
		base = &VLLMSample{}
	}
	if latest.TTFT != nil {
		var delta *Histogram
		switch {
		case base.TTFT != nil:
			delta = subHistogram(latest.TTFT, base.TTFT)
		case cumulative:
			delta = latest.TTFT
		}
		if delta != nil && delta.Count() > 0 {
			if v, ok := HistogramQuantile(TTFTQuantile, delta.Buckets); ok && v >= 0 {
				s.TTFTP95Seconds = ptr(v)
			}
		}
	}
	if latest.Completions != nil && (base.Completions != nil || cumulative) {
		var b StatusCounts
		if base.Completions != nil {
			b = *base.Completions
		}
		total := max(latest.Completions.Total-b.Total, 0)
		errs := min(max(latest.Completions.Errors-b.Errors, 0), total)
		s.WindowRequests = ptr(total)
		if total > 0 {
			s.ErrorRate = ptr(errs / total)
		}
	}
	if latest.PrefixQueries != nil && latest.PrefixHits != nil &&
		((base.PrefixQueries != nil && base.PrefixHits != nil) || cumulative) {
		var bq, bh float64
		if !cumulative {
			bq, bh = *base.PrefixQueries, *base.PrefixHits
		}
		queries := max(*latest.PrefixQueries-bq, 0)
		hits := min(max(*latest.PrefixHits-bh, 0), queries)
		if queries > 0 {
			s.PrefixCacheHitRate = ptr(hits / queries)
		}
	}
	if !cumulative && latest.RequestSuccess != nil && base.RequestSuccess != nil && elapsed > 0 {
		d := max(*latest.RequestSuccess-*base.RequestSuccess, 0)
		s.RequestRate = ptr(d / elapsed.Seconds())
	}
	return s
}

// subHistogram returns a − b bucket by bucket (same layout), never negative.
func subHistogram(a, b *Histogram) *Histogram {
	if !a.sameLayout(b) {
		return nil
	}
	d := &Histogram{Buckets: make([]Bucket, len(a.Buckets))}
	for i := range a.Buckets {
		d.Buckets[i] = Bucket{UpperBound: a.Buckets[i].UpperBound, Count: max(a.Buckets[i].Count-b.Buckets[i].Count, 0)}
	}
	return d
}

// window keeps the vLLM samples of the last span, plus the newest one at or
// before the window's start, so that base→latest covers at least span once
// enough samples exist. It is not safe for concurrent use.
type window struct {
	span    time.Duration
	samples []timedSample
}

type timedSample struct {
	at time.Time
	s  VLLMSample
}

// add appends s taken at t and prunes old samples. On a counter reset the
// window restarts from s, and add reports true.
func (w *window) add(t time.Time, s VLLMSample) (reset bool) {
	if n := len(w.samples); n > 0 {
		prev := w.samples[n-1]
		switch {
		case counterReset(prev.s, s):
			reset = true
			w.samples = w.samples[:0]
		case !t.After(prev.at):
			// No time has passed (a clock that did not move): the newer
			// sample replaces the older one.
			w.samples = w.samples[:n-1]
		}
	}
	w.samples = append(w.samples, timedSample{at: t, s: s})
	cutoff := t.Add(-w.span)
	drop := 0
	for drop+1 < len(w.samples) && !w.samples[drop+1].at.After(cutoff) {
		drop++
	}
	if drop > 0 {
		w.samples = append(w.samples[:0], w.samples[drop:]...)
	}
	return reset
}

// clear forgets every sample (the source failed; a later sample must not be
// compared with one from before the gap).
func (w *window) clear() { w.samples = w.samples[:0] }

// derive returns the signals over the window; with a single sample the
// windowed signals are absent.
func (w *window) derive() Signals {
	n := len(w.samples)
	if n == 0 {
		return Signals{}
	}
	latest := w.samples[n-1]
	if n == 1 {
		return Signals{QueueDepth: latest.s.QueueDepth, Running: latest.s.Running, KVCacheUsage: latest.s.KVCacheUsage}
	}
	base := w.samples[0]
	return Derive(&base.s, latest.s, latest.at.Sub(base.at))
}
