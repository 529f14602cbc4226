package xds

import (
	"fmt"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	previoushosts "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// MetadataKey is the filter_metadata key under which every endpoint carries
// its cell id ("cell", a string) and, when known, its max_model_len
// ("max_model_len", a number).
const MetadataKey = "isobar"

// previousHostsPredicate is the name of Envoy's retry host predicate that
// makes a retry pick a different endpoint.
const previousHostsPredicate = "envoy.retry_host_predicates.previous_hosts"

// Set is the resources served to one kind of node. Resources are shared
// between Sets and between successive builds and must not be modified.
type Set struct {
	Listeners []*listener.Listener
	Routes    []*route.RouteConfiguration
	Clusters  []*cluster.Cluster
	Endpoints []*endpoint.ClusterLoadAssignment
}

// Resources is the output of one build.
type Resources struct {
	// Envoy is served to Envoy and to isobar's gateway: one HTTP listener
	// using RDS, one RouteConfiguration matching the model header, and per
	// model a Cluster and a ClusterLoadAssignment.
	Envoy Set
	// GRPC is served to proxyless gRPC clients: per model an api_listener
	// named after the model with the route inlined, and the same Clusters
	// and ClusterLoadAssignments.
	GRPC Set
}

// Builder turns a State into validated resources. It memoises every
// resource with its validation: a Cluster and a gRPC Listener are built once
// per model, the RouteConfiguration when the set of models changes, and a
// ClusterLoadAssignment when that model's localities or endpoints change.
// Unchanged resources are returned as the same pointers as in the previous
// build, which is how the Server detects what changed.
//
// A Builder is not safe for concurrent use.
type Builder struct {
	cfg Config

	envoyListener *listener.Listener
	routerAny     *anypb.Any
	retryPredAny  *anypb.Any

	routeKey string
	route    *route.RouteConfiguration

	models  map[string]*modelEntry
	scratch scratch
}

type modelEntry struct {
	cluster      *cluster.Cluster
	grpcListener *listener.Listener
	canon        canonModel
	cla          *endpoint.ClusterLoadAssignment

	// parts memoises each endpoint's validated pieces by identity; gen
	// marks the entries used by the latest assignment; pos holds them in
	// the latest assignment's order, so that an endpoint at the same place
	// is found without hashing.
	parts map[endpointKey]*endpointParts
	gen   uint64
	pos   [][]*endpointParts
}

// endpointKey is an endpoint's identity: everything but its weight.
type endpointKey struct {
	cell, host  string
	port        uint32
	maxModelLen uint32
}

// endpointParts are the validated, immutable pieces of one endpoint, and
// the last LbEndpoint built from them.
type endpointParts struct {
	key      endpointKey
	host     *endpoint.LbEndpoint_Endpoint
	metadata *core.Metadata
	lb       *endpoint.LbEndpoint
	gen      uint64
}

// NewBuilder validates cfg (after applying defaults) and builds the
// resources that depend on it alone.
func NewBuilder(cfg Config) (*Builder, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Builder{cfg: cfg, models: make(map[string]*modelEntry)}
	var err error
	if b.routerAny, err = packValidated(&router.Router{}); err != nil {
		return nil, err
	}
	if b.retryPredAny, err = packValidated(&previoushosts.PreviousHostsPredicate{}); err != nil {
		return nil, err
	}
	if b.envoyListener, err = b.buildEnvoyListener(); err != nil {
		return nil, err
	}
	return b, nil
}

// Config returns the Config in use, defaults applied.
func (b *Builder) Config() Config { return b.cfg }

// Build validates st and returns the resources for it. On error (wrapping
// ErrInvalidState or ErrInvalidResource) nothing is returned.
func (b *Builder) Build(st State) (*Resources, error) {
	models, err := canonicalize(&b.cfg, st, b.models, &b.scratch)
	if err != nil {
		return nil, err
	}
	res := &Resources{
		Envoy: Set{
			Listeners: []*listener.Listener{b.envoyListener},
			Clusters:  make([]*cluster.Cluster, 0, len(models)),
			Endpoints: make([]*endpoint.ClusterLoadAssignment, 0, len(models)),
		},
		GRPC: Set{Listeners: make([]*listener.Listener, 0, len(models))},
	}
	var key strings.Builder
	for i := range models {
		m := &models[i]
		e, err := b.entry(m)
		if err != nil {
			return nil, err
		}
		res.Envoy.Clusters = append(res.Envoy.Clusters, e.cluster)
		res.Envoy.Endpoints = append(res.Envoy.Endpoints, e.cla)
		res.GRPC.Listeners = append(res.GRPC.Listeners, e.grpcListener)
		key.WriteString(m.name)
		key.WriteByte(0)
	}
	if b.route == nil || b.routeKey != key.String() {
		rc, err := b.buildRouteConfig(models)
		if err != nil {
			return nil, err
		}
		b.route, b.routeKey = rc, key.String()
	}
	res.Envoy.Routes = []*route.RouteConfiguration{b.route}
	res.GRPC.Clusters = res.Envoy.Clusters
	res.GRPC.Endpoints = res.Envoy.Endpoints

	if len(b.models) > len(models) {
		keep := make(map[string]struct{}, len(models))
		for i := range models {
			keep[models[i].name] = struct{}{}
		}
		for name := range b.models {
			if _, ok := keep[name]; !ok {
				delete(b.models, name)
			}
		}
	}
	return res, nil
}

// entry returns the memoised resources of m, building what changed.
func (b *Builder) entry(m *canonModel) (*modelEntry, error) {
	e := b.models[m.name]
	if e == nil {
		c, err := b.buildCluster(m.name)
		if err != nil {
			return nil, err
		}
		l, err := b.buildGRPCListener(m.name)
		if err != nil {
			return nil, err
		}
		e = &modelEntry{cluster: c, grpcListener: l}
		b.models[m.name] = e
	}
	if m.reused {
		return e, nil
	}
	if e.cla == nil || !e.canon.equal(m) {
		cla, err := b.buildLoadAssignment(m, e)
		if err != nil {
			return nil, err
		}
		e.cla = cla
	}
	e.canon = *m
	e.canon.reused = false
	return e, nil
}

func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

func (b *Builder) routerFilter() *hcm.HttpFilter {
	return &hcm.HttpFilter{
		Name:       wellknown.Router,
		ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: b.routerAny},
	}
}

