package cellagent

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Errors of the parsers. Check them with errors.Is.
var (
	// ErrParse: the page is not valid Prometheus text (or JSON for
	// /v1/models).
	ErrParse = errors.New("cellagent: malformed page")
	// ErrGPUNotFound: the GPU selector matches no GPU on the DCGM page.
	ErrGPUNotFound = errors.New("cellagent: no GPU matches the selector")
	// ErrGPUAmbiguous: the GPU selector (or its absence) matches several GPUs.
	ErrGPUAmbiguous = errors.New("cellagent: GPU selector matches several GPUs")
)

// vLLM metric names the agent reads.
const (
	vllmWaiting        = "vllm:num_requests_waiting"
	vllmRunning        = "vllm:num_requests_running"
	vllmKVUsage        = "vllm:kv_cache_usage_perc"
	vllmKVUsageLegacy  = "vllm:gpu_cache_usage_perc"
	vllmTTFT           = "vllm:time_to_first_token_seconds"
	vllmRequestSuccess = "vllm:request_success_total"
	httpRequests       = "http_requests_total"
	// Prefix-cache counters in prompt tokens (vLLM v1), and the names
	// vLLM 0.8 used before deprecating them.
	vllmPrefixQueries       = "vllm:prefix_cache_queries_total"
	vllmPrefixHits          = "vllm:prefix_cache_hits_total"
	vllmPrefixQueriesLegacy = "vllm:gpu_prefix_cache_queries_total"
	vllmPrefixHitsLegacy    = "vllm:gpu_prefix_cache_hits_total"
)

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	// UpperBound is the bucket's inclusive upper bound (le).
	UpperBound float64
	// Count is the cumulative count of observations <= UpperBound.
	Count float64
}

// Histogram is a cumulative histogram summed over a page's series. Buckets
// are sorted by UpperBound, the last one is +Inf, and every count is finite
// and >= 0.
type Histogram struct {
	Buckets []Bucket
}

// Count returns the number of observations (the +Inf bucket).
func (h *Histogram) Count() float64 {
	if h == nil || len(h.Buckets) == 0 {
		return 0
	}
	return h.Buckets[len(h.Buckets)-1].Count
}

// sameLayout reports whether h and o have the same bucket bounds.
func (h *Histogram) sameLayout(o *Histogram) bool {
	if len(h.Buckets) != len(o.Buckets) {
		return false
	}
	for i := range h.Buckets {
		if h.Buckets[i].UpperBound != o.Buckets[i].UpperBound {
			return false
		}
	}
	return true
}

// StatusCounts are cumulative response counts on the completion handlers.
type StatusCounts struct {
	// Total counts every response.
	Total float64
	// Errors counts the non-2xx responses.
	Errors float64
}

// VLLMSample is one vLLM /metrics page reduced to what the agent uses,
// summed over the engine label (data-parallel engines). A nil field is
// absent from the page or was dropped as invalid (see Invalid).
type VLLMSample struct {
	// QueueDepth is vllm:num_requests_waiting, summed over engines.
	QueueDepth *float64
	// Running is vllm:num_requests_running, summed over engines.
	Running *float64
	// KVCacheUsage is vllm:kv_cache_usage_perc (or the older
	// vllm:gpu_cache_usage_perc), a fraction averaged over engines.
	KVCacheUsage *float64
	// TTFT is the cumulative vllm:time_to_first_token_seconds histogram.
	TTFT *Histogram
	// RequestSuccess is the cumulative vllm:request_success_total over every
	// finished_reason.
	RequestSuccess *float64
	// Completions are the cumulative http_requests_total counts on the
	// completion handlers; nil when the page has no http_requests_total.
	Completions *StatusCounts
	// PrefixQueries and PrefixHits are the cumulative
	// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total
	// (or the older vllm:gpu_prefix_cache_*), in prompt tokens looked up
	// and found cached. A page whose hits exceed its queries has both
	// dropped as invalid.
	PrefixQueries, PrefixHits *float64
	// Model is the model_name label of the vllm: series, if any.
	Model string
	// Invalid describes each value dropped as invalid.
	Invalid []string
}

// VLLMOptions tunes ParseVLLM.
type VLLMOptions struct {
	// CompletionHandlers are the handler label values that count for the
	// error rate. Empty: DefaultCompletionHandlers().
	CompletionHandlers []string
}

