package xds

import (
	"math"
	"net/netip"
	"slices"

	"github.com/isobar-mesh/isobar/internal/keepwrite"
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
	if !sameLocalities(m, prev) {
		return canonModel{}, false
	}
	n := len(m.Localities)
	f := fromWalk{mc: modelCanon{cfg: cfg, m: m}, prev: prev, sc: sc,
		cm: canonModel{name: m.Name, localities: make([]Locality, n), order: slices.Clone(prev.order), inOrder: make([]bool, n),
			parsed: make([][]netip.Addr, n)}}
	f.mc.p = &f.p
	var spareRaw []Locality
	if spare != nil {
		f.spareCanon, f.spareParsed, spareRaw = spare.localities, spare.parsed, spare.raw
	}
	for li := range m.Localities {
		if !f.locality(li) {
			return canonModel{}, false
		}
	}
	if f.total > math.MaxUint32 || !f.dups() {
		return canonModel{}, false
	}
	f.cm.raw = copyLocalities(m.Localities, spareRaw)
	return f.cm, true
}

// sameLocalities reports whether prev can start m's canonicalisation: it
// has duplicate sets, and its input had m's localities, but for their
// endpoints, each of them in canonical order.
func sameLocalities(m *Model, prev *canonModel) bool {
	n := len(m.Localities)
	if prev.cells == nil || len(prev.raw) != n || len(prev.order) != n || len(prev.parsed) != n || len(prev.inOrder) != n {
		return false
	}
	for li := range m.Localities {
		in, old := &m.Localities[li], &prev.raw[li]
		if !prev.inOrder[li] || in.Region != old.Region || in.Zone != old.Zone || in.Weight != old.Weight ||
			in.Priority != old.Priority || in.RTT != old.RTT || in.Jitter != old.Jitter ||
			len(prev.localities[prev.order[li]].Endpoints) != len(old.Endpoints) || len(prev.parsed[li]) != len(old.Endpoints) {
			return false
		}
	}
	return true
}

// fromWalk is one canonicalizeFrom call's work in progress.
type fromWalk struct {
	mc   modelCanon // checks the endpoints not in prev's input (problems to p)
	p    problems
	prev *canonModel
	sc   *scratch
	cm   canonModel // the result
	// The spare's buffers, written into.
	spareCanon  []Locality
	spareParsed [][]netip.Addr
	// added and removed are the endpoints of m not in prev's input and
	// those of prev's input not in m.
	added, removed []at
	total          uint64 // the endpoints' weights
}

// at names an endpoint: input locality li, position j.
type at struct{ li, j int }

// locality walks input locality li beside prev's and writes its canonical
// form into f.cm; false: the full path must take the model.
func (f *fromWalk) locality(li int) bool {
	in := f.mc.m.Localities[li].Endpoints
	oldRaw := f.prev.raw[li].Endpoints
	l := f.prev.localities[f.prev.order[li]]
	oldCanon, oldParsed := l.Endpoints, f.prev.parsed[li]
	sc := f.sc
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
		return false // the full path is cheaper
	}
	var buf []netip.Addr
	if li < len(f.spareParsed) {
		buf = f.spareParsed[li]
	}
	where := locality{f.mc.m.Name, l.Region, l.Zone, l.Priority}
	l.Endpoints = slices.Grow(spareEndpoints(f.spareCanon, li), len(in))[:len(in)]
	parsed := slices.Grow(buf[:0], len(in))[:len(in)]
	for j := range in {
		if x := sc.matched[j]; x >= 0 {
			// The spare's buffers mostly hold these already (keepwrite).
			keepwrite.Set(&l.Endpoints[j], oldCanon[x])
			keepwrite.Set(&parsed[j], oldParsed[x])
			continue
		}
		var named bool
		l.Endpoints[j], parsed[j], named = f.mc.endpoint(where, in[j])
		if !named || len(f.p.list)+f.p.more > 0 {
			return false
		}
		f.added = append(f.added, at{li, j})
	}
	for x, seen := range sc.seen {
		if !seen {
			f.removed = append(f.removed, at{li, x})
		}
	}
	// Strictly in order: then no address appears twice in the locality
	// either (the full path finds those as neighbours).
	for j := 1; j < len(in); j++ {
		if c := parsed[j-1].Compare(parsed[j]); c > 0 || c == 0 && l.Endpoints[j-1].Port >= l.Endpoints[j].Port {
			return false
		}
	}
	for j := range l.Endpoints {
		f.total += uint64(l.Endpoints[j].Weight)
	}
	f.cm.localities[f.cm.order[li]], f.cm.parsed[li], f.cm.inOrder[li] = l, parsed, true
	return true
}

// dups makes the result's duplicate sets from prev's, less what left,
// plus what came, and reports whether what came is no duplicate. prev
// keeps none either way.
func (f *fromWalk) dups() bool {
	prev, cm := f.prev, &f.cm
	cm.cells, cm.addrs = prev.cells, prev.addrs
	prev.cells, prev.addrs = nil, nil
	multi := len(cm.order) > 1
	for _, r := range f.removed {
		e := &prev.localities[prev.order[r.li]].Endpoints[r.j]
		delete(cm.cells, e.CellID)
		if a := prev.parsed[r.li][r.j]; multi && a.IsValid() {
			if k := (addrKey{a, e.Port}); cm.addrs[k] == e.CellID {
				delete(cm.addrs, k)
			}
		}
	}
	for _, a := range f.added {
		e := &cm.localities[cm.order[a.li]].Endpoints[a.j]
		if _, dup := cm.cells[e.CellID]; dup {
			return false
		}
		cm.cells[e.CellID] = struct{}{}
		if addr := cm.parsed[a.li][a.j]; multi && addr.IsValid() {
			k := addrKey{addr, e.Port}
			if _, dup := cm.addrs[k]; dup {
				return false
			}
			cm.addrs[k] = e.CellID
		}
	}
	return true
}
