package regional

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/summary"
)

// Data-plane report refusals; test with errors.Is.
var (
	// ErrInvalidReport is wrapped by every refused data-plane report.
	ErrInvalidReport = errors.New("regional: invalid data-plane report")
	// ErrReportOutOfRange (with ErrInvalidReport): a count implies more
	// than summary.MaxRateRPS over the report's interval.
	ErrReportOutOfRange = errors.New("regional: data-plane report count beyond the rate bound")
)

// Report limits.
const (
	maxReportEndpoints = 4096
	maxReportModels    = 64
	maxReportInterval  = time.Minute
)

// maxReportRequests is the most requests a report over interval seconds
// may count: summary.MaxRateRPS (the shared bound a summary's demand is
// checked against) over the interval, an interval under a second counting
// as a second as demand() does. At most 6e10 (a minute), so sums of
// counts stay exact in float64.
func maxReportRequests(interval float64) uint64 {
	return uint64(summary.MaxRateRPS * math.Max(interval, 1))
}

// validateReport checks a data-plane report for this region.
func validateReport(r *isobarpb.DataPlaneReport, region string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidReport, fmt.Sprintf(format, a...))
	}
	switch {
	case r.GetNode() == "" || len(r.GetNode()) > 128:
		return bad("node %q: want 1-128 bytes", trunc(r.GetNode()))
	case r.GetRegion() != region:
		return bad("region %q: this controller serves %q", trunc(r.GetRegion()), region)
	case !(r.GetIntervalSeconds() > 0) || r.GetIntervalSeconds() > maxReportInterval.Seconds():
		return bad("interval_seconds %v: want (0, %v]", r.GetIntervalSeconds(), maxReportInterval.Seconds())
	case len(r.GetEndpoints()) > maxReportEndpoints:
		return bad("%d endpoints, at most %d", len(r.GetEndpoints()), maxReportEndpoints)
	case len(r.GetDemand()) > maxReportModels:
		return bad("%d models, at most %d", len(r.GetDemand()), maxReportModels)
	}
	limit := maxReportRequests(r.GetIntervalSeconds())
	outOfRange := func(what string, n uint64) error {
		return fmt.Errorf("%w: %w: %s: %d requests in %v s is above %g requests/s", ErrInvalidReport, ErrReportOutOfRange,
			what, n, r.GetIntervalSeconds(), float64(summary.MaxRateRPS))
	}
	for _, e := range r.GetEndpoints() {
		if e.GetErrors() > e.GetRequests() || e.GetRejected() > e.GetRequests()-e.GetErrors() || len(e.GetCellId()) > 256 {
			return bad("endpoint %q: errors %d + rejected %d exceed requests %d", trunc(e.GetCellId()), e.GetErrors(), e.GetRejected(), e.GetRequests())
		}
		if e.GetRequests() > limit {
			return outOfRange(fmt.Sprintf("endpoint %q", trunc(e.GetCellId())), e.GetRequests())
		}
	}
	for _, d := range r.GetDemand() {
		if d.GetModel() == "" || len(d.GetModel()) > 256 {
			return bad("demand for %q: a model name of 1 to 256 bytes", trunc(d.GetModel()))
		}
		// Shed is not bounded by the interval's requests: a request queued
		// by the gateway's flow control arrives in one report and may be
		// refused (expired, evicted) in a later one.
		if n := max(d.GetRequests(), d.GetShed()); n > limit {
			return outOfRange(fmt.Sprintf("demand for %q", trunc(d.GetModel())), n)
		}
		if why, ok := validateSlices(d, limit); !ok {
			return bad("demand for %q: %s (at most %d slices, set names of at most %d bytes, requests within the model's)",
				trunc(d.GetModel()), why, maxReportSlices, maxSliceSetLen)
		}
	}
	return nil
}

// dataPlaneService is the gRPC adapter for DataPlane.Report: it validates
// each report and hands it to the registry.
type dataPlaneService struct {
	isobarpb.UnsafeDataPlaneServer
	region  string
	reg     *Registry
	clock   clockwork.Clock
	log     *slog.Logger
	metrics *metrics
	// mtls: only this region's gateway identities may report.
	mtls bool
}

var _ isobarpb.DataPlaneServer = (*dataPlaneService)(nil)

func (s *dataPlaneService) Report(stream isobarpb.DataPlane_ReportServer) error {
	if s.mtls {
		if err := gatewayPeer(stream.Context(), s.region); err != nil {
			s.metrics.reports.WithLabelValues("forbidden").Inc()
			s.log.Warn("data-plane report stream refused", "peer_identity", peerName(stream.Context()), "err", err)
			return status.Error(codes.PermissionDenied, err.Error())
		}
	}
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := validateReport(r, s.region); err != nil {
			result := "invalid"
			if errors.Is(err, ErrReportOutOfRange) {
				result = "out_of_range"
			}
			s.metrics.reports.WithLabelValues(result).Inc()
			s.log.Warn("data-plane report refused", "node", trunc(r.GetNode()), "err", err)
			if err := stream.Send(&isobarpb.DataPlaneAck{Error: err.Error()}); err != nil {
				return err
			}
			continue
		}
		if err := s.reg.send(stream.Context(), message{report: r}); err != nil {
			return status.Error(codes.Unavailable, err.Error())
		}
		s.metrics.reports.WithLabelValues("accepted").Inc()
	}
}