// ParseVLLM parses a vLLM /metrics page (Prometheus text format) and
// extracts the agent's values. It returns an error wrapping ErrParse when the
// page is not valid Prometheus text; invalid values (NaN, infinite, negative
// counts, fractions outside [0,1]) are dropped and listed in Invalid.
func ParseVLLM(page []byte, opts VLLMOptions) (VLLMSample, error) {
	mfs, err := parseText(page)
	if err != nil {
		return VLLMSample{}, err
	}
	handlers := opts.CompletionHandlers
	if len(handlers) == 0 {
		handlers = DefaultCompletionHandlers()
	}
	var s VLLMSample
	var iv invalids
	s.QueueDepth = sumCounts(mfs[vllmWaiting], &iv)
	s.Running = sumCounts(mfs[vllmRunning], &iv)
	if mf := mfs[vllmKVUsage]; mf != nil {
		s.KVCacheUsage = meanFraction(mf, &iv)
	} else {
		s.KVCacheUsage = meanFraction(mfs[vllmKVUsageLegacy], &iv)
	}
	s.TTFT = sumHistogram(mfs[vllmTTFT], &iv)
	s.RequestSuccess = sumCounts(mfs[vllmRequestSuccess], &iv)
	s.Completions = completionCounts(mfs[httpRequests], handlers, &iv)
	s.PrefixQueries, s.PrefixHits = prefixCounts(mfs, &iv)
	s.Model = modelName(mfs)
	s.Invalid = iv
	return s, nil
}

// prefixCounts sums the prefix-cache counters over engines, under the
// current names or, when a page has neither, the deprecated ones. Hits
// above queries cannot happen on a sound engine: both are dropped.
func prefixCounts(mfs map[string]*dto.MetricFamily, iv *invalids) (queries, hits *float64) {
	qName, hName := vllmPrefixQueries, vllmPrefixHits
	if mfs[qName] == nil && mfs[hName] == nil {
		qName, hName = vllmPrefixQueriesLegacy, vllmPrefixHitsLegacy
	}
	queries, hits = sumCounts(mfs[qName], iv), sumCounts(mfs[hName], iv)
	if queries != nil && hits != nil && *hits > *queries {
		iv.add(hName, *hits, fmt.Sprintf("exceeds %s %s", qName, fmtFloat(*queries)))
		return nil, nil
	}
	return queries, hits
}

// parseText runs the Prometheus text parser over page.
func parseText(page []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrParse, err)
	}
	return mfs, nil
}

