package summary

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/internal/quantile"
	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Cell is what aggregation needs to know about one cell.
type Cell struct {
	Model string
	State isobarpb.LifecycleState
	// Pressure in [0,1].
	Pressure float64
	// Fallback: a telemetry source is missing.
	Fallback bool
	// CapacityRPS is the cell's estimated capacity at SLO (requests/s).
	CapacityRPS float64
	// CapacityConfidence in [0,1]: how far CapacityRPS is measured rather
	// than the configured prior (0: the prior alone).
	CapacityConfidence float64
	// LoadRPS is the cell's completed requests/s.
	LoadRPS float64
	// TTFTP95 (seconds), ErrorRate and its request count over the agent's
	// window, KV-cache use; nil when unknown.
	TTFTP95        *float64
	ErrorRate      *float64
	WindowRequests *float64
	KVUsage        *float64
	MaxModelLen    uint32
	// LowLoadTTFT is the cell's learned TTFT at low load (seconds; the
	// capacity estimator's T0, stable across windows), or nil when not
	// learned yet. The model's engine latency is their median.
	LowLoadTTFT *float64
}

// Input is everything one summary is built from.
type Input struct {
	Region      string
	Incarnation string
	Sequence    uint64
	Now         time.Time
	Cells       []Cell
	// Demand is the ingress demand per model (requests/s) measured at the
	// region's data plane.
	Demand map[string]float64
	// DemandSlices splits a model's Demand by criticality and allowed
	// regions (nil: all standard, unpinned); see aggregateSlices for how
	// it is bounded and scaled to add up to the model's demand_rps (and
	// why demand_rps can shrink: pinned demand with nowhere to go).
	DemandSlices map[string][]DemandSlice
	// RTT to other regions, as measured (regional/gossip). The summary
	// lists only the NearestRTT nearest of them.
	RTT map[string]time.Duration
	// NearestRTT is how many of RTT the summary lists, nearest first:
	// 0 means DefaultNearestRTT, more than MaxNearestRTT is clamped to it,
	// negative lists every peer (the pre-issue-26 summary, for
	// comparisons). Receivers estimate the other pairs from Coordinate.
	NearestRTT int
	// Coordinate is the region's Vivaldi network coordinate (regional/gossip
	// Node.Coordinate), nil when unknown or not placed by probes yet.
	// Aggregate leaves out one that would not validate (CoordinateProto).
	Coordinate *coordinate.Coordinate
	// IngressAddress is where other regions forward traffic to this one.
	IngressAddress string
	// DefaultEngineLatencyMs is used when no cell has a TTFT at low load.
	DefaultEngineLatencyMs float64
	// ContextClasses are the max_tokens bounds of the context-length
	// classes, ascending; at most MaxContextClasses. Default
	// DefaultContextClasses.
	ContextClasses []uint32
}

// Limits on a summary's shape: they bound its size by models and regions.
const (
	MaxModels         = 64
	MaxContextClasses = 8
	MaxRegions        = 4096
	maxNameLen        = 128
	maxModelNameLen   = 256
)

// DefaultContextClasses are the context-length classes used when Input
// names none: 4k, 8k, 32k and 128k tokens.
func DefaultContextClasses() []uint32 { return []uint32{4096, 8192, 32768, 131072} }

// lowLoadPressure: cells at or below this pressure inform the low-load
// engine latency.
const lowLoadPressure = 0.5

