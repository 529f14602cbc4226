package xds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	lbcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequest "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	roundrobin "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	wrrlocality "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	previoushosts "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/isobar-mesh/isobar/internal/keepwrite"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/xdscontract"
)

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
	// using RDS (fault filter, then router), one RouteConfiguration, and per
	// model a main Cluster (xdscontract.ClusterName), a local-only Cluster
	// (xdscontract.LocalClusterName) and one Cluster per context class that
	// has an endpoint (xdscontract.ClassClusterName,
	// xdscontract.LocalClassClusterName), and per residency set a pinned
	// Cluster (xdscontract.PinnedClusterName) and one per context class
	// that has an endpoint of the set
	// (xdscontract.PinnedClassClusterName), each with its
	// ClusterLoadAssignment. See modelRoutes for the route order.
	Envoy Set
	// GRPC is served to proxyless gRPC clients: per model an api_listener
	// named after the model with the route inlined, and the main Clusters
	// and ClusterLoadAssignments (no pinned ones: see the package doc).
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
	faultAny      *anypb.Any // the listener-level fault filter: no fault
	retryPredAny  *anypb.Any
	lbPolicy      *cluster.LoadBalancingPolicy // typed least_request; nil for the legacy enum policies
	shedAny       map[uint64]*anypb.Any        // per-route aborts by status<<32 | parts per million

	routeKey string
	route    *route.RouteConfiguration

	models  map[string]*modelEntry
	scratch scratch
}

type modelEntry struct {
	cluster      *cluster.Cluster
	grpcListener *listener.Listener
	canon        canonModel
	// spare is the canonical model canon replaced, whose buffers the next
	// canonicalisation reuses (keepCanon).
	spare canonModel
	cla   *endpoint.ClusterLoadAssignment
	// budget is the retry budget the clusters were built with (0: the
	// Config's).
	budget float64

	// pins holds the entries of the model's residency sets by set name:
	// each uses cluster (the pinned cluster), cla, canon, budget, the
	// Envoy-only clusters below (the set's class clusters only), the
	// endpoint memo below, and regions (the allowed regions its clusters
	// were built with).
	pins    map[string]*modelEntry
	regions []string

	// The Envoy-only clusters, rebuilt with cla. sizes are the model's
	// context classes (classSizes); classes and localClasses are bit masks
	// over sizes of the classes present;
	// clusters and assignments list the main cluster then the others in
	// set order; subClusters memoises the Cluster of every name used.
	sizes                 []uint32
	classes, localClasses uint32
	clusters              []*cluster.Cluster
	assignments           []*endpoint.ClusterLoadAssignment
	subClusters           map[string]*cluster.Cluster

	// parts memoises each endpoint's validated pieces by identity; gen
	// marks the entries used by the latest assignment; pos holds them in
	// the latest assignment's order, so that an endpoint at the same place
	// is found without hashing.
	parts map[endpointKey]*endpointParts
	gen   uint64
	pos   [][]*endpointParts
	// posSpare is the pos of the build before the latest: the next build
	// writes its pos there while it reads the latest's (no allocation per
	// build; only this entry's builds touch either).
	posSpare [][]*endpointParts
	// walk follows, within the locality partsAt is walking, where the
	// previous build's endpoint of the current position stands.
	walk shiftWalk
	// spans sums up each locality of the latest build for the Envoy-only
	// clusters' filters (localitySpan), in a buffer each build reuses.
	spans []localitySpan
}

// endpointKey is an endpoint's identity: everything but its weight and
// health.
type endpointKey struct {
	cell, host  string
	port        uint32
	maxModelLen uint32
	probeBudget uint32
	maxNumSeqs  uint32
	prefillRate float64
	// rttUS and jitterUS are Endpoint.RTT and Jitter in whole
	// microseconds, as written.
	rttUS, jitterUS int64
}

// endpointParts are the validated, immutable pieces of one endpoint, and
// the last LbEndpoint built from them.
type endpointParts struct {
	key      endpointKey
	host     *endpoint.LbEndpoint_Endpoint
	metadata *core.Metadata
	lb       *endpoint.LbEndpoint
	// classLB is the LbEndpoint of the context-class clusters when the
	// endpoint's ClassWeight differs from its Weight, else nil (lb serves).
	classLB *endpoint.LbEndpoint
	// lbAs and classAs are the weight and health lb and classLB carry,
	// kept here so that an unchanged endpoint is found so without
	// reading its messages (cache misses at 10,000 endpoints).
	lbAs, classAs lbAs
	gen           uint64
}

// lbAs is the weight and health an LbEndpoint carries.
type lbAs struct {
	weight uint32
	health core.HealthStatus
}