// scalar returns the value of a gauge, counter or untyped sample.
func scalar(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// seriesName renders name{labels} for messages, keeping the labels that
// tell series apart on a vLLM or DCGM page.
func seriesName(name string, m *dto.Metric) string {
	var parts []string
	for _, lp := range m.GetLabel() {
		switch lp.GetName() {
		case "engine", "handler", "status", "gpu", "finished_reason", "le":
			parts = append(parts, lp.GetName()+"="+strconv.Quote(lp.GetValue()))
		}
	}
	if len(parts) == 0 {
		return name
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// sumCounts sums a family of non-negative scalars. Any invalid series drops
// the whole sum.
func sumCounts(mf *dto.MetricFamily, iv *invalids) *float64 {
	if mf == nil {
		return nil
	}
	total, n := 0.0, 0
	for _, m := range mf.GetMetric() {
		v, ok := scalar(m)
		if !ok {
			iv.addf("%s: unexpected type %s", mf.GetName(), mf.GetType())
			return nil
		}
		if _, why := checkCount(v); why != "" {
			iv.add(seriesName(mf.GetName(), m), v, why)
			return nil
		}
		total += v
		n++
	}
	if n == 0 {
		return nil
	}
	if _, why := checkCount(total); why != "" {
		iv.add(mf.GetName(), total, "sum "+why)
		return nil
	}
	return ptr(total)
}

// meanFraction averages a family of fractions. Any invalid series drops the
// whole mean.
func meanFraction(mf *dto.MetricFamily, iv *invalids) *float64 {
	if mf == nil {
		return nil
	}
	total, n := 0.0, 0
	for _, m := range mf.GetMetric() {
		v, ok := scalar(m)
		if !ok {
			iv.addf("%s: unexpected type %s", mf.GetName(), mf.GetType())
			return nil
		}
		f, why := checkFraction(v)
		if why != "" {
			iv.add(seriesName(mf.GetName(), m), v, why)
			return nil
		}
		total += f
		n++
	}
	if n == 0 {
		return nil
	}
	return ptr(min(max(total/float64(n), 0), 1))
}

// bucketCount returns a bucket's cumulative count, integer or float.
func bucketCount(b *dto.Bucket) float64 {
	if b.CumulativeCountFloat != nil {
		return b.GetCumulativeCountFloat()
	}
	return float64(b.GetCumulativeCount())
}

func histogramCount(h *dto.Histogram) (float64, bool) {
	switch {
	case h.SampleCountFloat != nil:
		return h.GetSampleCountFloat(), true
	case h.SampleCount != nil:
		return float64(h.GetSampleCount()), true
	}
	return 0, false
}

// sumHistogram adds up the series of a histogram family bucket by bucket.
// Every series must have the same bucket layout; a series without a +Inf
// bucket gets one from its _count.
func sumHistogram(mf *dto.MetricFamily, iv *invalids) *Histogram {
	if mf == nil {
		return nil
	}
	if mf.GetType() != dto.MetricType_HISTOGRAM {
		iv.addf("%s: unexpected type %s", mf.GetName(), mf.GetType())
		return nil
	}
	var sum *Histogram
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		series := &Histogram{Buckets: make([]Bucket, 0, len(h.GetBucket())+1)}
		for _, b := range h.GetBucket() {
			c := bucketCount(b)
			if _, why := checkCount(c); why != "" {
				iv.add(fmt.Sprintf("%s{le=%q}", seriesName(mf.GetName(), m), fmtFloat(b.GetUpperBound())), c, why)
				return nil
			}
			series.Buckets = append(series.Buckets, Bucket{UpperBound: b.GetUpperBound(), Count: c})
		}
		sort.SliceStable(series.Buckets, func(i, j int) bool {
			return series.Buckets[i].UpperBound < series.Buckets[j].UpperBound
		})
		for i := 1; i < len(series.Buckets); i++ {
			if series.Buckets[i].UpperBound == series.Buckets[i-1].UpperBound {
				iv.addf("%s: duplicate bucket le=%s", seriesName(mf.GetName(), m), fmtFloat(series.Buckets[i].UpperBound))
				return nil
			}
		}
		if n := len(series.Buckets); n == 0 || !math.IsInf(series.Buckets[n-1].UpperBound, 1) {
			c, ok := histogramCount(h)
			if !ok {
				iv.addf("%s: no +Inf bucket and no _count", seriesName(mf.GetName(), m))
				return nil
			}
			if _, why := checkCount(c); why != "" {
				iv.add(seriesName(mf.GetName(), m)+"_count", c, why)
				return nil
			}
			series.Buckets = append(series.Buckets, Bucket{UpperBound: math.Inf(1), Count: c})
		}
		if sum == nil {
			sum = series
			continue
		}
		if !sum.sameLayout(series) {
			iv.addf("%s: series disagree on bucket layout", mf.GetName())
			return nil
		}
		for i := range sum.Buckets {
			sum.Buckets[i].Count += series.Buckets[i].Count
		}
	}
	if sum != nil {
		for _, b := range sum.Buckets {
			if _, why := checkCount(b.Count); why != "" {
				iv.add(mf.GetName(), b.Count, "sum "+why)
				return nil
			}
		}
	}
	return sum
}

// classifyStatus reads an http_requests_total status label: an exact code
// ("200") or a group ("2xx"). ok is false for anything else.
func classifyStatus(s string) (isErr, ok bool) {
	if len(s) != 3 || s[0] < '1' || s[0] > '5' {
		return false, false
	}
	if s[1:] != "xx" {
		if s[1] < '0' || s[1] > '9' || s[2] < '0' || s[2] > '9' {
			return false, false
		}
	}
	return s[0] != '2', true
}

// completionCounts sums http_requests_total over the completion handlers.
// Any invalid series on those handlers drops the whole count.
func completionCounts(mf *dto.MetricFamily, handlers []string, iv *invalids) *StatusCounts {
	if mf == nil {
		return nil
	}
	var sc StatusCounts
	for _, m := range mf.GetMetric() {
		h, _ := label(m, "handler")
		if !slices.Contains(handlers, h) {
			continue
		}
		v, ok := scalar(m)
		if !ok {
			iv.addf("%s: unexpected type %s", mf.GetName(), mf.GetType())
			return nil
		}
		status, _ := label(m, "status")
		isErr, ok := classifyStatus(status)
		if !ok {
			iv.addf("%s: unrecognised status %q", seriesName(mf.GetName(), m), status)
			return nil
		}
		if _, why := checkCount(v); why != "" {
			iv.add(seriesName(mf.GetName(), m), v, why)
			return nil
		}
		sc.Total += v
		if isErr {
			sc.Errors += v
		}
	}
	if _, why := checkCount(sc.Total); why != "" {
		iv.add(mf.GetName(), sc.Total, "sum "+why)
		return nil
	}
	return &sc
}

// modelName returns the model_name label of the first vllm: series that has
// one (families are visited in name order so the result is stable).
func modelName(mfs map[string]*dto.MetricFamily) string {
	names := make([]string, 0, len(mfs))
	for n := range mfs {
		if strings.HasPrefix(n, "vllm:") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		for _, m := range mfs[n].GetMetric() {
			if v, ok := label(m, "model_name"); ok && v != "" {
				return v
			}
		}
	}
	return ""
}