func (b *Builder) buildEnvoyListener() (*listener.Listener, error) {
	manager := &hcm.HttpConnectionManager{
		CodecType:  hcm.HttpConnectionManager_AUTO,
		StatPrefix: "isobar_ingress",
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: RouteName,
		}},
		HttpFilters: []*hcm.HttpFilter{b.routerFilter()},
	}
	hcmAny, err := packValidated(manager)
	if err != nil {
		return nil, err
	}
	l := &listener.Listener{
		Name: ListenerName,
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Protocol:      core.SocketAddress_TCP,
			Address:       b.cfg.ListenAddress,
			PortSpecifier: &core.SocketAddress_PortValue{PortValue: b.cfg.ListenPort},
		}}},
		FilterChains: []*listener.FilterChain{{
			Filters: []*listener.Filter{{
				Name:       wellknown.HTTPConnectionManager,
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: hcmAny},
			}},
		}},
	}
	return l, validateDeep(l)
}

// envoyRetryPolicy retries connect failures, refused streams, resets and
// 503s on another endpoint; the cluster's retry budget bounds it.
func (b *Builder) envoyRetryPolicy() *route.RetryPolicy {
	return &route.RetryPolicy{
		RetryOn:              "connect-failure,refused-stream,reset,retriable-status-codes",
		RetriableStatusCodes: []uint32{503},
		NumRetries:           wrapperspb.UInt32(b.cfg.NumRetries),
		RetryHostPredicate: []*route.RetryPolicy_RetryHostPredicate{{
			Name:       previousHostsPredicate,
			ConfigType: &route.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: b.retryPredAny},
		}},
		HostSelectionRetryMaxAttempts: 3,
	}
}

func (b *Builder) envoyRoute(name string, model string, headers []*route.HeaderMatcher) *route.Route {
	return &route.Route{
		Name: name,
		Match: &route.RouteMatch{
			PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"},
			Headers:       headers,
		},
		Action: &route.Route_Route{Route: &route.RouteAction{
			ClusterSpecifier: &route.RouteAction_Cluster{Cluster: ClusterName(model)},
			Timeout:          durationpb.New(b.cfg.RouteTimeout),
			RetryPolicy:      b.envoyRetryPolicy(),
		}},
	}
}

func (b *Builder) buildRouteConfig(models []canonModel) (*route.RouteConfiguration, error) {
	routes := make([]*route.Route, 0, len(models)+1)
	for i := range models {
		name := models[i].name
		routes = append(routes, b.envoyRoute(name, name, []*route.HeaderMatcher{{
			Name: b.cfg.ModelHeader,
			HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: &matcher.StringMatcher{
				MatchPattern: &matcher.StringMatcher_Exact{Exact: name},
			}},
		}}))
	}
	if len(models) == 1 {
		// With one model a request without the header still has one place
		// to go.
		routes = append(routes, b.envoyRoute("catch_all", models[0].name, nil))
	}
	rc := &route.RouteConfiguration{
		Name: RouteName,
		VirtualHosts: []*route.VirtualHost{{
			Name:    "isobar_models",
			Domains: []string{"*"},
			Routes:  routes,
		}},
	}
	return rc, validateDeep(rc)
}