// NewBuilder validates cfg (after applying defaults) and builds the
// resources that depend on it alone.
func NewBuilder(cfg Config) (*Builder, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Builder{cfg: cfg, models: make(map[string]*modelEntry), shedAny: make(map[uint64]*anypb.Any)}
	var err error
	if b.routerAny, err = packValidated(&router.Router{}); err != nil {
		return nil, err
	}
	if b.faultAny, err = packValidated(&fault.HTTPFault{}); err != nil {
		return nil, err
	}
	if b.retryPredAny, err = packValidated(&previoushosts.PreviousHostsPredicate{}); err != nil {
		return nil, err
	}
	if b.cfg.LBPolicy == xdscontract.LeastRequest {
		if b.lbPolicy, err = b.buildLeastRequestPolicy(); err != nil {
			return nil, err
		}
	}
	if b.envoyListener, err = b.buildEnvoyListener(); err != nil {
		return nil, err
	}
	return b, nil
}

// Config returns the Config in use, defaults applied.
func (b *Builder) Config() Config {
	c := b.cfg
	c.ContextClasses = slices.Clone(c.ContextClasses)
	return c
}

// Build validates st and returns the resources for it. On error (wrapping
// ErrInvalidState or xdscontract.ErrInvalidResource) nothing is returned.
func (b *Builder) Build(st State) (*Resources, error) {
	models, err := canonicalize(&b.cfg, st, b.models, &b.scratch)
	if err != nil {
		return nil, err
	}
	res := &Resources{
		Envoy: Set{
			Listeners: []*listener.Listener{b.envoyListener},
			Clusters:  make([]*cluster.Cluster, 0, len(models)*(2+len(b.cfg.ContextClasses))),
			Endpoints: make([]*endpoint.ClusterLoadAssignment, 0, len(models)*(2+len(b.cfg.ContextClasses))),
		},
		GRPC: Set{
			Listeners: make([]*listener.Listener, 0, len(models)),
			Clusters:  make([]*cluster.Cluster, 0, len(models)),
			Endpoints: make([]*endpoint.ClusterLoadAssignment, 0, len(models)),
		},
	}
	var key strings.Builder
	plans := make([]routePlan, len(models))
	for i := range models {
		m := &models[i]
		e, err := b.entry(m)
		if err != nil {
			return nil, err
		}
		res.Envoy.Clusters = append(res.Envoy.Clusters, e.clusters...)
		res.Envoy.Endpoints = append(res.Envoy.Endpoints, e.assignments...)
		appendPinned(&res.Envoy, m, e)
		res.GRPC.Listeners = append(res.GRPC.Listeners, e.grpcListener)
		res.GRPC.Clusters = append(res.GRPC.Clusters, e.cluster)
		res.GRPC.Endpoints = append(res.GRPC.Endpoints, e.cla)
		plans[i] = routePlan{model: m.name, shed: m.shed, sizes: e.sizes, classes: e.classes, localClasses: e.localClasses}
		fmt.Fprintf(&key, "%s\x00%v\x00%v\x00%d\x00%d\x00", m.name, m.shed, e.sizes, e.classes, e.localClasses)
		for _, cp := range m.pinned {
			sh := cp.shed
			sh.status = 503 // a set's excess is refused, never spilled
			pe := e.pins[cp.set]
			plans[i].pins = append(plans[i].pins, pinPlan{set: cp.set, shed: sh, sizes: pe.sizes, classes: pe.classes})
			fmt.Fprintf(&key, "%s\x00%v\x00%v\x00%d\x00", cp.set, cp.shed, pe.sizes, pe.classes)
		}
		key.WriteByte(0)
	}
	if b.route == nil || b.routeKey != key.String() {
		rc, err := b.buildRouteConfig(plans)
		if err != nil {
			return nil, err
		}
		b.route, b.routeKey = rc, key.String()
	}
	res.Envoy.Routes = []*route.RouteConfiguration{b.route}

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
		c, err := b.buildCluster(m.name, m.budget)
		if err != nil {
			return nil, err
		}
		l, err := b.buildGRPCListener(m.name)
		if err != nil {
			return nil, err
		}
		e = &modelEntry{cluster: c, grpcListener: l, budget: m.budget}
		b.models[m.name] = e
	}
	if e.budget != m.budget {
		if err := b.rebudget(e, m); err != nil {
			return nil, err
		}
	}
	if err := b.pinEntries(m, e); err != nil {
		return nil, err
	}
	if m.reused {
		return e, nil
	}
	if e.cla == nil || !e.canon.equal(m) {
		cla, err := b.buildLoadAssignment(xdscontract.ClusterName(m.name), m, e)
		if err != nil {
			return nil, err
		}
		e.cla = cla
		if err := b.buildSubClusters(m, e, nil); err != nil {
			e.cla = nil // rebuild everything next time
			return nil, err
		}
	}
	e.keepCanon(*m)
	return e, nil
}

// keepCanon makes m e's canonical model and keeps the one it replaces as
// e's spare: the next canonicalizeModel of e's model writes into its
// buffers. Nothing else holds them: what the Builder makes from a
// canonical model (the endpoint memo, the resources) copies its values.
// m never shares its buffers with e.canon: a model taken whole from the
// memo (reused) returns before it gets here.
func (e *modelEntry) keepCanon(m canonModel) {
	e.spare, e.canon = e.canon, m
	e.canon.reused = false
}

