package regional

import (
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/reqclass"
)

// Demand slices (issue 25): a data plane splits each model's demand by
// criticality and residency set (ModelDemand.slices). The registry keeps
// the split per (model, criticality, set) in the same windows as the
// demand, and the summary builder reports it as DemandSlices by the set's
// allowed regions (summaryslices.go).

// maxReportSlices bounds a model's slices in one report.
const maxReportSlices = 64

// maxSliceSetLen bounds a slice's residency set name: two set names
// joined by "+" (residency's names are at most 64 bytes each).
const maxSliceSetLen = 129

// SliceKey is one slice of a model's demand: a criticality and a
// residency set ("" unpinned, "a+b" for a tenant's set combined with a
// model's).
type SliceKey struct {
	Criticality reqclass.Criticality
	Set         string
}

// unpinnedStandard is the slice of demand that says nothing.
var unpinnedStandard = SliceKey{Criticality: reqclass.Standard}

// validateSlices checks one model's slices in a report: at most
// maxReportSlices, each set name bounded, each slice's shed within the
// report's rate bound (limit; not within its requests: a queued request
// may be refused in a later report than the one that counted it), and the
// slices' requests within the model's.
func validateSlices(d *isobarpb.ModelDemand, limit uint64) (string, bool) {
	sl := d.GetSlices()
	if len(sl) > maxReportSlices {
		return "slices: too many", false
	}
	var sum uint64
	for _, s := range sl {
		if len(s.GetResidency()) > maxSliceSetLen || s.GetShed() > limit || s.GetRequests() > d.GetRequests() {
			return "slice " + trunc(s.GetResidency()) + ": bad set name or counts", false
		}
		sum += s.GetRequests()
	}
	if sum > d.GetRequests() {
		return "slices count more requests than the model", false
	}
	return "", true
}

// sliceCounts maps a validated ModelDemand's slices to requests per
// SliceKey. A set this controller's residency config does not define is
// never trusted as a pin: its requests count as standard unpinned
// (counted, unknown_set), as do those of an unknown criticality
// (unknown_criticality, keeping the set). Requests the slices leave out
// are standard unpinned (demandSlices). nil when the report has none.
func (r *Registry) sliceCounts(d *isobarpb.ModelDemand) map[SliceKey]float64 {
	if len(d.GetSlices()) == 0 {
		return nil
	}
	out := make(map[SliceKey]float64, len(d.GetSlices()))
	for _, s := range d.GetSlices() {
		k := SliceKey{Set: s.GetResidency()}
		if _, known := isobarpb.Criticality_name[int32(s.GetCriticality())]; known {
			k.Criticality = reqclass.FromProto(s.GetCriticality())
		} else {
			k.Criticality = reqclass.Standard
			r.metrics.slicesFolded.WithLabelValues("unknown_criticality").Inc()
		}
		if k.Set != "" {
			if _, ok := r.cfg.Residency.Regions(k.Set); !ok {
				k = unpinnedStandard
				r.metrics.slicesFolded.WithLabelValues("unknown_set").Inc()
			}
		}
		out[k] += float64(s.GetRequests())
	}
	return out
}

// addSampleSlices adds a sample's slices (nil: all standard unpinned) to acc
// with the sample's requests; the requests the slices leave out go to
// standard unpinned.
func addSampleSlices(acc map[SliceKey]float64, s dpSample) {
	rest := s.requests
	for k, n := range s.slices {
		acc[k] += n
		rest -= n
	}
	if rest > 0 {
		acc[unpinnedStandard] += rest
	}
}

// demandSlices returns, per model, the demand (requests/s) of each slice
// over the window, summed over every reporting data plane, in the same
// units as demand; nil when no data plane reports a slice other than
// standard unpinned.
func (r *Registry) demandSlices(now time.Time) map[string]map[SliceKey]float64 {
	var out map[string]map[SliceKey]float64
	split := false
	for key, w := range r.dpDemand {
		_, _, span := w.totals(now, r.cfg.DataPlaneWindow)
		if span <= 0 {
			continue
		}
		acc := map[SliceKey]float64{}
		for _, s := range w.samples {
			if now.Sub(s.at) <= r.cfg.DataPlaneWindow {
				addSampleSlices(acc, s)
			}
		}
		if out == nil {
			out = map[string]map[SliceKey]float64{}
		}
		m := modelOf(key)
		if out[m] == nil {
			out[m] = map[SliceKey]float64{}
		}
		for k, n := range acc {
			out[m][k] += n / max(span, time.Second).Seconds()
			split = split || (k != unpinnedStandard && n > 0)
		}
	}
	if !split {
		return nil
	}
	return out
}
