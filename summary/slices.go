package summary

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Bounds on a model's demand slices.
const (
	// MaxDemandSlices bounds ModelSummary.demand_slices (3 criticalities
	// times the residency sets a region names, plus the unpinned ones).
	MaxDemandSlices = 32
	// MaxAllowedRegions bounds one slice's allowed_regions.
	MaxAllowedRegions = 64
	// SliceSumTolerance is how far (relative, with an absolute floor of
	// SliceSumFloorRPS) the slices' rps may add up from demand_rps.
	SliceSumTolerance = 1e-3
	// SliceSumFloorRPS is the absolute floor of that tolerance.
	SliceSumFloorRPS = 1e-3
)

// DemandSlice is one slice of a model's ingress demand as the regional
// controller measured it: a criticality and the regions its requests may
// be served in (nil or empty: any).
type DemandSlice struct {
	Criticality    isobarpb.Criticality
	AllowedRegions []string
	RPS            float64
	// Nowhere marks requests no region may serve (pinned to a combined
	// residency set whose regions have none in common): they are taken
	// out of the demand, like a pinned slice with no valid region, never
	// planned as unpinned.
	Nowhere bool
}

// validateSlices checks a model's demand slices: at most
// MaxDemandSlices, each a known criticality with a finite rps in [0,
// MaxRateRPS] and allowed regions that are valid names, sorted, without
// repeats, no (criticality, allowed regions) twice (unspecified counts as
// standard), adding up to demand_rps within SliceSumTolerance.
func validateSlices(m *isobarpb.ModelSummary) error {
	ds := m.GetDemandSlices()
	name := m.GetModel()
	if len(ds) == 0 {
		return nil
	}
	if len(ds) > MaxDemandSlices {
		return fmt.Errorf("model %s: %d demand slices, at most %d", name, len(ds), MaxDemandSlices)
	}
	seen := make(map[string]int, len(ds))
	var sum float64
	for k, s := range ds {
		if _, ok := isobarpb.Criticality_name[int32(s.GetCriticality())]; !ok {
			return fmt.Errorf("model %s: demand_slices[%d]: unknown criticality %d", name, k, s.GetCriticality())
		}
		if v := s.GetRps(); !isFinite(v) || v < 0 || v > MaxRateRPS {
			return fmt.Errorf("model %s: demand_slices[%d].rps is %v; want a finite value in [0, %g]", name, k, v, float64(MaxRateRPS))
		}
		if err := validAllowed(s.GetAllowedRegions()); err != nil {
			return fmt.Errorf("model %s: demand_slices[%d].allowed_regions: %v", name, k, err)
		}
		key := sliceKey(s.GetCriticality(), s.GetAllowedRegions())
		if at, dup := seen[key]; dup {
			return fmt.Errorf("model %s: demand_slices[%d] repeats the criticality and allowed regions of demand_slices[%d]", name, k, at)
		}
		seen[key] = k
		sum += s.GetRps()
	}
	if d := m.GetDemandRps(); math.Abs(sum-d) > SliceSumTolerance*math.Max(sum, d)+SliceSumFloorRPS {
		return fmt.Errorf("model %s: demand slices add up to %v rps, demand_rps is %v", name, sum, d)
	}
	return nil
}

// validAllowed checks a slice's allowed regions.
func validAllowed(rs []string) error {
	if len(rs) > MaxAllowedRegions {
		return fmt.Errorf("%d regions, at most %d", len(rs), MaxAllowedRegions)
	}
	for k, r := range rs {
		if !ValidName(r) {
			return fmt.Errorf("region %q invalid", trunc(r))
		}
		if k > 0 && rs[k-1] >= r {
			return fmt.Errorf("not sorted without repeats at %q", r)
		}
	}
	return nil
}

// standardOf maps unspecified to standard.
func standardOf(c isobarpb.Criticality) isobarpb.Criticality {
	if c == isobarpb.Criticality_CRITICALITY_UNSPECIFIED {
		return isobarpb.Criticality_CRITICALITY_STANDARD
	}
	return c
}

// sliceKey identifies a slice's (criticality, allowed regions).
func sliceKey(c isobarpb.Criticality, allowed []string) string {
	return fmt.Sprintf("%d|%s", standardOf(c), strings.Join(allowed, ","))
}

// aggregateSlices turns a model's measured slices into the summary's and
// returns them with the model's demand_rps: unknown criticalities count as
// standard, allowed regions are sorted, deduplicated and stripped of
// invalid names, equal (criticality, allowed regions) are merged, the
// rates saturated. A slice whose requests may go nowhere (a pinned slice
// with no valid region name) is dropped, and so are the smallest beyond
// MaxDemandSlices; their share of demand is taken out of demand_rps rather
// than given to the others, so no pinned demand is ever planned as
// unpinned. The rest are scaled to add up to the new demand_rps and
// ordered by criticality, then allowed regions, so equal inputs give
// equal bytes. Without slices, or when they add up to 0, it returns nil
// (all demand standard and unpinned) and demand unchanged.
func aggregateSlices(in []DemandSlice, demand float64) ([]*isobarpb.DemandSlice, float64) {
	byKey := map[string]*isobarpb.DemandSlice{}
	var out []*isobarpb.DemandSlice
	var all float64
	for _, s := range in {
		rps := saturate(s.RPS, MaxRateRPS)
		all += rps
		c := standardOf(s.Criticality)
		if _, ok := isobarpb.Criticality_name[int32(c)]; !ok {
			c = isobarpb.Criticality_CRITICALITY_STANDARD
		}
		var allowed []string
		for _, r := range s.AllowedRegions {
			if ValidName(r) {
				allowed = append(allowed, r)
			}
		}
		slices.Sort(allowed)
		allowed = slices.Compact(allowed)
		if s.Nowhere || (len(s.AllowedRegions) > 0 && len(allowed) == 0) || len(allowed) > MaxAllowedRegions {
			continue
		}
		key := sliceKey(c, allowed)
		if d, ok := byKey[key]; ok {
			d.Rps += rps
			continue
		}
		d := &isobarpb.DemandSlice{Criticality: c, AllowedRegions: allowed, Rps: rps}
		byKey[key] = d
		out = append(out, d)
	}
	return fitSlices(out, demand, all)
}

// fitSlices keeps the MaxDemandSlices largest slices (ties: the first in
// order), takes the share of what was dropped (all is the measured total)
// out of demand, scales the rest to add up to it, and orders them by
// criticality, then allowed regions.
func fitSlices(out []*isobarpb.DemandSlice, demand, all float64) ([]*isobarpb.DemandSlice, float64) {
	slices.SortFunc(out, func(a, b *isobarpb.DemandSlice) int {
		return cmp.Or(cmp.Compare(a.GetCriticality(), b.GetCriticality()), slices.Compare(a.GetAllowedRegions(), b.GetAllowedRegions()))
	})
	for len(out) > MaxDemandSlices {
		small := 0
		for k, s := range out {
			if s.GetRps() < out[small].GetRps() {
				small = k
			}
		}
		out = slices.Delete(out, small, small+1)
	}
	var sum float64
	for _, s := range out {
		sum += s.GetRps()
	}
	if all <= 0 || demand <= 0 {
		return nil, demand
	}
	demand *= math.Min(1, sum/all)
	if sum <= 0 || demand <= 0 {
		return nil, 0
	}
	for _, s := range out {
		s.Rps *= demand / sum
	}
	return out, demand
}
