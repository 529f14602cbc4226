package regional

import (
	"fmt"
	"slices"

	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/summary"
)

// validateResidency checks Config.Residency at start. With FleetRegions
// set, a set naming a region that is neither this one nor listed there
// refuses the start (ErrInvalidConfig wrapping residency.ErrInvalid,
// naming the set and the region): a typo would otherwise pin requests to
// a region that does not exist. Without FleetRegions the controller
// knows no other region at start (gossip seeds and etcd endpoints are
// addresses, not region names); the names were checked by
// residency.Parse, and regions no plan or gossip has shown are reported
// at run time (residencyWatch).
func (c Config) validateResidency() error {
	for _, r := range c.FleetRegions {
		if !summary.ValidName(r) {
			return fmt.Errorf("%w: fleet region %q: want 1-128 characters of [A-Za-z0-9._-]", ErrInvalidConfig, r)
		}
	}
	if c.Residency == nil || len(c.FleetRegions) == 0 {
		return nil
	}
	known := append(slices.Clone(c.FleetRegions), c.Region)
	slices.Sort(known)
	if err := c.Residency.Validate(slices.Compact(known)); err != nil {
		return fmt.Errorf("%w: --residency: %w", ErrInvalidConfig, err)
	}
	return nil
}

// residencySets returns the function cycle.Params.Sets: the residency sets
// a model's requests may be pinned to under rc. A model pinned to set m
// takes m, and "t+m" for every other set t (a pinned tenant's request
// for it: the regions both allow, residency.Config.Regions); any other
// model takes every set (its pinned tenants'). At most residency.MaxSets
// per model. nil when rc defines no set.
func residencySets(rc *residency.Config) func(model string) []cycle.Set {
	names := rc.SetNames()
	if len(names) == 0 {
		return nil
	}
	plain := make([]cycle.Set, 0, len(names))
	for _, n := range names {
		rs, _ := rc.Regions(n)
		plain = append(plain, cycle.Set{Name: n, Regions: rs})
	}
	return func(model string) []cycle.Set {
		ms := rc.Lookup("", model)
		if ms == "" {
			return plain
		}
		out := make([]cycle.Set, 0, len(names))
		for _, s := range plain {
			name := s.Name + "+" + ms
			if s.Name == ms {
				name = ms
			}
			rs, _ := rc.Regions(name)
			out = append(out, cycle.Set{Name: name, Regions: rs})
		}
		return out
	}
}