// spareCanon is e's spare canonical model; nil when e is nil or has none.
func (e *modelEntry) spareCanon() *canonModel {
	if e == nil || e.spare.localities == nil {
		return nil
	}
	return &e.spare
}

// rebudget rebuilds e's main cluster and every Envoy-only cluster it holds
// with m's retry budget, and the cluster list from them in the same order
// (reclusters); the assignments stay, so a budget change moves CDS only.
// On error e.cla is cleared, so that the next build starts afresh.
func (b *Builder) rebudget(e *modelEntry, m *canonModel) error {
	c, err := b.buildCluster(m.name, m.budget)
	if err != nil {
		e.cla = nil
		return err
	}
	e.cluster = c
	if err := e.reclusters(func(name, alt string) (*cluster.Cluster, error) {
		return b.buildNamedCluster(name, alt, m.budget)
	}); err != nil {
		e.cla = nil
		return err
	}
	e.budget = m.budget
	return nil
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
		// The ingress is the edge: whether a request is internal (keeps the
		// route configuration's internal_only_headers, the hop header among
		// them) is decided by the TCP peer, not by a client's
		// x-forwarded-for, and no peer is internal (an explicit, empty
		// internal_address_config; Envoy's implicit default trusted RFC 1918
		// peers before 1.36). So no client request reaches a hop route
		// through Envoy; forwarded requests arriving here are served as
		// client traffic (docs/design.md §6.1). See Envoy's "HTTP header
		// sanitizing" and http_connection_manager.proto use_remote_address,
		// internal_address_config; conn_manager_utility.cc
		// mutateRequestHeaders.
		UseRemoteAddress:      wrapperspb.Bool(true),
		InternalAddressConfig: &hcm.HttpConnectionManager_InternalAddressConfig{},
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: xdscontract.RouteName,
		}},
		// The fault filter does nothing on its own: routes of a model
		// with a shed share override it with a 429 abort.
		HttpFilters: []*hcm.HttpFilter{
			{Name: wellknown.Fault, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: b.faultAny}},
			b.routerFilter(),
		},
	}
	hcmAny, err := packValidated(manager)
	if err != nil {
		return nil, err
	}
	l := &listener.Listener{
		Name: xdscontract.ListenerName,
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
	return l, xdscontract.ValidateDeep(l)
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

func (b *Builder) envoyRoute(name, cluster string, headers []*route.HeaderMatcher, shed *anypb.Any) *route.Route {
	r := &route.Route{
		Name: name,
		Match: &route.RouteMatch{
			PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"},
			Headers:       headers,
		},
		Action: &route.Route_Route{Route: &route.RouteAction{
			ClusterSpecifier: &route.RouteAction_Cluster{Cluster: cluster},
			Timeout:          durationpb.New(b.cfg.RouteTimeout),
			RetryPolicy:      b.envoyRetryPolicy(),
		}},
	}
	if shed != nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{wellknown.Fault: shed}
	}
	return r
}

// routePlan is what the routes of one model depend on.
type routePlan struct {
	model                 string
	shed                  shedPPM
	sizes                 []uint32 // the model's context classes
	classes, localClasses uint32   // bit i: sizes[i] is present
	pins                  []pinPlan
}

// pinPlan is what the routes of one residency set of a model depend on.
type pinPlan struct {
	set     string
	shed    shedPPM
	sizes   []uint32 // the set's context classes
	classes uint32   // bit i: sizes[i] is present among the set's endpoints
}

// shedFault returns the per-route fault config that aborts ppm parts per
// million of requests with 429, or nil for 0.
func (b *Builder) shedFault(ppm, status uint32) (*anypb.Any, error) {
	if ppm == 0 {
		return nil, nil
	}
	if status == 0 {
		status = 429
	}
	key := uint64(status)<<32 | uint64(ppm)
	if a := b.shedAny[key]; a != nil {
		return a, nil
	}
	a, err := packValidated(&fault.HTTPFault{Abort: &fault.FaultAbort{
		ErrorType:  &fault.FaultAbort_HttpStatus{HttpStatus: status},
		Percentage: &typev3.FractionalPercent{Numerator: ppm, Denominator: typev3.FractionalPercent_MILLION},
	}})
	if err != nil {
		return nil, err
	}
	if len(b.shedAny) > 4096 {
		clear(b.shedAny) // bound the memo; values recur, so it refills fast
	}
	b.shedAny[key] = a
	return a, nil
}

func exactHeader(name, value string) *route.HeaderMatcher {
	return &route.HeaderMatcher{
		Name: name,
		HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: &matcher.StringMatcher{
			MatchPattern: &matcher.StringMatcher_Exact{Exact: value},
		}},
	}
}

