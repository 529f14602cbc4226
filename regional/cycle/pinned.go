package cycle

import (
	"cmp"
	"net"
	"slices"
	"strings"

	"github.com/isobar-mesh/isobar/regional/xds"
)

// Set is one residency set a model's requests may be pinned to: its name
// (package residency; "a+b" for a tenant's set combined with a model's)
// and the regions it allows, sorted. No region: the set is served nowhere.
// Own marks the model's own set (residency's "models"): every request of
// the model is pinned to it at least, so the model's main cluster gets
// the set's localities too, and a request that reaches it without a
// residency header cannot leave the set either.
type Set struct {
	Name    string
	Regions []string
	Own     bool
}

// SetRoutes is a plan's routing of one residency set's requests at this
// ingress: region → fraction (only regions the set allows; the region
// refused any other plan) and the shares shed per criticality.
type SetRoutes struct {
	Routes                            map[string]float64
	Shed, ShedCritical, ShedSheddable float64
}

// RegionsKey is the key of a sorted region list in ModelRoutes.Pinned:
// the regions joined with ",".
func RegionsKey(regions []string) string { return strings.Join(regions, ",") }

// pinned is model name's xds.Pinned, one per set p.Sets lists. Every
// locality of a set is in a region the set allows, whatever the routes
// say: the routes are filtered again here even though plans breaking
// residency are refused on receipt.
//
//   - With a plan slice for the set (Routes.Models[name].Pinned): the
//     local locality when the local region is allowed, weighted by the
//     slice's local share (weight 1 at priority 1 when the slice sends
//     everything away, as for the model), and the allowed remote regions
//     the slice routes to, with the slice's shed shares.
//   - Without one (no plan in force, the gossip fallback, or a plan that
//     carries no slice for the set), or when the slice's regions leave
//     the set no locality: see nearestAllowed.
func (b *stateBuilder) pinned(name string) []xds.Pinned {
	if b.p.Sets == nil {
		return nil
	}
	sets := b.p.Sets(name)
	if len(sets) == 0 {
		return nil
	}
	var mr ModelRoutes
	var ingress map[string]string
	if t := b.p.Routes; t != nil {
		mr, ingress = t.Models[name], t.Ingress
	}
	out := make([]xds.Pinned, 0, len(sets))
	for _, s := range sets {
		allow := func(r string) bool { return slices.Contains(s.Regions, r) }
		pin := xds.Pinned{Set: s.Name, Regions: slices.Clone(s.Regions)}
		shedAll := false // the plan routes the set nowhere: it sheds it whole
		if sr, ok := mr.Pinned[RegionsKey(s.Regions)]; ok {
			shedAll = !slices.ContainsFunc(mapsValues(sr.Routes), func(f float64) bool { return f > 0 })
			pin.Shed, pin.ShedCritical, pin.ShedSheddable = sr.Shed, sr.ShedCritical, sr.ShedSheddable
			pin.Localities = b.remoteLocalities(name, sr.Routes, allow, ingress)
			if l := b.localCopy(name, allow); l != nil {
				if w := localityWeight(sr.Routes[b.p.Region]); w > 0 || len(pin.Localities) == 0 {
					l.Weight = max(w, 1)
				} else {
					l.Weight, l.Priority = 1, 1
				}
				pin.Localities = append([]xds.Locality{*l}, pin.Localities...)
			}
		}
		if len(pin.Localities) == 0 && !shedAll {
			// No slice, or one whose regions serve nothing now (the local
			// cells it counted on are gone). A slice the plan sheds whole
			// (its regions are down or full) stays without localities: its
			// requests are refused 503 naming the set, not sent to an
			// ingress the leader knows is gone.
			pin.Localities = b.nearestAllowed(name, allow, ingress)
		}
		if s.Own {
			b.own[name] = pin.Localities
		}
		out = append(out, pin)
	}
	return out
}

// localCopy is a copy of model name's local locality at priority 0 and
// full weight, or nil when there is none or allow refuses the local
// region.
func (b *stateBuilder) localCopy(name string, allow func(string) bool) *xds.Locality {
	l := b.local[name]
	if l == nil || !allow(b.p.Region) {
		return nil
	}
	c := *l
	c.Endpoints = slices.Clone(l.Endpoints)
	c.Weight, c.Priority = LocalityScale, 0
	return &c
}

// nearestAllowed is a pinned set's localities when no plan routes it: the
// local cells when the local region is allowed and has any; otherwise
// the ingress of the allowed region nearest by round trip (p.RTTs; an
// unknown round trip ranks after every known one, then by name) among
// those with an ingress address in the routes in force (the plan's or
// the gossiped ones) or in Params.Ingress (gossip, when no routes name
// it); otherwise none, and the data plane answers the
// set's requests 503 naming it. Never a region the set does not allow.
func (b *stateBuilder) nearestAllowed(name string, allow func(string) bool, ingress map[string]string) []xds.Locality {
	if l := b.localCopy(name, allow); l != nil {
		return []xds.Locality{*l}
	}
	known := ingress
	if len(b.p.Ingress) > 0 {
		known = make(map[string]string, len(ingress)+len(b.p.Ingress))
		for r, a := range b.p.Ingress {
			known[r] = a
		}
		for r, a := range ingress { // the routes' addresses win
			known[r] = a
		}
	}
	var best string
	for r, addr := range known {
		if r == b.p.Region || addr == "" || !allow(r) {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			continue
		}
		if best == "" || b.nearer(r, best) {
			best = r
		}
	}
	if best == "" {
		return nil
	}
	host, port, _ := net.SplitHostPort(known[best])
	return []xds.Locality{b.ingressLocality(best, host, port, LocalityScale)}
}

// nearer reports whether region a ranks before b: a known round trip
// before an unknown one, the shorter first, then by name.
func (b *stateBuilder) nearer(a, c string) bool {
	ra, rc := b.p.RTTs[a], b.p.RTTs[c]
	switch {
	case ra > 0 && rc <= 0:
		return true
	case ra <= 0 && rc > 0:
		return false
	}
	if n := cmp.Compare(ra, rc); n != 0 {
		return n < 0
	}
	return a < c
}

// mapsValues lists m's values.
func mapsValues(m map[string]float64) []float64 {
	out := make([]float64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