// buildGRPCListener builds the api_listener a proxyless gRPC client loads
// for "xds:///model". The route is inlined: Consistent() does not follow an
// api_listener's RDS reference, and inlining saves a round trip.
func (b *Builder) buildGRPCListener(model string) (*listener.Listener, error) {
	manager := &hcm.HttpConnectionManager{
		CodecType:  hcm.HttpConnectionManager_AUTO,
		StatPrefix: "isobar_grpc",
		RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{
			Name: model,
			VirtualHosts: []*route.VirtualHost{{
				Name:    model,
				Domains: []string{"*"},
				Routes: []*route.Route{{
					Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
					Action: &route.Route_Route{Route: &route.RouteAction{
						ClusterSpecifier: &route.RouteAction_Cluster{Cluster: ClusterName(model)},
						MaxStreamDuration: &route.RouteAction_MaxStreamDuration{
							MaxStreamDuration: durationpb.New(b.cfg.RouteTimeout),
						},
						RetryPolicy: &route.RetryPolicy{
							RetryOn:    "unavailable",
							NumRetries: wrapperspb.UInt32(b.cfg.NumRetries),
						},
					}},
				}},
			}},
		}},
		HttpFilters: []*hcm.HttpFilter{b.routerFilter()},
	}
	hcmAny, err := packValidated(manager)
	if err != nil {
		return nil, err
	}
	l := &listener.Listener{
		Name:        GRPCListenerName(model),
		ApiListener: &listener.ApiListener{ApiListener: hcmAny},
	}
	return l, validateDeep(l)
}

func (b *Builder) buildCluster(model string) (*cluster.Cluster, error) {
	name := ClusterName(model)
	c := &cluster.Cluster{
		Name:                 name,
		AltStatName:          statName(model),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{
			EdsConfig:   adsSource(),
			ServiceName: name,
		},
		ConnectTimeout: durationpb.New(b.cfg.ConnectTimeout),
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
			},
		},
		CircuitBreakers: &cluster.CircuitBreakers{Thresholds: []*cluster.CircuitBreakers_Thresholds{{
			Priority:           core.RoutingPriority_DEFAULT,
			MaxConnections:     wrapperspb.UInt32(b.cfg.MaxRequests),
			MaxPendingRequests: wrapperspb.UInt32(b.cfg.MaxRequests),
			MaxRequests:        wrapperspb.UInt32(b.cfg.MaxRequests),
			RetryBudget: &cluster.CircuitBreakers_Thresholds_RetryBudget{
				BudgetPercent:       &typev3.Percent{Value: b.cfg.RetryBudgetPercent},
				MinRetryConcurrency: wrapperspb.UInt32(b.cfg.RetryBudgetMinConcurrency),
			},
		}}},
		OutlierDetection: &cluster.OutlierDetection{
			Consecutive_5Xx:    wrapperspb.UInt32(b.cfg.OutlierConsecutive5xx),
			Interval:           durationpb.New(b.cfg.OutlierInterval),
			BaseEjectionTime:   durationpb.New(b.cfg.OutlierBaseEjectionTime),
			MaxEjectionPercent: wrapperspb.UInt32(b.cfg.OutlierMaxEjectionPercent),
		},
	}
	switch b.cfg.LBPolicy {
	case RingHash:
		c.LbPolicy = cluster.Cluster_RING_HASH
		c.LbConfig = &cluster.Cluster_RingHashLbConfig_{RingHashLbConfig: &cluster.Cluster_RingHashLbConfig{
			MinimumRingSize: wrapperspb.UInt64(b.cfg.RingSize),
			HashFunction:    cluster.Cluster_RingHashLbConfig_XX_HASH,
		}}
	case RoundRobin:
		c.LbPolicy = cluster.Cluster_ROUND_ROBIN
	default:
		c.LbPolicy = cluster.Cluster_LEAST_REQUEST
		c.LbConfig = &cluster.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &cluster.Cluster_LeastRequestLbConfig{
			ChoiceCount: wrapperspb.UInt32(2),
		}}
	}
	return c, validateDeep(c)
}