func presentHeader(name string) *route.HeaderMatcher {
	return &route.HeaderMatcher{Name: name, HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: true}}
}

// absentHeader matches requests without the header. present_match false
// changed meaning across Envoy versions; an inverted present match did not.
func absentHeader(name string) *route.HeaderMatcher {
	m := presentHeader(name)
	m.InvertMatch = true
	return m
}

// rangeHeader matches an integer header value in [start, end).
func rangeHeader(name string, start, end int64) *route.HeaderMatcher {
	return &route.HeaderMatcher{Name: name, HeaderMatchSpecifier: &route.HeaderMatcher_RangeMatch{
		RangeMatch: &typev3.Int64Range{Start: start, End: end},
	}}
}

// classRoutes appends, for every class present in mask, a route on
// xdscontract.PromptTokensHeader and one on content-length (when the token
// header is absent) to the class's cluster. A class takes the token needs
// above the previous present class up to its own size, so a request goes to
// the smallest present class that fits.
func (b *Builder) classRoutes(routes []*route.Route, prefix string, base []*route.HeaderMatcher, sizes []uint32, mask uint32,
	clusterName func(uint32) string, shed shedPPM) ([]*route.Route, error) {
	var prev int64
	var err error
	for i, n := range sizes {
		if mask&(1<<i) == 0 {
			continue
		}
		size := int64(n)
		cl := clusterName(n)
		tokenLo := int64(0)
		byteLo := int64(0)
		if prev > 0 {
			tokenLo = prev + 1
			byteLo = prev*xdscontract.BytesPerToken + 1
		}
		name := prefix + "/ctx-" + strconv.FormatInt(size, 10)
		if routes, err = b.shedRoutes(routes, name, cl,
			append(slices.Clip(base), rangeHeader(xdscontract.PromptTokensHeader, tokenLo, size+1)), shed); err != nil {
			return nil, err
		}
		if routes, err = b.shedRoutes(routes, name+"/bytes", cl, append(slices.Clip(base), absentHeader(xdscontract.PromptTokensHeader),
			rangeHeader("content-length", byteLo, size*xdscontract.BytesPerToken+1)), shed); err != nil {
			return nil, err
		}
		prev = size
	}
	return routes, nil
}

// shedRoutes appends the routes of one match to cluster: for critical
// and sheddable requests whose share differs from the standard one, a
// route that also requires xdscontract.CriticalityHeader to equal the
// criticality and carries that share's abort, named name + "/critical"
// or "/sheddable"; then the route for the rest (standard, or no or any
// other criticality) with the standard share's abort. Equal shares need
// no route of their own, which keeps RDS small.
func (b *Builder) shedRoutes(routes []*route.Route, name, cluster string, headers []*route.HeaderMatcher, s shedPPM) ([]*route.Route, error) {
	for _, v := range [...]struct {
		c   reqclass.Criticality
		ppm uint32
	}{{reqclass.Critical, s.critical}, {reqclass.Sheddable, s.sheddable}} {
		if v.ppm == s.standard {
			continue
		}
		f, err := b.shedFault(v.ppm, s.status)
		if err != nil {
			return nil, err
		}
		crit := v.c.String()
		routes = append(routes, b.envoyRoute(name+"/"+crit, cluster,
			append(slices.Clip(headers), exactHeader(xdscontract.CriticalityHeader, crit)), f))
	}
	f, err := b.shedFault(s.standard, s.status)
	if err != nil {
		return nil, err
	}
	return append(routes, b.envoyRoute(name, cluster, headers, f)), nil
}

// modelRoutes appends the routes of one model, in match order:
//
//  1. forwarded traffic (hop header present: only isobar's, as the
//     header is internal-only), by context class, to the local class
//     clusters, then to the local cluster; never shed;
//  2. per residency set, in set order, client traffic whose
//     xdscontract.ResidencyHeader equals the set: by context class to the
//     set's pinned class clusters (the classes present among the set's
//     endpoints), then the rest to the set's pinned cluster, all with the
//     set's shed faults (503);
//  3. client traffic without the residency header by context class
//     (token header, else content-length) to the class clusters, with
//     the shed faults;
//  4. the rest without the residency header to the model's main cluster,
//     with the shed faults.
//
// A client request naming a residency set the model does not list matches
// no route (Envoy answers 404): it is never served outside its regions.
// Every client route group has its per-criticality variants first
// (shedRoutes). model is nil for the catch-all copy of a lone model.
func (b *Builder) modelRoutes(routes []*route.Route, p routePlan, prefix string, model *route.HeaderMatcher) ([]*route.Route, error) {
	var base []*route.HeaderMatcher
	if model != nil {
		base = []*route.HeaderMatcher{model}
	}
	hop := append(slices.Clip(base), presentHeader(b.cfg.HopHeader))
	routes, err := b.classRoutes(routes, prefix+"/hop", hop, p.sizes, p.localClasses,
		func(n uint32) string { return xdscontract.LocalClassClusterName(p.model, n) }, shedPPM{})
	if err != nil {
		return nil, err
	}
	routes = append(routes, b.envoyRoute(prefix+"/hop", xdscontract.LocalClusterName(p.model), hop, nil))
	for _, pin := range p.pins {
		pinned := append(slices.Clip(base), exactHeader(xdscontract.ResidencyHeader, pin.set))
		if routes, err = b.classRoutes(routes, prefix+"/pin-"+pin.set, pinned, pin.sizes, pin.classes,
			func(n uint32) string { return xdscontract.PinnedClassClusterName(p.model, pin.set, n) }, pin.shed); err != nil {
			return nil, err
		}
		if routes, err = b.shedRoutes(routes, prefix+"/pin-"+pin.set, xdscontract.PinnedClusterName(p.model, pin.set),
			pinned, pin.shed); err != nil {
			return nil, err
		}
	}
	client := append(slices.Clip(base), absentHeader(xdscontract.ResidencyHeader))
	if routes, err = b.classRoutes(routes, prefix, client, p.sizes, p.classes,
		func(n uint32) string { return xdscontract.ClassClusterName(p.model, n) }, p.shed); err != nil {
		return nil, err
	}
	return b.shedRoutes(routes, prefix, xdscontract.ClusterName(p.model), client, p.shed)
}