// Aggregate builds the summary of one region. Cells are grouped by model;
// models and RTT entries are sorted so equal inputs give equal bytes. It
// lists the RTTs to the Input.NearestRTT nearest regions and the region's
// coordinate (rtt.go), so its size depends on models, classes and slices,
// never on cells or regions.
func Aggregate(in Input) *isobarpb.RegionSummary {
	classes := in.ContextClasses
	if len(classes) == 0 {
		classes = DefaultContextClasses()
	}
	if len(classes) > MaxContextClasses {
		classes = classes[:MaxContextClasses]
	}
	byModel := map[string][]Cell{}
	for _, c := range in.Cells {
		byModel[c.Model] = append(byModel[c.Model], c)
	}
	for m := range in.Demand {
		if _, ok := byModel[m]; !ok {
			byModel[m] = nil
		}
	}
	names := make([]string, 0, len(byModel))
	for m := range byModel {
		if m != "" && len(m) <= maxModelNameLen {
			names = append(names, m)
		}
	}
	slices.Sort(names)
	if len(names) > MaxModels {
		names = names[:MaxModels]
	}
	s := &isobarpb.RegionSummary{
		Region: in.Region, Incarnation: in.Incarnation, Sequence: in.Sequence,
		At: timestamppb.New(in.Now), IngressAddress: in.IngressAddress,
	}
	for _, m := range names {
		ms := aggregateModel(m, byModel[m], in.Demand[m], in.DefaultEngineLatencyMs, classes)
		ms.DemandSlices, ms.DemandRps = aggregateSlices(in.DemandSlices[m], ms.GetDemandRps())
		s.Models = append(s.Models, ms)
	}
	s.Rtt = nearestRTT(in)
	s.Coordinate = CoordinateProto(in.Coordinate)
	return s
}

func aggregateModel(name string, cells []Cell, demand, defaultLatency float64, classes []uint32) *isobarpb.ModelSummary {
	a := modelAgg{
		ms:      &isobarpb.ModelSummary{Model: name, DemandRps: saturate(demand, MaxRateRPS)},
		clsConf: make([]float64, len(classes)),
		cls:     make([]*isobarpb.ContextClass, len(classes)),
	}
	for i, c := range classes {
		a.cls[i] = &isobarpb.ContextClass{MaxTokens: c}
	}
	for _, c := range cells {
		a.count(c)
		if c.State == isobarpb.LifecycleState_LIFECYCLE_STATE_READY {
			a.addReady(c)
		}
	}
	a.finishCapacity()
	a.finishSignals(defaultLatency)
	return a.ms
}

// modelAgg accumulates one model's summary over its cells, in cell order.
type modelAgg struct {
	ms                                             *isobarpb.ModelSummary
	pressures, lowLoadTTFT, learnedT0              []float64
	errWeighted, errRequests, kvFree, confWeighted float64
	kvN                                            int
	clsConf                                        []float64
	cls                                            []*isobarpb.ContextClass
}

// count tallies a cell by lifecycle state, and the load of a serving one.
func (a *modelAgg) count(c Cell) {
	ms := a.ms
	switch c.State {
	case isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING:
		ms.CellsLoading++
	case isobarpb.LifecycleState_LIFECYCLE_STATE_READY:
		ms.CellsReady++
	case isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING:
		ms.CellsDraining++
	case isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED:
		ms.CellsFailed++
	case isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED:
		ms.CellsTerminated++
	}
	if c.State == isobarpb.LifecycleState_LIFECYCLE_STATE_READY || c.State == isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING {
		ms.LoadRps += saturate(c.LoadRPS, MaxRateRPS)
	}
}

// addReady adds a READY cell's capacity and signals.
func (a *modelAgg) addReady(c Cell) {
	ms := a.ms
	if c.Fallback {
		ms.FallbackCells++
	}
	capRPS := saturate(c.CapacityRPS, MaxRateRPS)
	conf := clamp01(c.CapacityConfidence)
	ms.CapacityRps += capRPS
	a.confWeighted += conf * capRPS
	p := clamp01(c.Pressure)
	a.pressures = append(a.pressures, p)
	if c.LowLoadTTFT != nil && isFinite(*c.LowLoadTTFT) && *c.LowLoadTTFT > 0 {
		a.learnedT0 = append(a.learnedT0, saturate(*c.LowLoadTTFT, MaxTTFTSeconds))
	}
	if c.TTFTP95 != nil && isFinite(*c.TTFTP95) {
		ttft := saturate(*c.TTFTP95, MaxTTFTSeconds)
		ms.TtftP95Seconds = math.Max(ms.TtftP95Seconds, ttft)
		if p <= lowLoadPressure {
			a.lowLoadTTFT = append(a.lowLoadTTFT, ttft)
		}
	}
	if c.ErrorRate != nil && c.WindowRequests != nil && isFinite(*c.ErrorRate) && isFinite(*c.WindowRequests) {
		w := saturate(*c.WindowRequests, MaxSignal)
		a.errWeighted += clamp01(*c.ErrorRate) * w
		a.errRequests += w
	}
	if c.KVUsage != nil && isFinite(*c.KVUsage) {
		a.kvFree += 1 - clamp01(*c.KVUsage)
		a.kvN++
	}
	for i, cl := range a.cls {
		if c.MaxModelLen == 0 || c.MaxModelLen >= cl.MaxTokens {
			cl.Cells++
			cl.CapacityRps += capRPS
			a.clsConf[i] += conf * capRPS
		}
	}
}

