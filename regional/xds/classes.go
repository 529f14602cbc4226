package xds

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// subFilter selects the endpoints of one Envoy-only cluster of a model:
// local ones only, and those fitting a context class (0: any). set names
// the residency set of a pinned class cluster ("" for the model's own
// clusters); the entry's localities are then the set's, so it does not
// change what is kept, only the cluster's name.
type subFilter struct {
	local bool
	class uint32
	set   string
}

func (f subFilter) keep(region string, l *Locality, e *Endpoint) bool {
	if f.local && l.Region != region {
		return false
	}
	return f.class == 0 || e.MaxModelLen == 0 || e.MaxModelLen >= f.class
}

// localitySpan sums up one locality's endpoints for the filters, so that
// a filter that keeps a locality whole, or none of it, is known without
// reading every endpoint again (nine filters with the default classes,
// each over every endpoint, were a sixth of a 10,000-cell cycle).
type localitySpan struct {
	n int
	// minLen and maxLen are the smallest and the largest max_model_len
	// of the endpoints, an undeclared one (0: fits any class) counting as
	// math.MaxUint32.
	minLen, maxLen uint32
	// classLB: an endpoint has a class weight (endpointParts.classLB).
	classLB bool
}

// spanOf sums up l's endpoints, whose parts are pos.
func spanOf(l *Locality, pos []*endpointParts) localitySpan {
	s := localitySpan{n: len(l.Endpoints), minLen: math.MaxUint32}
	for j := range l.Endpoints {
		n := l.Endpoints[j].MaxModelLen
		if n == 0 {
			n = math.MaxUint32
		}
		s.minLen, s.maxLen = min(s.minLen, n), max(s.maxLen, n)
		s.classLB = s.classLB || pos[j].classLB != nil
	}
	return s
}

// kept returns how many of l's endpoints f keeps (f.keep), from l's span
// s where that says all or none.
func (f subFilter) kept(region string, l *Locality, s localitySpan) int {
	switch {
	case s.n == 0 || f.local && l.Region != region || f.class > 0 && s.maxLen < f.class:
		return 0
	case f.class == 0 || s.minLen >= f.class:
		return s.n
	}
	kept := 0
	for j := range l.Endpoints {
		if f.keep(region, l, &l.Endpoints[j]) {
			kept++
		}
	}
	return kept
}

func (f subFilter) names(model string) (name, alt string) {
	n := strconv.FormatUint(uint64(f.class), 10)
	switch {
	case f.set != "":
		return xdscontract.PinnedClassClusterName(model, f.set, f.class), statName(model+"_pin_"+f.set) + "_ctx_" + n
	case f.local && f.class == 0:
		return xdscontract.LocalClusterName(model), statName(model) + "_local"
	case f.local:
		return xdscontract.LocalClassClusterName(model, f.class), statName(model) + "_local_ctx_" + n
	default:
		return xdscontract.ClassClusterName(model, f.class), statName(model) + "_ctx_" + n
	}
}

// buildSubClusters rebuilds e's Envoy-only clusters from m and e's freshly
// built main assignment. For a model's own entry (pin nil): the local
// cluster (always), then the class clusters and the local class clusters
// that have an endpoint or had one (subFilters). For a residency set's
// entry (pin, whose localities m holds): the set's class clusters
// (xdscontract.PinnedClassClusterName), by the same rules, each carrying
// the pinned cluster's residency metadata. Their assignments share the
// main assignment's LbEndpoints, and a locality kept whole at the same
// priority is shared too. Clusters are built with e.budget.
func (b *Builder) buildSubClusters(m *canonModel, e *modelEntry, pin *canonPin) error {
	if e.subClusters == nil {
		e.subClusters = make(map[string]*cluster.Cluster)
	}
	sizes := b.classSizes(m, e.sizes)
	e.spans = e.spans[:0]
	for i := range m.localities {
		e.spans = append(e.spans, spanOf(&m.localities[i], e.pos[i]))
	}
	filters, classes, localClasses := b.subFilters(m, e, sizes, pin)
	clusters := make([]*cluster.Cluster, 0, 1+len(filters))
	assignments := make([]*endpoint.ClusterLoadAssignment, 0, 1+len(filters))
	clusters = append(clusters, e.cluster)
	assignments = append(assignments, e.cla)
	used := make(map[string]struct{}, len(filters))
	for _, f := range filters {
		name, alt := f.names(m.name)
		c := e.subClusters[name]
		if c == nil {
			var err error
			if c, err = b.buildSubCluster(name, alt, e.budget, pin); err != nil {
				return err
			}
			e.subClusters[name] = c
		}
		used[name] = struct{}{}
		cla, err := b.buildSubAssignment(name, m, e, f)
		if err != nil {
			return err
		}
		clusters = append(clusters, c)
		assignments = append(assignments, cla)
	}
	for name := range e.subClusters {
		if _, ok := used[name]; !ok {
			delete(e.subClusters, name)
		}
	}
	// Keep the previous cluster slice when it holds the same clusters, so
	// that CDS does not move on a weight change.
	if !samePtrs(e.clusters, clusters) {
		e.clusters = clusters
	}
	e.assignments = assignments
	e.sizes, e.classes, e.localClasses = sizes, classes, localClasses
	return nil
}