func (b *Builder) buildRouteConfig(plans []routePlan) (*route.RouteConfiguration, error) {
	var routes []*route.Route
	var err error
	for _, p := range plans {
		if routes, err = b.modelRoutes(routes, p, p.model, exactHeader(b.cfg.ModelHeader, p.model)); err != nil {
			return nil, err
		}
	}
	if len(plans) == 1 {
		// With one model a request without the header still has one place
		// to go.
		if routes, err = b.modelRoutes(routes, plans[0], "catch_all", nil); err != nil {
			return nil, err
		}
	}
	rc := &route.RouteConfiguration{
		Name: xdscontract.RouteName,
		// The hop routes above serve forwarded traffic unshed; only isobar
		// may mark a request forwarded. Envoy removes these headers from
		// every request it finds external before it matches a route
		// (route.proto internal_only_headers; conn_manager_utility.cc
		// mutateRequestHeaders → cleanInternalHeaders), so a client cannot
		// reach a hop route. Which requests are internal is the listener's
		// use_remote_address and internal_address_config: docs/design.md
		// §6.1 says what an operator sets. isobar's gateway and picker honour
		// the list, trusting only a valid hop proof.
		InternalOnlyHeaders: xdscontract.InternalHeaders(b.cfg.HopHeader),
		VirtualHosts: []*route.VirtualHost{{
			Name:    "isobar_models",
			Domains: []string{"*"},
			Routes:  routes,
		}},
	}
	return rc, xdscontract.ValidateDeep(rc)
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
						ClusterSpecifier: &route.RouteAction_Cluster{Cluster: xdscontract.ClusterName(model)},
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
		Name:        xdscontract.GRPCListenerName(model),
		ApiListener: &listener.ApiListener{ApiListener: hcmAny},
	}
	return l, xdscontract.ValidateDeep(l)
}

func (b *Builder) buildCluster(model string, budget float64) (*cluster.Cluster, error) {
	return b.buildNamedCluster(xdscontract.ClusterName(model), statName(model), budget)
}

