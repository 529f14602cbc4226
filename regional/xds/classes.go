package xds

import (
	"fmt"
	"strconv"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// subFilter selects the endpoints of one Envoy-only cluster of a model:
// local ones only, and those fitting a context class (0: any).
type subFilter struct {
	local bool
	class uint32
}

func (f subFilter) keep(region string, l *Locality, e *Endpoint) bool {
	if f.local && l.Region != region {
		return false
	}
	return f.class == 0 || e.MaxModelLen == 0 || e.MaxModelLen >= f.class
}

func (f subFilter) names(model string) (name, alt string) {
	switch {
	case f.local && f.class == 0:
		return LocalClusterName(model), statName(model) + "_local"
	case f.local:
		n := strconv.FormatUint(uint64(f.class), 10)
		return LocalClassClusterName(model, f.class), statName(model) + "_local_ctx_" + n
	default:
		n := strconv.FormatUint(uint64(f.class), 10)
		return ClassClusterName(model, f.class), statName(model) + "_ctx_" + n
	}
}

// buildSubClusters rebuilds e's Envoy-only clusters from m and e's freshly
// built main assignment: the local cluster (always), then the class
// clusters and the local class clusters that have an endpoint. Their
// assignments share the main assignment's LbEndpoints, and a locality kept
// whole at the same priority is shared too.
func (b *Builder) buildSubClusters(m *canonModel, e *modelEntry) error {
	if e.subClusters == nil {
		e.subClusters = make(map[string]*cluster.Cluster)
	}
	filters := make([]subFilter, 0, 1+2*len(b.cfg.ContextClasses))
	filters = append(filters, subFilter{local: true})
	var classes, localClasses uint32
	for i, n := range b.cfg.ContextClasses {
		if b.anyEndpoint(m, subFilter{class: n}) {
			classes |= 1 << i
			filters = append(filters, subFilter{class: n})
		}
	}
	for i, n := range b.cfg.ContextClasses {
		if b.anyEndpoint(m, subFilter{local: true, class: n}) {
			localClasses |= 1 << i
			filters = append(filters, subFilter{local: true, class: n})
		}
	}
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
			if c, err = b.buildNamedCluster(name, alt); err != nil {
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
	e.classes, e.localClasses = classes, localClasses
	return nil
}

func (b *Builder) anyEndpoint(m *canonModel, f subFilter) bool {
	for i := range m.localities {
		l := &m.localities[i]
		for j := range l.Endpoints {
			if f.keep(b.cfg.Region, l, &l.Endpoints[j]) {
				return true
			}
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
		return fmt.Errorf("%w: ClusterLoadAssignment %q: %w", ErrInvalidResource, name, err)
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
		kept := 0
		for j := range l.Endpoints {
			if f.keep(b.cfg.Region, l, &l.Endpoints[j]) {
				kept++
			}
		}
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
		if kept == len(l.Endpoints) && prio == l.Priority {
			cla.Endpoints = append(cla.Endpoints, main)
			continue
		}
		lbs := make([]*endpoint.LbEndpoint, 0, kept)
		for j := range l.Endpoints {
			if f.keep(b.cfg.Region, l, &l.Endpoints[j]) {
				lbs = append(lbs, e.pos[i][j].lb)
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
