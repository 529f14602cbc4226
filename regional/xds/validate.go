package xds

import (
	"fmt"

	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// checkReferences is the reference check that Consistent() lacks: every
// route (RDS or inlined in an api_listener) points at a Cluster of the Set,
// every Cluster has its ClusterLoadAssignment, and every
// ClusterLoadAssignment belongs to a Cluster.
func checkReferences(kind NodeKind, s *Set) error {
	clusters := make(map[string]struct{}, len(s.Clusters))
	for _, c := range s.Clusters {
		clusters[c.GetName()] = struct{}{}
	}
	for _, rc := range s.Routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if c := r.GetRoute().GetCluster(); c != "" {
					if _, ok := clusters[c]; !ok {
						return fmt.Errorf("%w: %s set: route %q in RouteConfiguration %q points at cluster %q, which is not in the set",
							xdscontract.ErrInvalidResource, kind, r.GetName(), rc.GetName(), c)
					}
				}
			}
		}
	}
	for _, l := range s.Listeners {
		a := l.GetApiListener().GetApiListener()
		if a == nil {
			continue
		}
		var m hcm.HttpConnectionManager
		if err := a.UnmarshalTo(&m); err != nil {
			return fmt.Errorf("%w: %s set: api_listener %q: %w", xdscontract.ErrInvalidResource, kind, l.GetName(), err)
		}
		rc := m.GetRouteConfig()
		if rc == nil {
			return fmt.Errorf("%w: %s set: api_listener %q has no inline route; Consistent() cannot follow its RDS reference",
				xdscontract.ErrInvalidResource, kind, l.GetName())
		}
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				c := r.GetRoute().GetCluster()
				if _, ok := clusters[c]; !ok {
					return fmt.Errorf("%w: %s set: api_listener %q routes to cluster %q, which is not in the set",
						xdscontract.ErrInvalidResource, kind, l.GetName(), c)
				}
			}
		}
	}
	assignments := make(map[string]struct{}, len(s.Endpoints))
	for _, cla := range s.Endpoints {
		assignments[cla.GetClusterName()] = struct{}{}
	}
	for _, c := range s.Clusters {
		name := c.GetEdsClusterConfig().GetServiceName()
		if name == "" {
			name = c.GetName()
		}
		if _, ok := assignments[name]; !ok {
			return fmt.Errorf("%w: %s set: cluster %q has no ClusterLoadAssignment %q", xdscontract.ErrInvalidResource, kind, c.GetName(), name)
		}
		delete(assignments, name)
	}
	for _, cla := range s.Endpoints {
		if _, extra := assignments[cla.GetClusterName()]; extra {
			return fmt.Errorf("%w: %s set: ClusterLoadAssignment %q belongs to no cluster", xdscontract.ErrInvalidResource, kind, cla.GetClusterName())
		}
	}
	return nil
}