// dpSample is one report's contribution to a window.
type dpSample struct {
	at               time.Time
	span             time.Duration
	requests, errors float64
	// slices splits a demand sample's requests (demandslices.go); nil:
	// all standard unpinned.
	slices map[SliceKey]float64
}

// dpWindow keeps the samples of the last window for one cell or model.
type dpWindow struct{ samples []dpSample }

func (w *dpWindow) add(s dpSample, window time.Duration) {
	w.samples = append(w.samples, s)
	cut := 0
	for cut < len(w.samples) && s.at.Sub(w.samples[cut].at) > window {
		cut++
	}
	cut = max(cut, len(w.samples)-maxWindowSamples) // a flood of reports keeps the newest
	w.samples = w.samples[cut:]
}

// totals sums the samples newer than window before now.
func (w *dpWindow) totals(now time.Time, window time.Duration) (requests, errors float64, span time.Duration) {
	for _, s := range w.samples {
		if now.Sub(s.at) <= window {
			requests += s.requests
			errors += s.errors
			span += s.span
		}
	}
	return requests, errors, span
}

// applyReport folds a validated data-plane report into the registry's
// windows: errors per cell (unknown cells are counted and ignored; remote
// regions' ingress endpoints are not cells) and demand per model, with
// its split into slices (demandslices.go).
func (r *Registry) applyReport(now time.Time, rep *isobarpb.DataPlaneReport) {
	span := time.Duration(rep.GetIntervalSeconds() * float64(time.Second))
	window := r.cfg.DataPlaneWindow
	for _, e := range rep.GetEndpoints() {
		id := e.GetCellId()
		c := r.cells[id]
		if c == nil {
			if len(id) < 7 || id[:7] != "region/" {
				r.metrics.unknownCells.Inc()
			}
			continue
		}
		w := r.dpCells[id]
		if w == nil {
			w = &dpWindow{}
			r.dpCells[id] = w
		}
		w.add(dpSample{at: now, span: span, requests: float64(e.GetRequests()), errors: float64(e.GetErrors())}, window)
		r.touch(c) // its error window moved
	}
	for _, d := range rep.GetDemand() {
		key := rep.GetNode() + "\x00" + d.GetModel()
		w := r.dpDemand[key]
		if w == nil {
			if !r.admitDemandKey(key) {
				continue
			}
			w = &dpWindow{}
			r.dpDemand[key] = w
		}
		w.add(dpSample{at: now, span: span, requests: float64(d.GetRequests()), errors: float64(d.GetShed()), slices: r.sliceCounts(d)}, window)
	}
}

// dataPlaneErrors returns the cell's error rate as the data plane saw it
// over the window, with the number of requests behind it, and when it
// changes next unless a report comes first: when its oldest sample leaves
// the window (zero with no requests in the window).
func (r *Registry) dataPlaneErrors(now time.Time, id string) (cycle.ErrorWindow, time.Time) {
	w := r.dpCells[id]
	if w == nil {
		return cycle.ErrorWindow{}, time.Time{}
	}
	window := r.cfg.DataPlaneWindow
	req, errs, _ := w.totals(now, window)
	if req == 0 {
		return cycle.ErrorWindow{}, time.Time{}
	}
	var oldest time.Time
	for _, s := range w.samples { // in the order they came
		if now.Sub(s.at) <= window {
			oldest = s.at
			break
		}
	}
	return cycle.ErrorWindow{Rate: math.Min(1, errs/req), Requests: req, OK: true}, oldest.Add(window)
}

// demand returns the ingress demand per model (requests/s) over the window,
// summed over every reporting data plane; nil when none reported.
func (r *Registry) demand(now time.Time) map[string]float64 {
	if len(r.dpDemand) == 0 {
		return nil
	}
	out := map[string]float64{}
	for key, w := range r.dpDemand {
		req, _, span := w.totals(now, r.cfg.DataPlaneWindow)
		if span <= 0 {
			if len(w.samples) == 0 || now.Sub(w.samples[len(w.samples)-1].at) > r.cfg.DataPlaneWindow {
				delete(r.dpDemand, key)
			}
			continue
		}
		// A data plane that just started reports over a short interval;
		// dividing by it would turn a handful of requests into a spike
		// (and a spurious shed). Under a second counts as a second.
		out[modelOf(key)] += req / max(span, time.Second).Seconds()
	}
	return out
}

func modelOf(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return key[i+1:]
		}
	}
	return key
}
