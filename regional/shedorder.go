package regional

import "github.com/isobar-mesh/isobar/reqclass"

// orderShed turns a blind shed — one share of a model's whole demand, as
// a plan without slices (an older leader) or the gossip fallback planner
// gives it — into a share per criticality, shedding in the order a
// slice-aware leader would: sheddable first, then standard, critical
// only what the other two cannot absorb. mix is the region's measured
// demand per slice (View.DemandSlices; only the unpinned slices count).
// With no measured mix (no data plane reports slices: Envoy, or no
// traffic yet) every criticality gets the blind share, as before issue
// 25.
func orderShed(shed float64, mix map[SliceKey]float64) (critical, standard, sheddable float64) {
	var d [reqclass.Count]float64
	var total float64
	for k, v := range mix {
		if k.Set == "" && v > 0 {
			d[k.Criticality] += v
			total += v
		}
	}
	if total <= 0 || shed <= 0 {
		return shed, shed, shed
	}
	left := shed * total
	var out [reqclass.Count]float64
	for _, c := range reqclass.ShedOrder() {
		if d[c] <= 0 {
			continue
		}
		take := min(left, d[c])
		out[c] = take / d[c]
		left -= take
	}
	return out[reqclass.Critical], out[reqclass.Standard], out[reqclass.Sheddable]
}

// orderedShares are a model's unpinned shed shares as the cycle applies
// them: a sliced plan's as planned, with sheddable never shed less than
// standard (a sheddable request arriving where the leader saw none must
// not fare better than a standard one); a blind plan's ordered by the
// measured mix (orderShed).
func orderedShares(mr ModelRoutes, mix map[SliceKey]float64) (critical, standard, sheddable float64) {
	if !mr.Sliced {
		return orderShed(mr.Shed, mix)
	}
	return mr.ShedCritical, mr.Shed, max(mr.ShedSheddable, mr.Shed)
}