// buildNamedCluster builds a model cluster; budget is its retry budget in
// percent, 0 for Config.RetryBudgetPercent.
func (b *Builder) buildNamedCluster(name, altStatName string, budget float64) (*cluster.Cluster, error) {
	if budget == 0 {
		budget = b.cfg.RetryBudgetPercent
	}
	c := &cluster.Cluster{
		Name:                 name,
		AltStatName:          altStatName,
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
				BudgetPercent:       &typev3.Percent{Value: budget},
				MinRetryConcurrency: wrapperspb.UInt32(b.cfg.RetryBudgetMinConcurrency),
			},
		}}},
		OutlierDetection: &cluster.OutlierDetection{
			Consecutive_5Xx:                        wrapperspb.UInt32(b.cfg.OutlierConsecutive5xx),
			EnforcingConsecutive_5Xx:               wrapperspb.UInt32(b.cfg.OutlierEnforcing5xx),
			SplitExternalLocalOriginErrors:         true,
			ConsecutiveLocalOriginFailure:          wrapperspb.UInt32(b.cfg.OutlierConsecutiveLocalOrigin),
			EnforcingConsecutiveLocalOriginFailure: wrapperspb.UInt32(100),
			Interval:                               durationpb.New(b.cfg.OutlierInterval),
			BaseEjectionTime:                       durationpb.New(b.cfg.OutlierBaseEjectionTime),
			MaxEjectionPercent:                     wrapperspb.UInt32(b.cfg.OutlierMaxEjectionPercent),
			// Envoy's defaults for success-rate ejection
			// (outlier_detection.proto), written out: @grpc/grpc-js 1.14
			// merges the fields it is given over its defaults with
			// Object.assign (src/load-balancer-outlier-detection.ts,
			// OutlierDetectionLoadBalancingConfig), so an unset
			// success_rate_minimum_hosts becomes undefined, and its first
			// success-rate check throws on an empty list and kills the
			// process (test/interop TestXDSJudges caught it).
			EnforcingSuccessRate:     wrapperspb.UInt32(outlierEnforcingSuccessRate),
			SuccessRateMinimumHosts:  wrapperspb.UInt32(outlierSuccessRateMinimumHosts),
			SuccessRateRequestVolume: wrapperspb.UInt32(outlierSuccessRateRequestVolume),
			SuccessRateStdevFactor:   wrapperspb.UInt32(outlierSuccessRateStdevFactor),
		},
	}
	switch b.cfg.LBPolicy {
	case xdscontract.RingHash:
		c.LbPolicy = cluster.Cluster_RING_HASH
		c.LbConfig = &cluster.Cluster_RingHashLbConfig_{RingHashLbConfig: &cluster.Cluster_RingHashLbConfig{
			MinimumRingSize: wrapperspb.UInt64(b.cfg.RingSize),
			HashFunction:    cluster.Cluster_RingHashLbConfig_XX_HASH,
		}}
	case xdscontract.RoundRobin:
		c.LbPolicy = cluster.Cluster_ROUND_ROBIN
	default:
		// lb_policy stays unset: Envoy uses load_balancing_policy when it
		// is present.
		c.LoadBalancingPolicy = b.lbPolicy
	}
	return c, xdscontract.ValidateDeep(c)
}

// Envoy's default success-rate ejection settings (outlier_detection.proto),
// written into every Cluster so that no client fills them in its own way.
const (
	outlierEnforcingSuccessRate     = 100
	outlierSuccessRateMinimumHosts  = 5
	outlierSuccessRateRequestVolume = 100
	outlierSuccessRateStdevFactor   = 1900
)

// Extension names of the fallback entries of load_balancing_policy. Clients
// select by the type URL of typed_config; the names are for people.
const (
	roundRobinExtension  = "envoy.load_balancing_policies.round_robin"
	wrrLocalityExtension = "envoy.load_balancing_policies.wrr_locality"
)

// buildLeastRequestPolicy builds the typed load-balancing policy list
// shared by every cluster: least_request first, then
// wrr_locality{round_robin}.
//
// An xDS client takes the first entry of load_balancing_policy.policies it
// has a factory for and refuses the Cluster when it knows none (Envoy:
// cluster.proto LoadBalancingPolicy, "the first policy in the list that is
// supported"; gRPC: gRFC A52, grpc-node lb-policy-registry.ts
// convertToLoadBalancingConfig, grpc C-core xds_lb_policy_registry.cc
// ConvertXdsLbPolicyConfig). Envoy, isobar's gateway and grpc-go run
// least_request; @grpc/grpc-js-xds and C-core have no least_request and
// fall back to wrr_locality wrapping round_robin, the same tree gRFC A52
// maps the legacy ROUND_ROBIN enum to, so they keep locality weights.
// docs/interop.md lists what each client runs.
//
// Each message is validated before it is packed (ValidateAll does not look
// inside an Any), and the locality weighting that the legacy path takes
// from common_lb_config is set in least_request's locality_lb_config, where
// the typed policy reads it.
func (b *Builder) buildLeastRequestPolicy() (*cluster.LoadBalancingPolicy, error) {
	lr := &leastrequest.LeastRequest{
		ChoiceCount: wrapperspb.UInt32(b.cfg.ChoiceCount),
		LocalityLbConfig: &lbcommon.LocalityLbConfig{
			LocalityConfigSpecifier: &lbcommon.LocalityLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &lbcommon.LocalityLbConfig_LocalityWeightedLbConfig{},
			},
		},
	}
	if b.cfg.FullScan {
		lr.SelectionMethod = leastrequest.LeastRequest_FULL_SCAN
	}
	lrAny, err := packValidated(lr) // ValidateAll (deep) before packing
	if err != nil {
		return nil, err
	}
	rrAny, err := packValidated(&roundrobin.RoundRobin{})
	if err != nil {
		return nil, err
	}
	wrrAny, err := packValidated(&wrrlocality.WrrLocality{EndpointPickingPolicy: &cluster.LoadBalancingPolicy{
		Policies: []*cluster.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &core.TypedExtensionConfig{Name: roundRobinExtension, TypedConfig: rrAny},
		}},
	}})
	if err != nil {
		return nil, err
	}
	p := &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{
		{TypedExtensionConfig: &core.TypedExtensionConfig{Name: xdscontract.LeastRequestExtension, TypedConfig: lrAny}},
		{TypedExtensionConfig: &core.TypedExtensionConfig{Name: wrrLocalityExtension, TypedConfig: wrrAny}},
	}}
	return p, xdscontract.ValidateDeep(p)
}

