package xds

import (
	"fmt"
	"math"
	"slices"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// shedPPM holds the shed shares of one route group in parts per million,
// by criticality.
type shedPPM struct {
	standard, critical, sheddable uint32
	// status is the abort's HTTP status: 429 (0) for the plan's shed, 503
	// for a residency set's (its excess has no capacity left in its
	// regions and is never spilled: a client retrying later elsewhere would
	// not help, as a 429 suggests).
	status uint32
}

// toPPM rounds a share in [0, 1] to parts per million.
func toPPM(share float64) uint32 { return uint32(math.Round(share * 1e6)) }

// checkShares validates the shed shares of what (a model or one of its
// residency sets) and returns them in parts per million.
func checkShares(p *problems, what string, standard, critical, sheddable float64) shedPPM {
	for _, s := range []struct {
		field string
		v     float64
	}{{"shed", standard}, {"critical shed", critical}, {"sheddable shed", sheddable}} {
		// !(x >= 0) also catches NaN.
		if !(s.v >= 0) || s.v > 1 {
			p.addf("%s: %s %v is out of range; use a share in [0, 1]", what, s.field, s.v)
		}
	}
	return shedPPM{standard: toPPM(standard), critical: toPPM(critical), sheddable: toPPM(sheddable)}
}

// checkBudget validates m's retry budget and returns it as published:
// rounded to a whole percent, at least 1 (0 stays 0, the Config's budget).
// Rounding keeps utilisation noise from rebuilding the model's Clusters: a
// changed Cluster makes Envoy warm a new one and drain the old one's
// connection pools (cluster_manager_impl.cc addOrUpdateCluster).
func checkBudget(p *problems, m *Model) float64 {
	v := m.RetryBudgetPercent
	if !(v >= 0) || v > 100 {
		p.addf("model %q: retry budget %v%% is out of range; use a percentage in [0, 100] (0: the static budget)", m.Name, v)
		return 0
	}
	if v == 0 {
		return 0
	}
	return max(1, math.Round(v))
}

// canonPin is a validated residency set of a model.
type canonPin struct {
	set     string
	regions []string // sorted, distinct
	shed    shedPPM
	// loc holds the set's localities in canonical form (loc.name is the
	// model's); loc.reused marks them taken from the memo.
	loc canonModel
}

// canonPins validates m's residency sets and returns them sorted by name.
// A set whose localities equal (in input order) those of the memoised set
// of the same name in e is taken from the memo.
func canonPins(cfg *Config, m *Model, e *modelEntry, p *problems, sc *scratch) []canonPin {
	if len(m.Pinned) == 0 {
		return nil
	}
	if len(m.Pinned) > residency.MaxSets {
		p.addf("model %q: %d residency sets, at most %d", m.Name, len(m.Pinned), residency.MaxSets)
		return nil
	}
	out := make([]canonPin, 0, len(m.Pinned))
	seen := make(map[string]struct{}, len(m.Pinned))
	for i := range m.Pinned {
		pin := &m.Pinned[i]
		if err := xdscontract.CheckName("residency set", pin.Set); err != nil {
			p.addf("model %q: pinned #%d: %v", m.Name, i, err)
			continue
		}
		if _, dup := seen[pin.Set]; dup {
			p.addf("model %q: residency set %q listed twice", m.Name, pin.Set)
			continue
		}
		seen[pin.Set] = struct{}{}
		what := fmt.Sprintf("model %q residency set %q", m.Name, pin.Set)
		cp := canonPin{set: pin.Set, shed: checkShares(p, what, pin.Shed, pin.ShedCritical, pin.ShedSheddable)}
		cp.regions = slices.Compact(slices.Sorted(slices.Values(pin.Regions)))
		for _, r := range cp.regions {
			if err := xdscontract.CheckName("allowed region", r); err != nil {
				p.addf("%s: %v", what, err)
			}
		}
		if len(cp.regions) > residency.MaxRegions {
			p.addf("%s: %d allowed regions, at most %d", what, len(cp.regions), residency.MaxRegions)
		}
		if pe := e.pin(pin.Set); pe != nil && pe.cla != nil && localitiesEqual(pe.canon.raw, pin.Localities) {
			cp.loc = pe.canon
			cp.loc.reused = true
		} else {
			loc, ok := canonicalizeModel(cfg, &Model{Name: what, Localities: pin.Localities}, p, e.pin(pin.Set).spareCanon())
			if !ok {
				continue
			}
			loc.name = m.Name
			cp.loc = loc
		}
		for _, l := range cp.loc.localities {
			if _, ok := slices.BinarySearch(cp.regions, l.Region); !ok {
				p.addf("%s: locality %s/%s is in region %q, which the set does not allow (%s)",
					what, l.Region, l.Zone, l.Region, strings.Join(cp.regions, ","))
			}
		}
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b canonPin) int { return strings.Compare(a.set, b.set) })
	return out
}

