package regional

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/summary"
)

// ErrResidencyPlan (with ErrInvalidPlan) refuses a plan that routes a
// pinned slice to a region outside its allowed regions: result
// "residency" of isobar_regional_plans_total. Test with errors.Is.
var ErrResidencyPlan = errors.New("regional: plan breaks residency")

// maxPlanSlices bounds a model plan's slices: three criticalities for the
// unpinned demand and for each residency set.
const maxPlanSlices = int(reqclass.Count) * (residency.MaxSets + 1)

// addSlices validates a model plan's slices (ModelPlan.slices) for region
// and adds them to mr: each slice's criticality known, its allowed
// regions valid, sorted and listed once, its routes as a model's
// (planRoutes), each (criticality, allowed regions) once. A slice with
// allowed regions that routes a share to any other region breaks
// residency (ErrResidencyPlan): a region never takes a plan that would
// send pinned requests where they may not go, whatever its own config
// says.
//
// An unpinned slice gives the shed share of its criticality (the standard
// one stays ModelPlan.shed). A pinned slice goes to mr.Pinned under its
// allowed regions: each criticality's shed, and the routes of its
// standard slice (else the critical, else the sheddable one), which the
// set's pinned cluster follows.
func addSlices(t *RouteTable, mr *ModelRoutes, model string, sl []*isobarpb.SlicePlan, region string) error {
	if len(sl) > maxPlanSlices {
		return badPlan("model %s: %d slices, at most %d", model, len(sl), maxPlanSlices)
	}
	mr.Sliced = len(sl) > 0
	seen := map[string]bool{}
	rank := map[string]int{} // the criticality rank whose routes mr.Pinned holds
	for i, s := range sl {
		what := fmt.Sprintf("model %s slice %d", model, i)
		c, err := sliceCriticality(s.GetCriticality())
		if err != nil {
			return badPlan("%s: %v", what, err)
		}
		allowed := s.GetAllowedRegions()
		if err := checkAllowed(allowed); err != nil {
			return badPlan("%s: %v", what, err)
		}
		key := strings.Join(allowed, ",")
		id := c.String() + "/" + key
		if seen[id] {
			return badPlan("%s: criticality %s for regions [%s] planned twice", what, c, key)
		}
		seen[id] = true
		routes, err := planRoutes(t, what, s.GetRoutes(), s.GetShed(), region)
		if err != nil {
			return err
		}
		if len(allowed) == 0 {
			setUnpinnedShed(mr, c, s.GetShed())
			continue
		}
		for d, f := range routes {
			if f > 0 && !slices.Contains(allowed, d) {
				return fmt.Errorf("%w: %w: %s: routes %v of requests pinned to [%s] to %s", ErrInvalidPlan, ErrResidencyPlan,
					what, f, key, d)
			}
		}
		addPinned(mr, key, c, routes, s.GetShed(), rank)
	}
	return nil
}

// sliceCriticality maps a slice's criticality; unspecified is standard,
// an unknown value an error.
func sliceCriticality(p isobarpb.Criticality) (reqclass.Criticality, error) {
	if _, ok := isobarpb.Criticality_name[int32(p)]; !ok {
		return reqclass.Standard, fmt.Errorf("criticality %d", p)
	}
	return reqclass.FromProto(p), nil
}

// checkAllowed requires a slice's allowed regions to be valid region
// names, strictly sorted, at most summary.MaxRegions.
func checkAllowed(allowed []string) error {
	if len(allowed) > summary.MaxRegions {
		return fmt.Errorf("%d allowed regions, at most %d", len(allowed), summary.MaxRegions)
	}
	for i, r := range allowed {
		if !summary.ValidName(r) {
			return fmt.Errorf("allowed region %q", trunc(r))
		}
		if i > 0 && allowed[i-1] >= r {
			return fmt.Errorf("allowed regions not sorted or listed twice at %q", r)
		}
	}
	return nil
}

func setUnpinnedShed(mr *ModelRoutes, c reqclass.Criticality, shed float64) {
	switch c {
	case reqclass.Critical:
		mr.ShedCritical = shed
	case reqclass.Sheddable:
		mr.ShedSheddable = shed
	}
}

// pinnedRank orders which slice's routes a pinned cluster follows:
// standard, then critical, then sheddable.
func pinnedRank(c reqclass.Criticality) int {
	switch c {
	case reqclass.Standard:
		return 0
	case reqclass.Critical:
		return 1
	}
	return 2
}

// addPinned records one pinned slice's shed and, when its criticality
// ranks first among the set's slices seen so far, its routes.
func addPinned(mr *ModelRoutes, key string, c reqclass.Criticality, routes map[string]float64, shed float64, rank map[string]int) {
	if mr.Pinned == nil {
		mr.Pinned = map[string]PinnedRoutes{}
	}
	pr := mr.Pinned[key]
	switch c {
	case reqclass.Critical:
		pr.ShedCritical = shed
	case reqclass.Sheddable:
		pr.ShedSheddable = shed
	default:
		pr.Shed = shed
	}
	if r, ok := rank[key]; !ok || pinnedRank(c) < r {
		rank[key] = pinnedRank(c)
		pr.Routes = routes
	}
	mr.Pinned[key] = pr
}