// subFilters returns the filters of e's Envoy-only clusters in set order
// (see buildSubClusters), and the masks over sizes of the classes that
// have an endpoint now: classes for the class clusters (the set's, for a
// pinned entry), localClasses for the local class clusters (none for a
// pinned entry).
//
// A class cluster exists once the class has had an endpoint, and then
// stays, empty or not, for as long as the class does (classSizes): a data
// plane that gets the CDS update before the RDS update still finds every
// cluster a route it holds names (an empty one answers "no healthy
// upstream", as the main cluster would, never "cluster not found"). Only
// the classes in the masks get routes.
func (b *Builder) subFilters(m *canonModel, e *modelEntry, sizes []uint32, pin *canonPin) (filters []subFilter, classes, localClasses uint32) {
	set := ""
	if pin != nil {
		set = pin.set
	}
	filters = make([]subFilter, 0, 1+2*len(sizes))
	if pin == nil {
		filters = append(filters, subFilter{local: true})
	}
	add := func(f subFilter, i int, mask *uint32) {
		if b.anyEndpoint(m, e.spans, f) {
			*mask |= 1 << i
			filters = append(filters, f)
		} else if name, _ := f.names(m.name); e.subClusters[name] != nil {
			filters = append(filters, f)
		}
	}
	for i, n := range sizes {
		add(subFilter{class: n, set: set}, i, &classes)
	}
	if pin == nil {
		for i, n := range sizes {
			add(subFilter{local: true, class: n}, i, &localClasses)
		}
	}
	return filters, classes, localClasses
}

// buildSubCluster builds the Envoy-only cluster name: a model cluster, or
// with pin a pinned cluster of pin's set (buildPinnedCluster), with the
// same settings as the entry's main cluster.
func (b *Builder) buildSubCluster(name, alt string, budget float64, pin *canonPin) (*cluster.Cluster, error) {
	if pin != nil {
		return b.buildPinnedCluster(name, alt, budget, pin)
	}
	return b.buildNamedCluster(name, alt, budget)
}

// reclusters rebuilds every Envoy-only cluster e holds with build, after
// e.cluster was rebuilt, and the cluster list from them in the same order
// (the main cluster, then the others by name); the assignments stay, so
// only CDS moves.
func (e *modelEntry) reclusters(build func(name, alt string) (*cluster.Cluster, error)) error {
	for name, old := range e.subClusters {
		c, err := build(name, old.GetAltStatName())
		if err != nil {
			return err
		}
		e.subClusters[name] = c
	}
	if len(e.clusters) > 0 {
		cs := make([]*cluster.Cluster, len(e.clusters))
		cs[0] = e.cluster
		for i, old := range e.clusters[1:] {
			cs[i+1] = e.subClusters[old.GetName()]
		}
		e.clusters = cs
	}
	return nil
}

// maxDeclaredClasses bounds the context classes added for declared
// max_model_len values, so that a model's classes fit a 32-bit mask
// beside Config.ContextClasses (at most maxContextClasses). With classes
// disabled (an empty Config.ContextClasses) none is added.
const maxDeclaredClasses = 32 - maxContextClasses

