package xds

import (
	"math"
	"net/netip"
	"slices"
)

// canonicalizeFrom is canonicalizeModel of m for a model whose last
// canonicalisation, prev (the Builder's memo), had the same localities
// and differs from m in some endpoints: the registry's cycle changes a few
// of 10,000, and checking, hashing and parsing every one again was most
// of the build. Each locality of m is walked beside prev's input
// (shiftWalk: endpoints added or removed here and there); an endpoint
// equal to one of prev's input was checked then and keeps its canonical
// form and parsed address, and only the others are checked, and added to
// the duplicate sets prev's were removed from.
//
// It reports false when it cannot tell: prev has no duplicate sets, the
// localities differ in number or in anything but their endpoints, a
// locality's endpoints are not in canonical order (in prev's input or in
// m: sorting is the full path's), or anything about an endpoint it checks
// or its duplicates is wrong; or when more than a quarter of a locality's
// endpoints changed (the full path then costs less). The caller then takes the full path, which
// reports the problems. It writes into spare's buffers (nil: none), never
// prev's; when it gets as far as the duplicate sets it takes them from
// prev (which keeps none), so that a later call from prev starts afresh.
func canonicalizeFrom(cfg *Config, m *Model, prev, spare *canonModel, sc *scratch) (canonModel, bool) {
	n := len(m.Localities)
	if prev.cells == nil || len(prev.raw) != n || len(prev.order) != n || len(prev.parsed) != n {
		return canonModel{}, false
	}
	for li := range m.Localities {
		in, old := &m.Localities[li], &prev.raw[li]
		if !prev.inOrder[li] || in.Region != old.Region || in.Zone != old.Zone || in.Weight != old.Weight ||
			in.Priority != old.Priority || in.RTT != old.RTT || in.Jitter != old.Jitter {
			return canonModel{}, false
		}
	}
	var spareCanon, spareRaw []Locality
	var spareParsed [][]netip.Addr
	if spare != nil {
		spareCanon, spareRaw, spareParsed = spare.localities, spare.raw, spare.parsed
	}
	cm := canonModel{name: m.Name, localities: make([]Locality, n), order: slices.Clone(prev.order), inOrder: make([]bool, n),
		parsed: make([][]netip.Addr, n)}
	var p problems
	mc := modelCanon{cfg: cfg, m: m, p: &p}
	// at names an endpoint: locality li (input order), position j.
	type at struct{ li, j int }
	var added, removed []at
	var total uint64 // the endpoints' weights (mc.total counts the checked ones only)
	for li := range m.Localities {
		in := m.Localities[li].Endpoints
		oldRaw := prev.raw[li].Endpoints
		oldCanon := prev.localities[prev.order[li]].Endpoints
		oldParsed := prev.parsed[li]
		if len(oldCanon) != len(oldRaw) || len(oldParsed) != len(oldRaw) {
			return canonModel{}, false
		}
		l := prev.localities[prev.order[li]]
		where := locality{m.Name, l.Region, l.Zone, l.Priority}
		var buf []netip.Addr
		if li < len(spareParsed) {
			buf = spareParsed[li]
		}
		l.Endpoints = slices.Grow(spareEndpoints(spareCanon, li), len(in))[:len(in)]
		parsed := slices.Grow(buf[:0], len(in))[:len(in)]
		sc.seen = slices.Grow(sc.seen[:0], len(oldRaw))[:len(oldRaw)]
		clear(sc.seen)
		sc.matched = slices.Grow(sc.matched[:0], len(in))[:len(in)]
		var walk shiftWalk
		unmatched := 0
		for j := range in {
			x := walk.find(j, len(oldRaw), func(x int) bool { return oldRaw[x] == in[j] })
			if sc.matched[j] = x; x >= 0 {
				sc.seen[x] = true
			} else {
				unmatched++
			}
		}
		if unmatched > 16 && unmatched > len(in)/4 {
			return canonModel{}, false // the full path is cheaper
		}
		for j := range in {
			if x := sc.matched[j]; x >= 0 {
				l.Endpoints[j], parsed[j] = oldCanon[x], oldParsed[x]
				continue
			}
			var named bool
			l.Endpoints[j], parsed[j], named = mc.endpoint(where, in[j])
			if !named || len(p.list)+p.more > 0 {
				return canonModel{}, false
			}
			added = append(added, at{li, j})
		}
		for x, seen := range sc.seen {
			if !seen {
				removed = append(removed, at{li, x})
			}
		}
		// Strictly in order: then no address appears twice in the
		// locality either (the full path finds those as neighbours).
		for j := 1; j < len(in); j++ {
			if c := parsed[j-1].Compare(parsed[j]); c > 0 || c == 0 && l.Endpoints[j-1].Port >= l.Endpoints[j].Port {
				return canonModel{}, false
			}
		}
		for j := range l.Endpoints {
			total += uint64(l.Endpoints[j].Weight)
		}
		cm.localities[cm.order[li]], cm.parsed[li], cm.inOrder[li] = l, parsed, true
	}
	if total > math.MaxUint32 {
		return canonModel{}, false
	}
	// The duplicate sets: prev's, less what left, plus what came.
	cm.cells, cm.addrs = prev.cells, prev.addrs
	prev.cells, prev.addrs = nil, nil
	multi := n > 1
	for _, r := range removed {
		e := &prev.localities[prev.order[r.li]].Endpoints[r.j]
		delete(cm.cells, e.CellID)
		if a := prev.parsed[r.li][r.j]; multi && a.IsValid() {
			if k := (addrKey{a, e.Port}); cm.addrs[k] == e.CellID {
				delete(cm.addrs, k)
			}
		}
	}
	for _, a := range added {
		e := &cm.localities[cm.order[a.li]].Endpoints[a.j]
		if _, dup := cm.cells[e.CellID]; dup {
			return canonModel{}, false
		}
		cm.cells[e.CellID] = struct{}{}
		if addr := cm.parsed[a.li][a.j]; multi && addr.IsValid() {
			k := addrKey{addr, e.Port}
			if _, dup := cm.addrs[k]; dup {
				return canonModel{}, false
			}
			cm.addrs[k] = e.CellID
		}
	}
	cm.raw = copyLocalities(m.Localities, spareRaw)
	return cm, true
}