// buildLoadAssignment builds and validates m's ClusterLoadAssignment,
// reusing e's memoised endpoint pieces.
//
// Validation is ValidateAll applied piece by piece, which gives the same
// verdict as ValidateAll on the whole assignment because protoc-gen-validate
// rules are per message: each message's own fields are checked before its
// children are attached, and each child (endpoint address, metadata) was
// checked when first built. An unchanged endpoint reuses its LbEndpoint, so a
// weight change costs one small message. The assignment holds no Any (a test
// checks), so nothing is packed unseen.
func (b *Builder) buildLoadAssignment(m *canonModel, e *modelEntry) (*endpoint.ClusterLoadAssignment, error) {
	name := ClusterName(m.name)
	wrap := func(err error) error {
		return fmt.Errorf("%w: ClusterLoadAssignment %q: %w", ErrInvalidResource, name, err)
	}
	if e.parts == nil {
		e.parts = make(map[endpointKey]*endpointParts)
	}
	e.gen++
	used := 0
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	if err := cla.ValidateAll(); err != nil {
		return nil, wrap(err)
	}
	localities := make([]*endpoint.LocalityLbEndpoints, len(m.localities))
	pos := make([][]*endpointParts, len(m.localities))
	for i := range m.localities {
		l := &m.localities[i]
		ll := &endpoint.LocalityLbEndpoints{
			Locality:            &core.Locality{Region: l.Region, Zone: l.Zone},
			LoadBalancingWeight: wrapperspb.UInt32(l.Weight),
			Priority:            l.Priority,
		}
		if err := ll.ValidateAll(); err != nil {
			return nil, wrap(err)
		}
		lbs := make([]*endpoint.LbEndpoint, len(l.Endpoints))
		pos[i] = make([]*endpointParts, len(l.Endpoints))
		for j := range l.Endpoints {
			ep := &l.Endpoints[j]
			k := endpointKey{ep.CellID, ep.Host, ep.Port, ep.MaxModelLen}
			var p *endpointParts
			if i < len(e.pos) && j < len(e.pos[i]) && e.pos[i][j].key == k {
				p = e.pos[i][j]
			} else if p = e.parts[k]; p == nil {
				var err error
				if p, err = newEndpointParts(k); err != nil {
					return nil, wrap(err)
				}
				e.parts[k] = p
			}
			pos[i][j] = p
			if p.gen != e.gen {
				p.gen = e.gen
				used++
			}
			if p.lb == nil || p.lb.GetLoadBalancingWeight().GetValue() != ep.Weight {
				lb := &endpoint.LbEndpoint{LoadBalancingWeight: wrapperspb.UInt32(ep.Weight)}
				if err := lb.ValidateAll(); err != nil {
					return nil, wrap(err)
				}
				lb.HostIdentifier, lb.Metadata = p.host, p.metadata
				p.lb = lb
			}
			lbs[j] = p.lb
		}
		ll.LbEndpoints = lbs
		localities[i] = ll
	}
	cla.Endpoints = localities
	e.pos = pos
	if len(e.parts) > used {
		for k, p := range e.parts {
			if p.gen != e.gen {
				delete(e.parts, k)
			}
		}
	}
	return cla, nil
}

// newEndpointParts builds and validates the weight-independent pieces of
// the endpoint k.
func newEndpointParts(k endpointKey) (*endpointParts, error) {
	host := &endpoint.Endpoint{
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Protocol:      core.SocketAddress_TCP,
			Address:       k.host,
			PortSpecifier: &core.SocketAddress_PortValue{PortValue: k.port},
		}}},
	}
	if err := host.ValidateAll(); err != nil {
		return nil, err
	}
	fields := make(map[string]*structpb.Value, 2)
	fields["cell"] = structpb.NewStringValue(k.cell)
	if k.maxModelLen > 0 {
		fields["max_model_len"] = structpb.NewNumberValue(float64(k.maxModelLen))
	}
	md := &core.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: {Fields: fields}}}
	if err := md.ValidateAll(); err != nil {
		return nil, err
	}
	return &endpointParts{key: k, host: &endpoint.LbEndpoint_Endpoint{Endpoint: host}, metadata: md}, nil
}

// packValidated validates m, including every Any inside it, then packs it.
func packValidated(m proto.Message) (*anypb.Any, error) {
	if err := validateDeep(m); err != nil {
		return nil, err
	}
	a, err := anypb.New(m)
	if err != nil {
		return nil, fmt.Errorf("%w: pack %s: %w", ErrInvalidResource, m.ProtoReflect().Descriptor().FullName(), err)
	}
	return a, nil
}