// buildLoadAssignment builds and validates m's ClusterLoadAssignment name,
// reusing e's memoised endpoint pieces.
//
// Validation is ValidateAll applied piece by piece, which gives the same
// verdict as ValidateAll on the whole assignment because protoc-gen-validate
// rules are per message: each message's own fields are checked before its
// children are attached, and each child (endpoint address, metadata) was
// checked when first built. An unchanged endpoint reuses its LbEndpoint, so a
// weight change costs one small message. The assignment holds no Any (a test
// checks), so nothing is packed unseen.
func (b *Builder) buildLoadAssignment(name string, m *canonModel, e *modelEntry) (*endpoint.ClusterLoadAssignment, error) {
	wrap := func(err error) error {
		return fmt.Errorf("%w: ClusterLoadAssignment %q: %w", xdscontract.ErrInvalidResource, name, err)
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
	pos := slices.Grow(e.posSpare[:0], len(m.localities))[:len(m.localities)]
	for i := range m.localities {
		l := &m.localities[i]
		ll := &endpoint.LocalityLbEndpoints{
			Locality:            &core.Locality{Region: l.Region, Zone: l.Zone},
			LoadBalancingWeight: wrapperspb.UInt32(l.Weight),
			Priority:            l.Priority,
		}
		if fields := rttFields(l.RTT.Microseconds(), l.Jitter.Microseconds(), nil); fields != nil {
			ll.Metadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: {Fields: fields}}}
		}
		if err := ll.ValidateAll(); err != nil {
			return nil, wrap(err)
		}
		lbs := make([]*endpoint.LbEndpoint, len(l.Endpoints))
		pos[i] = slices.Grow(pos[i][:0], len(l.Endpoints))[:len(l.Endpoints)]
		for j := range l.Endpoints {
			p, first, err := e.partsAt(i, j, &l.Endpoints[j])
			if err != nil {
				return nil, wrap(err)
			}
			if first {
				used++
			}
			keepwrite.Set(&pos[i][j], p) // the build before last's: mostly the same parts
			lbs[j] = p.lb
		}
		ll.LbEndpoints = lbs
		localities[i] = ll
	}
	cla.Endpoints = localities
	e.pos, e.posSpare = pos, e.pos
	if len(e.parts) > used {
		e.forgetUnused(used)
	}
	return cla, nil
}

// forgetUnused drops the parts this build did not use, of which it used
// used. After a build the map holds exactly the parts that build used, so
// the unused ones are found among the previous build's positions (now
// posSpare), which costs a slice, not a walk of a map of 10,000 entries;
// the walk stays for what that misses (parts made by a build that then
// failed).
func (e *modelEntry) forgetUnused(used int) {
	for _, ps := range e.posSpare {
		for _, p := range ps {
			if p.gen != e.gen {
				delete(e.parts, p.key)
			}
		}
	}
	if len(e.parts) == used {
		return
	}
	for k, p := range e.parts {
		if p.gen != e.gen {
			delete(e.parts, k)
		}
	}
}

// partsAt returns the parts of endpoint j of locality i: those of
// the same position in the previous build when the endpoint is unchanged
// (see prevAt), else those of an equal endpoint elsewhere, else new ones;
// its LbEndpoints are brought up to ep's weights and health. first
// reports the parts' first use in this generation. Called for j = 0, 1,
// ... of each locality in turn.
func (e *modelEntry) partsAt(i, j int, ep *Endpoint) (p *endpointParts, first bool, err error) {
	k := endpointKey{cell: ep.CellID, host: ep.Host, port: ep.Port, maxModelLen: ep.MaxModelLen, probeBudget: ep.ProbeBudget,
		maxNumSeqs: ep.MaxNumSeqs, prefillRate: ep.PrefillTokensPerSecond, rttUS: ep.RTT.Microseconds(), jitterUS: ep.Jitter.Microseconds()}
	if p = e.prevAt(i, j, &k); p == nil {
		p = e.parts[k]
	}
	if p == nil {
		if p, err = newEndpointParts(k); err != nil {
			return nil, false, err
		}
		e.parts[k] = p
	}
	if p.gen != e.gen {
		p.gen = e.gen
		first = true
	}
	health := core.HealthStatus_UNKNOWN
	if ep.Degraded {
		health = core.HealthStatus_DEGRADED
	}
	// The messages are stored only when they changed (keepwrite): most
	// endpoints keep theirs from build to build.
	want := lbAs{ep.Weight, health}
	lb, err := p.lbEndpoint(p.lb, p.lbAs, want)
	if err != nil {
		return nil, false, err
	}
	keepwrite.Set(&p.lb, lb)
	p.lbAs = want
	if cw := ep.ClassWeight; cw != 0 && cw != ep.Weight {
		want.weight = cw
		if lb, err = p.lbEndpoint(p.classLB, p.classAs, want); err != nil {
			return nil, false, err
		}
		keepwrite.Set(&p.classLB, lb)
		p.classAs = want
	} else {
		keepwrite.Set(&p.classLB, nil)
	}
	return p, first, nil
}