// finishCapacity turns the capacity sums into confidences and saturates
// the totals.
func (a *modelAgg) finishCapacity() {
	ms := a.ms
	if ms.CapacityRps > 0 {
		ms.CapacityConfidence = clamp01(a.confWeighted / ms.CapacityRps)
	}
	for i, cl := range a.cls {
		if cl.CapacityRps > 0 {
			cl.CapacityConfidence = clamp01(a.clsConf[i] / cl.CapacityRps)
		}
		// Sums over many cells saturate at the bounds Validate checks
		// (bounds.go): the summary says "at least this much".
		cl.CapacityRps = saturate(cl.CapacityRps, MaxRateRPS)
		cl.Cells = min(cl.Cells, MaxCells)
	}
	ms.CapacityRps = saturate(ms.CapacityRps, MaxRateRPS)
	ms.LoadRps = saturate(ms.LoadRps, MaxRateRPS)
	ms.CellsLoading, ms.CellsReady, ms.CellsDraining = min(ms.CellsLoading, MaxCells), min(ms.CellsReady, MaxCells), min(ms.CellsDraining, MaxCells)
	ms.CellsFailed, ms.CellsTerminated, ms.FallbackCells = min(ms.CellsFailed, MaxCells), min(ms.CellsTerminated, MaxCells), min(ms.FallbackCells, MaxCells)
	ms.ContextClasses = a.cls
}

// finishSignals sets pressure, error rate, KV headroom and engine latency.
func (a *modelAgg) finishSignals(defaultLatency float64) {
	ms := a.ms
	if len(a.pressures) > 0 {
		slices.Sort(a.pressures)
		ms.PressureMin = a.pressures[0]
		var sum float64
		for _, p := range a.pressures {
			sum += p
		}
		ms.PressureMean = clamp01(sum / float64(len(a.pressures)))
		ms.PressureP90 = quantile.Sorted(a.pressures, 0.9)
	}
	if a.errRequests > 0 {
		ms.ErrorRate = clamp01(a.errWeighted / a.errRequests)
	}
	if a.kvN > 0 {
		ms.KvHeadroom = a.kvFree / float64(a.kvN)
	}
	// The engine latency the planner weighs: the median learned low-load
	// TTFT of the cells, when any has one; else the median current TTFT
	// P95 of the lightly loaded cells. A window's P95 at a low rate is the
	// maximum of a handful of requests: between identical regions it
	// differs by more than their RTTs, and the planner would spill to a
	// farther region whose last window happened to be quicker.
	ms.EngineLatencyMs = saturate(defaultLatency, MaxEngineLatencyMs)
	switch {
	case len(a.learnedT0) > 0:
		slices.Sort(a.learnedT0)
		ms.EngineLatencyMs = saturate(1000*a.learnedT0[len(a.learnedT0)/2], MaxEngineLatencyMs)
	case len(a.lowLoadTTFT) > 0:
		slices.Sort(a.lowLoadTTFT)
		ms.EngineLatencyMs = saturate(1000*a.lowLoadTTFT[len(a.lowLoadTTFT)/2], MaxEngineLatencyMs)
	}
}

