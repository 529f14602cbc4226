package xds

import (
	"fmt"

	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// validator is implemented by every Envoy message (protoc-gen-validate).
type validator interface{ ValidateAll() error }

// anyFullName is the full name of google.protobuf.Any.
const anyFullName protoreflect.FullName = "google.protobuf.Any"

// ValidateDeep runs ValidateAll on m and on every message packed in an Any
// anywhere inside it, recursively; an Any of a type not linked into the
// binary fails. ValidateAll alone stops at an Any: it would pass an
// HttpConnectionManager without a route specifier, or a Router config with a
// bad field. Errors wrap ErrInvalidResource. Data planes use it to validate
// what they receive.
func ValidateDeep(m proto.Message) error { return validateDeep(m) }

func validateDeep(m proto.Message) error {
	if err := validateOne(m); err != nil {
		return err
	}
	return walkAnys(m.ProtoReflect(), func(a *anypb.Any) error {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%w: Any %s inside %s: %w", ErrInvalidResource, a.GetTypeUrl(), m.ProtoReflect().Descriptor().FullName(), err)
		}
		return validateDeep(inner)
	})
}

func validateOne(m proto.Message) error {
	v, ok := m.(validator)
	if !ok {
		return nil
	}
	if err := v.ValidateAll(); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidResource, m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// walkAnys calls fn for every populated Any reachable from m without
// passing through another Any.
func walkAnys(m protoreflect.Message, fn func(*anypb.Any) error) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = visit(mv.Message(), fn)
				return err == nil
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = visit(l.Get(i).Message(), fn)
			}
		case fd.Message() != nil:
			err = visit(v.Message(), fn)
		}
		return err == nil
	})
	return err
}

func visit(m protoreflect.Message, fn func(*anypb.Any) error) error {
	if m.Descriptor().FullName() == anyFullName {
		a, ok := m.Interface().(*anypb.Any)
		if !ok {
			return fmt.Errorf("%w: Any of unexpected Go type %T", ErrInvalidResource, m.Interface())
		}
		return fn(a)
	}
	return walkAnys(m, fn)
}

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
							ErrInvalidResource, kind, r.GetName(), rc.GetName(), c)
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
			return fmt.Errorf("%w: %s set: api_listener %q: %w", ErrInvalidResource, kind, l.GetName(), err)
		}
		rc := m.GetRouteConfig()
		if rc == nil {
			return fmt.Errorf("%w: %s set: api_listener %q has no inline route; Consistent() cannot follow its RDS reference",
				ErrInvalidResource, kind, l.GetName())
		}
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				c := r.GetRoute().GetCluster()
				if _, ok := clusters[c]; !ok {
					return fmt.Errorf("%w: %s set: api_listener %q routes to cluster %q, which is not in the set",
						ErrInvalidResource, kind, l.GetName(), c)
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
			return fmt.Errorf("%w: %s set: cluster %q has no ClusterLoadAssignment %q", ErrInvalidResource, kind, c.GetName(), name)
		}
		delete(assignments, name)
	}
	for _, cla := range s.Endpoints {
		if _, extra := assignments[cla.GetClusterName()]; extra {
			return fmt.Errorf("%w: %s set: ClusterLoadAssignment %q belongs to no cluster", ErrInvalidResource, kind, cla.GetClusterName())
		}
	}
	return nil
}
