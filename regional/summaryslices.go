package regional

import (
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/summary"
)

// summarySlices turns the measured split (requests/s per slice,
// View.DemandSlices) into summary.Input.DemandSlices: each set's allowed
// regions from rc, a combined set with no region in common marked
// Nowhere. summary.Aggregate does the rest, once for every region: merges
// equal (criticality, regions), bounds them to summary.MaxDemandSlices
// (dropping the smallest and their demand, never widening a pin), scales
// them to demand_rps and orders them. A model whose demand is all
// standard unpinned gets none, so its summary stays as it was before
// slices existed.
func summarySlices(split map[string]map[SliceKey]float64, rc *residency.Config) map[string][]summary.DemandSlice {
	var out map[string][]summary.DemandSlice
	for model, sl := range split {
		if onlyUnpinnedStandard(sl) {
			continue
		}
		ds := make([]summary.DemandSlice, 0, len(sl))
		for k, v := range sl {
			d := summary.DemandSlice{Criticality: k.Criticality.Proto(), RPS: v}
			if k.Set != "" {
				regions, _ := rc.Regions(k.Set)
				d.AllowedRegions, d.Nowhere = regions, len(regions) == 0
			}
			ds = append(ds, d)
		}
		if out == nil {
			out = map[string][]summary.DemandSlice{}
		}
		out[model] = ds
	}
	return out
}

// onlyUnpinnedStandard reports whether every request of a split is
// standard and unpinned (or there is none).
func onlyUnpinnedStandard(sl map[SliceKey]float64) bool {
	for k, v := range sl {
		if k != unpinnedStandard && v > 0 {
			return false
		}
	}
	return true
}