// prevAt returns the previous build's parts of endpoint k, at position j
// of locality i, when they stand where an endpoint leaving or joining the
// locality put them: at j plus the shift so far, or one further either
// way (an endpoint removed or added before j, which then moves the shift).
// Endpoints are sorted, so one cell leaving the load balancer shifts every
// later one: without following the shift, every endpoint after it was a
// map lookup (at 10,000 cells, the push's largest cost). nil: not found
// so (the caller looks in the map).
func (e *modelEntry) prevAt(i, j int, k *endpointKey) *endpointParts {
	if j == 0 {
		e.walk = shiftWalk{}
	}
	if i >= len(e.pos) {
		return nil
	}
	prev := e.pos[i]
	if x := e.walk.find(j, len(prev), func(x int) bool { return prev[x].key == *k }); x >= 0 {
		return prev[x]
	}
	return nil
}

// shiftWalk finds, walking a new sorted list in order, each element's
// place in the last version of the list when elements were only added or
// removed here and there: at its position plus the shift so far (ahead by
// the elements removed before it, behind by those added), or one further
// either way, which then moves the shift. The Builder's endpoint memo
// (prevAt) and the LEDS diff (diffShifted) walk so. The zero value starts
// a walk.
type shiftWalk struct{ shift int }

// find returns the index x in the last list (of length n) of the new
// list's element j, the first of j+shift, j+shift+1 and j+shift−1 in
// [0, n) for which same(x) holds; -1 when none does.
func (w *shiftWalk) find(j, n int, same func(x int) bool) int {
	for _, d := range [3]int{0, 1, -1} {
		if x := j + w.shift + d; x >= 0 && x < n && same(x) {
			w.shift += d
			return x
		}
	}
	return -1
}

// lbEndpoint returns prev when it already carries want (was: what prev
// carries), else a new validated LbEndpoint of p's host and metadata
// carrying want.
func (p *endpointParts) lbEndpoint(prev *endpoint.LbEndpoint, was, want lbAs) (*endpoint.LbEndpoint, error) {
	if prev != nil && was == want {
		return prev, nil
	}
	lb := &endpoint.LbEndpoint{LoadBalancingWeight: wrapperspb.UInt32(want.weight), HealthStatus: want.health}
	if err := lb.ValidateAll(); err != nil {
		return nil, err
	}
	lb.HostIdentifier, lb.Metadata = p.host, p.metadata
	return lb, nil
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
	fields := make(map[string]*structpb.Value, 7)
	fields[xdscontract.MetadataCell] = structpb.NewStringValue(k.cell)
	if k.maxModelLen > 0 {
		fields[xdscontract.MetadataMaxModelLen] = structpb.NewNumberValue(float64(k.maxModelLen))
	}
	if k.probeBudget > 0 {
		fields[xdscontract.MetadataProbeBudget] = structpb.NewNumberValue(float64(k.probeBudget))
	}
	if k.prefillRate > 0 {
		fields[xdscontract.MetadataPrefillRate] = structpb.NewNumberValue(k.prefillRate)
	}
	if k.maxNumSeqs > 0 {
		fields[xdscontract.MetadataMaxNumSeqs] = structpb.NewNumberValue(float64(k.maxNumSeqs))
	}
	rttFields(k.rttUS, k.jitterUS, fields)
	md := &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: {Fields: fields}}}
	if err := md.ValidateAll(); err != nil {
		return nil, err
	}
	return &endpointParts{key: k, host: &endpoint.LbEndpoint_Endpoint{Endpoint: host}, metadata: md}, nil
}

// rttFields writes xdscontract.MetadataRTT and xdscontract.MetadataJitter, in
// milliseconds, into fields (a new map when nil), each when known (above 0),
// and returns fields: nil when nothing was written to a nil map.
func rttFields(rttUS, jitterUS int64, fields map[string]*structpb.Value) map[string]*structpb.Value {
	for _, f := range []struct {
		key string
		us  int64
	}{{xdscontract.MetadataRTT, rttUS}, {xdscontract.MetadataJitter, jitterUS}} {
		if f.us <= 0 {
			continue
		}
		if fields == nil {
			fields = make(map[string]*structpb.Value, 2)
		}
		fields[f.key] = structpb.NewNumberValue(float64(f.us) / 1e3)
	}
	return fields
}

// packValidated validates m, including every Any inside it, then packs it.
func packValidated(m proto.Message) (*anypb.Any, error) {
	if err := xdscontract.ValidateDeep(m); err != nil {
		return nil, err
	}
	a, err := anypb.New(m)
	if err != nil {
		return nil, fmt.Errorf("%w: pack %s: %w", xdscontract.ErrInvalidResource, m.ProtoReflect().Descriptor().FullName(), err)
	}
	return a, nil
}