// classSizes returns m's context classes: Config.ContextClasses and every
// max_model_len its endpoints declare, ascending and distinct. A declared
// limit is a class of its own so that a cell at max_model_len N serves
// every prompt up to N through the class cluster of N, rather than only
// the requests no class takes.
//
// A declared class stays once it has appeared (prev holds the model's
// previous classes), even when no endpoint declares its size any more: its
// cluster still holds every endpoint that fits, and a route never names a
// cluster that a data plane receiving CDS before RDS has already dropped
// (a capability that comes and goes would otherwise fail requests with
// "cluster not found" for a moment). At most maxDeclaredClasses are kept:
// the ones declared now first, smallest first, then the earlier ones,
// smallest first. prev is returned when the result equals it.
func (b *Builder) classSizes(m *canonModel, prev []uint32) []uint32 {
	if len(b.cfg.ContextClasses) == 0 {
		return nil // classes disabled
	}
	var declared []uint32
	for i := range m.localities {
		for _, ep := range m.localities[i].Endpoints {
			if n := ep.MaxModelLen; n > 0 && !slices.Contains(b.cfg.ContextClasses, n) && !slices.Contains(declared, n) {
				declared = append(declared, n)
			}
		}
	}
	slices.Sort(declared)
	declared = declared[:min(len(declared), maxDeclaredClasses)]
	for _, n := range prev { // ascending
		if len(declared) >= maxDeclaredClasses {
			break
		}
		if !slices.Contains(b.cfg.ContextClasses, n) && !slices.Contains(declared, n) {
			declared = append(declared, n)
		}
	}
	sizes := append(slices.Clone(b.cfg.ContextClasses), declared...)
	slices.Sort(sizes)
	if slices.Equal(sizes, prev) {
		return prev
	}
	return sizes
}

// anyEndpoint reports whether f keeps an endpoint of m, whose localities'
// spans are spans.
func (b *Builder) anyEndpoint(m *canonModel, spans []localitySpan, f subFilter) bool {
	for i := range m.localities {
		if f.kept(b.cfg.Region, &m.localities[i], spans[i]) > 0 {
			return true
		}
	}
	return false
}

// buildSubAssignment filters the main assignment of m (e.cla, whose
// localities are m.localities in order and whose endpoints are e.pos) by f.
// Localities left empty are dropped and the remaining priorities renumbered
// from 0 without gaps, keeping their order.
func (b *Builder) buildSubAssignment(name string, m *canonModel, e *modelEntry, f subFilter) (*endpoint.ClusterLoadAssignment, error) {
	wrap := func(err error) error {
		return fmt.Errorf("%w: ClusterLoadAssignment %q: %w", xdscontract.ErrInvalidResource, name, err)
	}
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	if err := cla.ValidateAll(); err != nil {
		return nil, wrap(err)
	}
	var (
		prio     uint32
		lastPrio uint32
		started  bool
	)
	for i := range m.localities {
		l := &m.localities[i]
		main := e.cla.GetEndpoints()[i]
		kept := f.kept(b.cfg.Region, l, e.spans[i])
		if kept == 0 {
			continue
		}
		// Localities are sorted by priority, so the kept ones are too.
		if !started {
			started, lastPrio = true, l.Priority
		} else if l.Priority != lastPrio {
			prio++
			lastPrio = l.Priority
		}
		classWeighted := false
		switch {
		case f.class > 0 && kept == len(l.Endpoints):
			classWeighted = e.spans[i].classLB
		case f.class > 0:
			for j := range l.Endpoints {
				classWeighted = classWeighted || e.pos[i][j].classLB != nil && f.keep(b.cfg.Region, l, &l.Endpoints[j])
			}
		}
		if kept == len(l.Endpoints) && prio == l.Priority && !classWeighted {
			cla.Endpoints = append(cla.Endpoints, main)
			continue
		}
		lbs := make([]*endpoint.LbEndpoint, 0, kept)
		for j := range l.Endpoints {
			if f.keep(b.cfg.Region, l, &l.Endpoints[j]) {
				lb := e.pos[i][j].lb
				if f.class > 0 && e.pos[i][j].classLB != nil {
					lb = e.pos[i][j].classLB
				}
				lbs = append(lbs, lb)
			}
		}
		ll := &endpoint.LocalityLbEndpoints{
			Locality:            main.GetLocality(),
			LoadBalancingWeight: wrapperspb.UInt32(l.Weight),
			Priority:            prio,
			Metadata:            main.GetMetadata(),
		}
		if err := ll.ValidateAll(); err != nil {
			return nil, wrap(err)
		}
		ll.LbEndpoints = lbs
		cla.Endpoints = append(cla.Endpoints, ll)
	}
	return cla, nil
}