// Validation errors; test with errors.Is.
var (
	// ErrInvalid is wrapped by every Validate and ValidateAt error.
	ErrInvalid = errors.New("summary: invalid")
	// ErrFuture is wrapped (with ErrInvalid) by ValidateAt's refusal of a
	// summary dated more than MaxFutureSkew after the receiver's clock.
	ErrFuture = errors.New("summary: dated in the future")
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidName reports whether s is a valid region or cell name: 1–128
// characters of letters, digits, '.', '_' and '-', starting with a letter
// or digit. The regional controller checks cell ids with it too.
func ValidName(s string) bool { return namePattern.MatchString(s) }

// Validate checks a received summary: known shape, finite non-negative
// values, fractions in [0,1], bounded lists, a coordinate within
// ValidateCoordinate's bounds. The RTT list may name every other region
// (at most MaxRegions): a pre-issue-26 region sends the full list, and a
// mixed-version fleet keeps working during an upgrade. The error names the
// field.
func Validate(s *isobarpb.RegionSummary) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if s == nil {
		return bad("nil summary")
	}
	if !ValidName(s.GetRegion()) {
		return bad("region %q: want 1-128 characters of [A-Za-z0-9._-]", trunc(s.GetRegion()))
	}
	if len(s.GetIncarnation()) > maxNameLen {
		return bad("region %s: incarnation longer than %d bytes", s.GetRegion(), maxNameLen)
	}
	if s.GetSequence() == 0 {
		return bad("region %s: sequence must start at 1", s.GetRegion())
	}
	if s.GetAt() == nil || s.GetAt().CheckValid() != nil {
		return bad("region %s: missing or invalid time", s.GetRegion())
	}
	if a := s.GetIngressAddress(); a != "" {
		if err := validAddress(a); err != nil {
			return bad("region %s: ingress_address: %v", s.GetRegion(), err)
		}
	}
	if len(s.GetModels()) > MaxModels {
		return bad("region %s: %d models, at most %d", s.GetRegion(), len(s.GetModels()), MaxModels)
	}
	seen := map[string]bool{}
	for _, m := range s.GetModels() {
		if err := validateModel(m); err != nil {
			return bad("region %s: %v", s.GetRegion(), err)
		}
		if seen[m.GetModel()] {
			return bad("region %s: model %q listed twice", s.GetRegion(), trunc(m.GetModel()))
		}
		seen[m.GetModel()] = true
	}
	if len(s.GetRtt()) > MaxRegions {
		return bad("region %s: %d RTT entries, at most %d", s.GetRegion(), len(s.GetRtt()), MaxRegions)
	}
	peers := map[string]bool{}
	for _, r := range s.GetRtt() {
		switch {
		case !ValidName(r.GetRegion()):
			return bad("region %s: rtt region %q invalid", s.GetRegion(), trunc(r.GetRegion()))
		case r.GetRegion() == s.GetRegion():
			return bad("region %s: rtt to itself", s.GetRegion())
		case peers[r.GetRegion()]:
			return bad("region %s: rtt to %s listed twice", s.GetRegion(), r.GetRegion())
		case !isFinite(r.GetRttMs()) || r.GetRttMs() < 0 || r.GetRttMs() > MaxRTTMs:
			return bad("region %s: rtt to %s is %v ms; want a finite value in [0, %d]", s.GetRegion(), r.GetRegion(), r.GetRttMs(), MaxRTTMs)
		}
		peers[r.GetRegion()] = true
	}
	if c := s.GetCoordinate(); c != nil {
		if err := ValidateCoordinate(c); err != nil {
			return fmt.Errorf("region %s: %w", s.GetRegion(), err)
		}
	}
	return nil
}

// ValidateAt is Validate for a summary received at now (the receiver's
// clock): it also refuses one dated more than MaxFutureSkew ahead, with an
// error wrapping ErrFuture and ErrInvalid. A summary from the future would
// otherwise win Newer over its region's real ones until that time passes.
// Receivers (global intake, gossip) call this one; Validate is for checks
// that have no clock (an Aggregate's own output, fuzzing).
func ValidateAt(s *isobarpb.RegionSummary, now time.Time) error {
	if err := Validate(s); err != nil {
		return err
	}
	if at := s.GetAt().AsTime(); at.Sub(now) > MaxFutureSkew {
		return fmt.Errorf("%w: %w: region %s: time %s is %v ahead of this clock (%s), beyond the %v allowed; check the region's clock (NTP)",
			ErrInvalid, ErrFuture, s.GetRegion(), at.Format(time.RFC3339Nano), at.Sub(now).Round(time.Millisecond), now.Format(time.RFC3339Nano), MaxFutureSkew)
	}
	return nil
}