// pin returns e's memoised entry of residency set set, or nil (e may be
// nil).
func (e *modelEntry) pin(set string) *modelEntry {
	if e == nil {
		return nil
	}
	return e.pins[set]
}

// pinEntries brings e's residency-set entries up to m (pinEntry). Entries
// of sets m no longer lists are dropped.
func (b *Builder) pinEntries(m *canonModel, e *modelEntry) error {
	if len(m.pinned) == 0 {
		e.pins = nil
		return nil
	}
	if e.pins == nil {
		e.pins = make(map[string]*modelEntry, len(m.pinned))
	}
	for i := range m.pinned {
		cp := &m.pinned[i]
		pe := e.pins[cp.set]
		if pe == nil {
			pe = &modelEntry{}
			e.pins[cp.set] = pe
		}
		if err := b.pinEntry(m, cp, pe); err != nil {
			return err
		}
	}
	if len(e.pins) > len(m.pinned) {
		for set := range e.pins {
			if _, ok := slices.BinarySearchFunc(m.pinned, set, func(p canonPin, s string) int { return strings.Compare(p.set, s) }); !ok {
				delete(e.pins, set)
			}
		}
	}
	return nil
}

// pinEntry brings the entry pe of residency set cp of m up to date: its
// pinned Cluster and pinned class Clusters (rebuilt when the allowed
// regions or the model's budget change), its ClusterLoadAssignment and the
// class clusters' (rebuilt when the set's localities change, by
// buildSubClusters: the same filter, lifecycle and memo as the model's
// own class clusters). On error pe.cla is cleared, so that the next build
// starts afresh.
func (b *Builder) pinEntry(m *canonModel, cp *canonPin, pe *modelEntry) error {
	name := xdscontract.PinnedClusterName(m.name, cp.set)
	if pe.cluster == nil || pe.budget != m.budget || !slices.Equal(pe.regions, cp.regions) {
		c, err := b.buildPinnedCluster(name, statName(m.name+"_pin_"+cp.set), m.budget, cp)
		if err != nil {
			pe.cla = nil
			return err
		}
		pe.cluster = c
		if err := pe.reclusters(func(name, alt string) (*cluster.Cluster, error) {
			return b.buildPinnedCluster(name, alt, m.budget, cp)
		}); err != nil {
			pe.cla = nil
			return err
		}
		// Only now: a failed rebuild is tried again by the next build.
		pe.budget, pe.regions = m.budget, cp.regions
	}
	if cp.loc.reused {
		return nil
	}
	if pe.cla == nil || !pe.canon.equal(&cp.loc) {
		cla, err := b.buildLoadAssignment(name, &cp.loc, pe)
		if err != nil {
			pe.cla = nil
			return err
		}
		pe.cla = cla
		if err := b.buildSubClusters(&cp.loc, pe, cp); err != nil {
			pe.cla = nil
			return err
		}
	}
	pe.keepCanon(cp.loc)
	return nil
}

// buildPinnedCluster builds the cluster of one residency set of a model:
// a model cluster carrying the set in its metadata,
// filter_metadata["isobar"] {"residency": set, "allowed_regions":
// [regions]}.
func (b *Builder) buildPinnedCluster(name, alt string, budget float64, cp *canonPin) (*cluster.Cluster, error) {
	c, err := b.buildNamedCluster(name, alt, budget)
	if err != nil {
		return nil, err
	}
	regions := make([]*structpb.Value, len(cp.regions))
	for i, r := range cp.regions {
		regions[i] = structpb.NewStringValue(r)
	}
	c.Metadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: {Fields: map[string]*structpb.Value{
		xdscontract.MetadataResidency:      structpb.NewStringValue(cp.set),
		xdscontract.MetadataAllowedRegions: structpb.NewListValue(&structpb.ListValue{Values: regions}),
	}}}}
	return c, xdscontract.ValidateDeep(c)
}

// appendPinned appends the pinned clusters and assignments of e, in set
// order (per set: the pinned cluster, then its class clusters), to s.
func appendPinned(s *Set, m *canonModel, e *modelEntry) {
	for i := range m.pinned {
		pe := e.pins[m.pinned[i].set]
		s.Clusters = append(s.Clusters, pe.clusters...)
		s.Endpoints = append(s.Endpoints, pe.assignments...)
	}
}
