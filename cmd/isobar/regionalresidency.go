package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/residency"
)

// applyResidency loads --residency into cfg.Residency and checks its
// regions against --fleet-regions and --region. A regional controller
// learns the other regions only from plans and gossip, after it starts;
// so a config naming another region needs --fleet-regions, and one naming
// a region outside them refuses to start: a typo must not pin requests
// to a region that does not exist.
func (o *regionalOpts) applyResidency(cfg *regional.Config) error {
	if o.residencyFile == "" {
		return nil
	}
	rc, err := residency.Load(o.residencyFile)
	if err != nil {
		return usageError{fmt.Errorf("--residency: %w", err)}
	}
	var others []string
	for _, set := range rc.SetNames() {
		rs, _ := rc.Regions(set)
		for _, r := range rs {
			if r != cfg.Region && !slices.Contains(others, r) {
				others = append(others, r)
			}
		}
	}
	if len(others) > 0 && len(cfg.FleetRegions) == 0 {
		slices.Sort(others)
		return usageError{fmt.Errorf("--residency %s names regions %s besides %s: list the fleet's regions with --fleet-regions, so that a region the fleet does not have refuses to start",
			o.residencyFile, strings.Join(others, ", "), cfg.Region)}
	}
	known := append(slices.Clone(cfg.FleetRegions), cfg.Region)
	if err := rc.Validate(known); err != nil {
		return usageError{fmt.Errorf("--residency %s: %w", o.residencyFile, err)}
	}
	cfg.Residency = rc
	return nil
}