func validateModel(m *isobarpb.ModelSummary) error {
	name := m.GetModel()
	if name == "" || len(name) > maxModelNameLen {
		return fmt.Errorf("model name %q: want 1-%d bytes", trunc(name), maxModelNameLen)
	}
	counts := []uint32{m.GetCellsLoading(), m.GetCellsReady(), m.GetCellsDraining(), m.GetCellsFailed(), m.GetCellsTerminated(), m.GetFallbackCells()}
	for _, c := range counts {
		if c > MaxCells {
			return fmt.Errorf("model %s: cell count %d implausible", name, c)
		}
	}
	if m.GetFallbackCells() > m.GetCellsReady() {
		return fmt.Errorf("model %s: fallback_cells %d > cells_ready %d", name, m.GetFallbackCells(), m.GetCellsReady())
	}
	rates := []struct {
		field string
		v     float64
		max   float64
	}{
		{"capacity_rps", m.GetCapacityRps(), MaxRateRPS}, {"load_rps", m.GetLoadRps(), MaxRateRPS},
		{"demand_rps", m.GetDemandRps(), MaxRateRPS}, {"ttft_p95_seconds", m.GetTtftP95Seconds(), MaxTTFTSeconds},
		{"engine_latency_ms", m.GetEngineLatencyMs(), MaxEngineLatencyMs},
		{"pressure_min", m.GetPressureMin(), 1}, {"pressure_mean", m.GetPressureMean(), 1},
		{"pressure_p90", m.GetPressureP90(), 1}, {"error_rate", m.GetErrorRate(), 1}, {"kv_headroom", m.GetKvHeadroom(), 1},
		{"capacity_confidence", m.GetCapacityConfidence(), 1},
	}
	for _, r := range rates {
		if !isFinite(r.v) || r.v < 0 || r.v > r.max {
			return fmt.Errorf("model %s: %s is %v; want a finite value in [0, %g]", name, r.field, r.v, r.max)
		}
	}
	if m.GetPressureMin() > m.GetPressureMean()+1e-9 || m.GetPressureMean() > 1 {
		return fmt.Errorf("model %s: pressure_min %v > pressure_mean %v", name, m.GetPressureMin(), m.GetPressureMean())
	}
	if err := validateSlices(m); err != nil {
		return err
	}
	if len(m.GetContextClasses()) > MaxContextClasses {
		return fmt.Errorf("model %s: %d context classes, at most %d", name, len(m.GetContextClasses()), MaxContextClasses)
	}
	var prev uint32
	for _, c := range m.GetContextClasses() {
		if c.GetMaxTokens() <= prev {
			return fmt.Errorf("model %s: context classes must have ascending max_tokens > 0", name)
		}
		prev = c.GetMaxTokens()
		if !isFinite(c.GetCapacityRps()) || c.GetCapacityRps() < 0 || c.GetCapacityRps() > MaxRateRPS || c.GetCells() > MaxCells {
			return fmt.Errorf("model %s: context class %d: bad capacity", name, c.GetMaxTokens())
		}
		if cc := c.GetCapacityConfidence(); !isFinite(cc) || cc < 0 || cc > 1 {
			return fmt.Errorf("model %s: context class %d: capacity_confidence is %v; want a finite value in [0, 1]", name, c.GetMaxTokens(), cc)
		}
	}
	return nil
}

// validAddress requires IP:port: the address goes into EDS, which refuses
// host names.
func validAddress(a string) error {
	ap, err := netip.ParseAddrPort(a)
	if err != nil {
		return fmt.Errorf("%q is not IP:port", trunc(a))
	}
	if ap.Port() == 0 {
		return fmt.Errorf("%q: port must be 1-65535", trunc(a))
	}
	return nil
}

// Newer reports whether a is more recent than b from the same region: a
// different incarnation counts as newer when its time is later.
func Newer(a, b *isobarpb.RegionSummary) bool {
	if b == nil {
		return true
	}
	if a.GetIncarnation() == b.GetIncarnation() {
		return a.GetSequence() > b.GetSequence()
	}
	return cmp.Compare(a.GetAt().AsTime().UnixNano(), b.GetAt().AsTime().UnixNano()) > 0
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func clamp01(v float64) float64 {
	switch {
	case !isFinite(v) || v < 0:
		return 0
	case v > 1:
		return 1
	}
	return v
}

// trunc bounds outside input quoted in errors.
func trunc(s string) string { return truncate.Marked(s, 64, "…") }
