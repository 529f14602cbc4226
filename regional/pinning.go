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
			out = append(out, cycle.Set{Name: name, Regions: rs, Own: name == ms})
		}
		return out
	}
}

// residencyWatch counts the regions the residency config names that
// nobody has shown this controller: neither this region, nor
// Config.FleetRegions, nor a plan's ingress, nor a gossip peer
// (isobar_regional_residency_unseen_regions). Without FleetRegions a
// typo cannot be refused at start; this is where it shows. A region once
// seen stays seen.
//
// Owned by the syncer's summaries goroutine; not safe for concurrent use.
type residencyWatch struct {
	named []string // the regions the config names, sorted
	seen  map[string]bool
	m     *metrics
}

func newResidencyWatch(rc *residency.Config, region string, fleet []string, m *metrics) *residencyWatch {
	w := &residencyWatch{seen: map[string]bool{region: true}, m: m}
	for _, r := range fleet {
		w.seen[r] = true
	}
	for _, set := range rc.SetNames() {
		rs, _ := rc.Regions(set)
		w.named = append(w.named, rs...)
	}
	slices.Sort(w.named)
	w.named = slices.Compact(w.named)
	return w
}

// observe marks the regions of peers and of the route table t (its
// ingress addresses) as seen and sets the gauge.
func (w *residencyWatch) observe(peers []string, t *RouteTable) {
	for _, r := range peers {
		w.seen[r] = true
	}
	if t != nil {
		for r := range t.Ingress {
			w.seen[r] = true
		}
	}
	unseen := 0
	for _, r := range w.named {
		if !w.seen[r] {
			unseen++
		}
	}
	w.m.residencyUnseen.Set(float64(unseen))
}
