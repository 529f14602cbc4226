package regional

import (
	"cmp"
	"slices"
	"strings"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/residency"
)

// maxSummarySlices bounds ModelSummary.demand_slices.
const maxSummarySlices = 32

// summarySlice is one DemandSlice in the making.
type summarySlice struct {
	crit    isobarpb.Criticality
	allowed []string // nil: any region
	share   float64
}

// addDemandSlices sets each model's DemandSlices in sm from the measured
// split (requests/s per slice, View.DemandSlices): each slice's share of
// the model's measured demand times the (smoothed) demand_rps, so that the
// slices add up to demand_rps. Slices are merged by (criticality, the
// allowed regions of their set under rc), ordered by criticality (proto
// order) and then by regions, the unpinned first. A model whose demand is
// all standard unpinned gets none (the summary stays as it was before
// slices existed). Beyond maxSummarySlices, the smallest pinned slices are
// folded into the unpinned slice of their criticality (the region still
// keeps those requests in their regions: a set the plan carries no slice
// for is routed by the nearest-allowed rule, cycle/pinned.go); folded
// reports how many.
func addDemandSlices(sm *isobarpb.RegionSummary, split map[string]map[SliceKey]float64, rc *residency.Config) (folded int) {
	for _, m := range sm.GetModels() {
		sl := split[m.GetModel()]
		if len(sl) == 0 || !(m.GetDemandRps() > 0) {
			continue
		}
		merged, n := mergeSlices(sl, rc)
		folded += n
		if len(merged) == 1 && merged[0].crit == isobarpb.Criticality_CRITICALITY_STANDARD && merged[0].allowed == nil {
			continue
		}
		d := m.GetDemandRps()
		out := make([]*isobarpb.DemandSlice, len(merged))
		sum, largest := 0.0, 0
		for i, s := range merged {
			out[i] = &isobarpb.DemandSlice{Criticality: s.crit, AllowedRegions: s.allowed, Rps: s.share * d}
			sum += out[i].Rps
			if out[i].Rps > out[largest].Rps {
				largest = i
			}
		}
		out[largest].Rps = max(0, out[largest].Rps+d-sum) // the rounding, so that they add up
		m.DemandSlices = out
	}
	return folded
}

// mergeSlices turns one model's measured slices into shares of its
// demand by (criticality, allowed regions), sorted, at most
// maxSummarySlices; n is how many pinned slices were folded to fit.
func mergeSlices(sl map[SliceKey]float64, rc *residency.Config) (out []summarySlice, n int) {
	total := 0.0
	for _, v := range sl {
		total += v
	}
	if !(total > 0) {
		return nil, 0
	}
	byKey := map[string]*summarySlice{}
	for k, v := range sl {
		s := summarySlice{crit: k.Criticality.Proto()}
		if k.Set != "" {
			// A combined set with no region in common is served nowhere
			// (503) and cannot be said in a DemandSlice (no regions
			// means any): it stays in the unpinned slice of its
			// criticality, which the region never routes it by.
			s.allowed, _ = rc.Regions(k.Set)
		}
		id := s.crit.String() + "/" + regionsID(s.allowed)
		if byKey[id] == nil {
			byKey[id] = &s
		}
		byKey[id].share += v / total
	}
	for _, s := range byKey {
		if s.share > 0 {
			out = append(out, *s)
		}
	}
	for len(out) > maxSummarySlices {
		out, n = foldSmallest(out), n+1
	}
	slices.SortFunc(out, func(a, b summarySlice) int {
		if c := cmp.Compare(a.crit, b.crit); c != 0 {
			return c
		}
		return strings.Compare(regionsID(a.allowed), regionsID(b.allowed))
	})
	return out, n
}

// regionsID names an allowed-regions list: "*" for any region, else the
// regions joined (sorting the unpinned slice first).
func regionsID(r []string) string {
	if r == nil {
		return "*"
	}
	return "=" + strings.Join(r, ",")
}

// foldSmallest folds the smallest pinned slice into the unpinned slice of
// its criticality.
func foldSmallest(in []summarySlice) []summarySlice {
	small := -1
	for i, s := range in {
		if s.allowed != nil && (small < 0 || s.share < in[small].share) {
			small = i
		}
	}
	if small < 0 {
		return in[:maxSummarySlices] // unreachable: three unpinned slices at most
	}
	s := in[small]
	out := slices.Delete(in, small, small+1)
	for i := range out {
		if out[i].crit == s.crit && out[i].allowed == nil {
			out[i].share += s.share
			return out
		}
	}
	return append(out, summarySlice{crit: s.crit, share: s.share})
}
