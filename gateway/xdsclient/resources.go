//lint:file-ignore SA1019 A data plane honours the deprecated matchers and fields a control plane may still send.

package xdsclient

import (
	"fmt"

	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	lbcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequest "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	randomlb "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/random/v3"
	roundrobin "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	previoushosts "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// Envoy's defaults for fields the control plane may leave unset.
const (
	defaultConnectTimeout     = 5 * time.Second
	defaultRouteTimeout       = 15 * time.Second
	defaultMaxRequests        = 1024
	defaultMaxRetries         = 3
	defaultBudgetPercent      = 20
	defaultBudgetMin          = 3
	defaultChoiceCount        = 2
	defaultRetryBase          = 25 * time.Millisecond
	defaultOutlier5xx         = 5
	defaultOutlierLocalOrigin = 5 // Envoy's consecutive_local_origin_failure default
	defaultOutlierInterval    = 10 * time.Second
	defaultOutlierBase        = 30 * time.Second
	defaultOutlierMaxPercent  = 10
	defaultOutlierMaxTime     = 300 * time.Second
	previousHostsName         = "envoy.retry_host_predicates.previous_hosts"
	maxResources              = 100000
	maxRegexLen               = 1024
	maxHostSelectionRetries   = 16 // bounds the redraws of one pick
)

// ClusterPolicy is what the gateway honours of a Cluster, Envoy's defaults
// applied.
type ClusterPolicy struct {
	Name string
	// ServiceName is the ClusterLoadAssignment name (EDS service name).
	ServiceName string
	// LBPolicy is the policy the gateway honours in LBXDS mode, named as
	// Envoy's lb_policy enum: LEAST_REQUEST, ROUND_ROBIN or RANDOM, from
	// the typed load_balancing_policy (the first of its policies the
	// gateway knows, as Envoy takes the first it supports) or else the
	// legacy lb_policy. A policy the gateway does not know (RING_HASH,
	// MAGLEV, CLUSTER_PROVIDED, another typed extension) falls back to
	// Envoy's default, ROUND_ROBIN, and LBFallbackFrom names it.
	LBPolicy string
	// LBFallbackFrom names the pushed policy replaced by ROUND_ROBIN ("" when
	// the pushed policy is honoured).
	LBFallbackFrom string
	// LocalityWeighted: locality weights apply (locality_weighted_lb_config
	// in common_lb_config or in the typed policy's locality_lb_config).
	LocalityWeighted bool
	// ChoiceCount, FullScan and ActiveRequestBias are LEAST_REQUEST's
	// parameters (FullScan: selection_method FULL_SCAN, or the deprecated
	// enable_full_scan, in the typed LeastRequest).
	ChoiceCount       uint32
	FullScan          bool
	ActiveRequestBias float64
	ConnectTimeout    time.Duration
	// MaxRequests is the circuit breaker on concurrent upstream requests;
	// above it requests fail with 503 at once.
	MaxRequests uint32
	// MaxRetries caps concurrent retries when there is no RetryBudget.
	MaxRetries uint32
	// RetryBudget, when set, caps concurrent retries at max(Percent % of
	// active requests, MinConcurrency).
	RetryBudget *RetryBudget
	// Outlier, when set, enables passive ejection on consecutive 5xx.
	Outlier *OutlierPolicy
	// Residency names the residency set of a pinned cluster
	// (xdscontract.PinnedClusterName), from its metadata
	// filter_metadata["isobar"]["residency"]; "" for any other cluster.
	Residency string
	// AllowedRegions are the regions a pinned cluster's requests may be
	// served in (filter_metadata["isobar"]["allowed_regions"]), sorted and
	// distinct; empty for a pinned cluster means none (a request of the
	// set is answered 503 naming it), and nil for an unpinned cluster.
	// The gateway never picks an endpoint outside them for the cluster's
	// requests.
	AllowedRegions []string
}

// RetryBudget is a cluster's retry budget.
type RetryBudget struct {
	Percent        float64
	MinConcurrency uint32
}

// OutlierPolicy is the part of a cluster's outlier detection the gateway
// enforces: consecutive 5xx (including connect failures, resets and
// timeouts, as Envoy counts them without split_external_local_origin_errors).
type OutlierPolicy struct {
	Consecutive5xx uint32
	Enforcing5xx   uint32 // percent
	// SplitLocalOrigin: with split_external_local_origin_errors, failures
	// of local origin (connect failures, resets, timeouts) are counted
	// apart from upstream 5xx and eject after ConsecutiveLocalOrigin
	// (Envoy's default 5), enforced EnforcingLocalOrigin percent of the
	// time.
	SplitLocalOrigin       bool
	ConsecutiveLocalOrigin uint32
	EnforcingLocalOrigin   uint32 // percent
	Interval               time.Duration
	BaseEjectionTime       time.Duration
	MaxEjectionTime        time.Duration
	MaxEjectionPercent     uint32
}

// RouteConfig is a decoded RouteConfiguration.
type RouteConfig struct {
	Name         string
	VirtualHosts []VirtualHost
	// InternalOnlyHeaders are the headers Envoy removes from requests it
	// finds external (internal_only_headers, lower case); the gateway
	// removes them from every request not proven to come from an isobar
	// gateway (hop.go).
	InternalOnlyHeaders []string
}

// VirtualHost is a decoded virtual host.
type VirtualHost struct {
	Name    string
	Domains []string
	Routes  []Route
}

// Route is a decoded route: its match, its cluster and the policies the
// gateway honours.
type Route struct {
	Name    string
	Cluster string
	// Model is the value the route's exact ModelHeader matcher requires, or
	// "" (catch-all routes).
	Model string
	// Timeout bounds the whole request, retries and streaming included; 0
	// means none.
	Timeout time.Duration
	Retry   RetryPolicy
	// AbortStatus and AbortPerMillion are the route's fault abort: that
	// share of requests (parts per million) gets AbortStatus. 0: none.
	AbortStatus     int
	AbortPerMillion uint32

	match routeMatch
}

// RetryPolicy is a decoded retry policy.
type RetryPolicy struct {
	NumRetries uint32
	// On: which failures are retried.
	ConnectFailure, Reset, RefusedStream, Any5xx, GatewayError bool
	// StatusCodes are retried when retriable-status-codes is on.
	StatusCodes []uint32
	// PreviousHosts: a retry avoids the endpoints already tried.
	PreviousHosts bool
	// PerTryTimeout bounds one attempt until its response headers; 0 none.
	PerTryTimeout time.Duration
	// BackoffBase and BackoffMax: a retry waits a random time in [0,
	// min(BackoffMax, BackoffBase·2^(n-1))).
	BackoffBase, BackoffMax time.Duration
	// HostSelectionRetries is host_selection_retry_max_attempts: how many
	// times a pick the retry host predicate rejects is drawn again
	// (Envoy's default 1).
	HostSelectionRetries uint32
}

// Decoder turns xDS resources into the gateway's types. Every error wraps
// ErrInvalidResource. It holds only its configuration: safe for concurrent
// use.
type Decoder struct {
	// ModelHeader is the request header naming the model (lower case): a
	// route's exact matcher on it gives Route.Model.
	ModelHeader string
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidResource}, args...)...)
}

// unpack unmarshals a into m (of the expected type) and validates it deeply.
func unpack(a *anypb.Any, m proto.Message) error {
	if err := a.UnmarshalTo(m); err != nil {
		return invalid("%s: %v", a.GetTypeUrl(), err)
	}
	if err := xdscontract.ValidateDeep(m); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidResource, err)
	}
	return nil
}

func durationOr(d interface{ AsDuration() time.Duration }, isNil bool, def time.Duration) time.Duration {
	if isNil {
		return def
	}
	return d.AsDuration()
}

// DecodeClusters decodes a CDS response. Names must be unique.
func (d *Decoder) DecodeClusters(rs []*anypb.Any) (map[string]*ClusterPolicy, error) {
	if len(rs) > maxResources {
		return nil, invalid("%d clusters, above %d", len(rs), maxResources)
	}
	out := make(map[string]*ClusterPolicy, len(rs))
	for _, a := range rs {
		var c cluster.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			return nil, invalid("%s: %v", a.GetTypeUrl(), err)
		}
		// The typed LB policy may name extensions the gateway does not
		// link (and so cannot unpack): it is validated apart, and each
		// policy the gateway knows in full by decodeLBPolicy.
		lbp := c.GetLoadBalancingPolicy()
		c.LoadBalancingPolicy = nil
		if err := xdscontract.ValidateDeep(&c); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidResource, err)
		}
		if err := lbp.ValidateAll(); lbp != nil && err != nil {
			return nil, invalid("cluster %q: load_balancing_policy: %v", c.GetName(), err)
		}
		c.LoadBalancingPolicy = lbp
		p, err := decodeCluster(&c)
		if err != nil {
			return nil, err
		}
		if _, dup := out[p.Name]; dup {
			return nil, invalid("cluster %q listed twice", p.Name)
		}
		out[p.Name] = p
	}
	return out, nil
}

func decodeCluster(c *cluster.Cluster) (*ClusterPolicy, error) {
	name := c.GetName()
	if c.GetType() != cluster.Cluster_EDS {
		return nil, invalid("cluster %q: discovery type %v; the gateway serves EDS clusters only", name, c.GetType())
	}
	p := &ClusterPolicy{
		Name:              name,
		ServiceName:       c.GetEdsClusterConfig().GetServiceName(),
		LBPolicy:          c.GetLbPolicy().String(),
		LocalityWeighted:  c.GetCommonLbConfig().GetLocalityWeightedLbConfig() != nil,
		ChoiceCount:       defaultChoiceCount,
		ActiveRequestBias: 1,
		ConnectTimeout:    durationOr(c.GetConnectTimeout(), c.GetConnectTimeout() == nil, defaultConnectTimeout),
		MaxRequests:       defaultMaxRequests,
		MaxRetries:        defaultMaxRetries,
	}
	if p.ServiceName == "" {
		p.ServiceName = name
	}
	if lbp := c.GetLoadBalancingPolicy(); lbp != nil {
		if err := decodeLBPolicy(p, lbp); err != nil {
			return nil, invalid("cluster %q: load_balancing_policy: %v", name, err)
		}
	} else {
		switch c.GetLbPolicy() {
		case cluster.Cluster_LEAST_REQUEST, cluster.Cluster_ROUND_ROBIN, cluster.Cluster_RANDOM:
		default:
			p.LBPolicy, p.LBFallbackFrom = LBRoundRobin, c.GetLbPolicy().String()
		}
		if lr := c.GetLeastRequestLbConfig(); lr != nil {
			if v := lr.GetChoiceCount(); v != nil {
				p.ChoiceCount = v.GetValue()
			}
			if b := lr.GetActiveRequestBias(); b != nil {
				p.ActiveRequestBias = b.GetDefaultValue()
			}
		}
	}
	if p.ChoiceCount < 2 {
		return nil, invalid("cluster %q: choice_count %d below 2", name, p.ChoiceCount)
	}
	if !(p.ActiveRequestBias >= 0) || p.ActiveRequestBias > 100 {
		return nil, invalid("cluster %q: active_request_bias %v out of [0, 100]", name, p.ActiveRequestBias)
	}
	if p.ConnectTimeout <= 0 {
		return nil, invalid("cluster %q: connect_timeout %v must be positive", name, p.ConnectTimeout)
	}
	decodeCircuitBreakers(p, c.GetCircuitBreakers())
	var err error
	if p.Residency, p.AllowedRegions, err = residencyMetadata(c.GetMetadata()); err != nil {
		return nil, invalid("cluster %q: %v", name, err)
	}
	if od := c.GetOutlierDetection(); od != nil {
		if err := decodeOutlier(p, od); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// decodeCircuitBreakers takes the DEFAULT priority's thresholds into p:
// max_requests, max_retries and the retry budget.
func decodeCircuitBreakers(p *ClusterPolicy, cbs *cluster.CircuitBreakers) {
	for _, th := range cbs.GetThresholds() {
		if th.GetPriority() != core.RoutingPriority_DEFAULT {
			continue
		}
		if v := th.GetMaxRequests(); v != nil {
			p.MaxRequests = v.GetValue()
		}
		if v := th.GetMaxRetries(); v != nil {
			p.MaxRetries = v.GetValue()
		}
		if rb := th.GetRetryBudget(); rb != nil {
			b := &RetryBudget{Percent: defaultBudgetPercent, MinConcurrency: defaultBudgetMin}
			if v := rb.GetBudgetPercent(); v != nil {
				b.Percent = v.GetValue()
			}
			if v := rb.GetMinRetryConcurrency(); v != nil {
				b.MinConcurrency = v.GetValue()
			}
			p.RetryBudget = b
		}
	}
}

// decodeOutlier takes the outlier detection into p, Envoy's defaults for
// what is unset; inconsistent times are refused.
func decodeOutlier(p *ClusterPolicy, od *cluster.OutlierDetection) error {
	name := p.Name
	o := &OutlierPolicy{
		Consecutive5xx:     defaultOutlier5xx,
		Enforcing5xx:       100,
		Interval:           durationOr(od.GetInterval(), od.GetInterval() == nil, defaultOutlierInterval),
		BaseEjectionTime:   durationOr(od.GetBaseEjectionTime(), od.GetBaseEjectionTime() == nil, defaultOutlierBase),
		MaxEjectionTime:    durationOr(od.GetMaxEjectionTime(), od.GetMaxEjectionTime() == nil, defaultOutlierMaxTime),
		MaxEjectionPercent: defaultOutlierMaxPercent,
	}
	if v := od.GetConsecutive_5Xx(); v != nil {
		o.Consecutive5xx = v.GetValue()
	}
	if v := od.GetEnforcingConsecutive_5Xx(); v != nil {
		o.Enforcing5xx = v.GetValue()
	}
	if v := od.GetMaxEjectionPercent(); v != nil {
		o.MaxEjectionPercent = v.GetValue()
	}
	o.SplitLocalOrigin = od.GetSplitExternalLocalOriginErrors()
	o.ConsecutiveLocalOrigin, o.EnforcingLocalOrigin = defaultOutlierLocalOrigin, 100
	if v := od.GetConsecutiveLocalOriginFailure(); v != nil {
		o.ConsecutiveLocalOrigin = v.GetValue()
	}
	if v := od.GetEnforcingConsecutiveLocalOriginFailure(); v != nil {
		o.EnforcingLocalOrigin = v.GetValue()
	}
	if o.BaseEjectionTime <= 0 || o.MaxEjectionTime < o.BaseEjectionTime || o.Interval <= 0 {
		return invalid("cluster %q: outlier detection times interval %v base %v max %v are inconsistent",
			name, o.Interval, o.BaseEjectionTime, o.MaxEjectionTime)
	}
	p.Outlier = o
	return nil
}

// Envoy's lb_policy names, as ClusterPolicy.LBPolicy holds them.
const (
	LBRoundRobin   = "ROUND_ROBIN"
	LBLeastRequest = "LEAST_REQUEST"
	LBRandom       = "RANDOM"
)

// decodeLBPolicy applies a cluster's typed load_balancing_policy to p:
// the first policy of the list the gateway knows, as Envoy takes the first
// it has a factory for (cluster_factory_impl / upstream_impl's
// load_balancing_policy loop). None known: Envoy's default ROUND_ROBIN,
// with LBFallbackFrom naming what was pushed. A known policy with a
// setting the gateway cannot honour (slow start) is an error.
func decodeLBPolicy(p *ClusterPolicy, lbp *cluster.LoadBalancingPolicy) error {
	var names []string
	for _, pol := range lbp.GetPolicies() {
		tc := pol.GetTypedExtensionConfig()
		a := tc.GetTypedConfig()
		var locality *lbcommon.LocalityLbConfig
		switch {
		case a.MessageIs(&roundrobin.RoundRobin{}):
			var m roundrobin.RoundRobin
			if err := unpack(a, &m); err != nil {
				return err
			}
			if m.GetSlowStartConfig() != nil {
				return fmt.Errorf("%s: slow_start_config is not supported", tc.GetName())
			}
			p.LBPolicy, locality = LBRoundRobin, m.GetLocalityLbConfig()
		case a.MessageIs(&leastrequest.LeastRequest{}):
			var m leastrequest.LeastRequest
			if err := unpack(a, &m); err != nil {
				return err
			}
			if m.GetSlowStartConfig() != nil {
				return fmt.Errorf("%s: slow_start_config is not supported", tc.GetName())
			}
			p.LBPolicy, locality = LBLeastRequest, m.GetLocalityLbConfig()
			if v := m.GetChoiceCount(); v != nil {
				p.ChoiceCount = v.GetValue()
			}
			if b := m.GetActiveRequestBias(); b != nil {
				p.ActiveRequestBias = b.GetDefaultValue()
			}
			// least_request_lb.cc: FULL_SCAN, or the deprecated
			// enable_full_scan, scans every host.
			p.FullScan = m.GetSelectionMethod() == leastrequest.LeastRequest_FULL_SCAN || m.GetEnableFullScan().GetValue()
		case a.MessageIs(&randomlb.Random{}):
			var m randomlb.Random
			if err := unpack(a, &m); err != nil {
				return err
			}
			p.LBPolicy, locality = LBRandom, m.GetLocalityLbConfig()
		default:
			names = append(names, tc.GetName()+" ("+strings.TrimPrefix(a.GetTypeUrl(), "type.googleapis.com/")+")")
			continue
		}
		if locality.GetLocalityWeightedLbConfig() != nil {
			p.LocalityWeighted = true
		}
		return nil
	}
	p.LBPolicy, p.LBFallbackFrom = LBRoundRobin, strings.Join(names, ", ")
	return nil
}

// DecodeAssignments decodes an EDS response to endpoints by assignment
// (cluster) name, in locality order (priority, then input order).
// Endpoints whose health status is unhealthy, draining or timed out are
// left out.
func DecodeAssignments(rs []*anypb.Any) (map[string][]Endpoint, error) {
	if len(rs) > maxResources {
		return nil, invalid("%d assignments, above %d", len(rs), maxResources)
	}
	out := make(map[string][]Endpoint, len(rs))
	for _, a := range rs {
		var cla endpoint.ClusterLoadAssignment
		if err := unpack(a, &cla); err != nil {
			return nil, err
		}
		name := cla.GetClusterName()
		if _, dup := out[name]; dup {
			return nil, invalid("ClusterLoadAssignment %q listed twice", name)
		}
		eps, err := decodeAssignment(&cla)
		if err != nil {
			return nil, err
		}
		out[name] = eps
	}
	return out, nil
}

func decodeAssignment(cla *endpoint.ClusterLoadAssignment) ([]Endpoint, error) {
	name := cla.GetClusterName()
	var eps []Endpoint
	locs := slices.Clone(cla.GetEndpoints())
	slices.SortStableFunc(locs, func(a, b *endpoint.LocalityLbEndpoints) int { return int(a.GetPriority()) - int(b.GetPriority()) })
	for _, loc := range locs {
		if loc.GetLoadBalancerEndpoints() != nil {
			return nil, invalid("ClusterLoadAssignment %q: locality with load_balancer_endpoints is not supported", name)
		}
		for _, lb := range loc.GetLbEndpoints() {
			switch lb.GetHealthStatus() {
			case core.HealthStatus_UNHEALTHY, core.HealthStatus_DRAINING, core.HealthStatus_TIMEOUT:
				continue
			}
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			if sa == nil {
				return nil, invalid("ClusterLoadAssignment %q: endpoint without a socket address", name)
			}
			addr, err := netip.ParseAddr(sa.GetAddress())
			if err != nil || addr.Zone() != "" {
				return nil, invalid("ClusterLoadAssignment %q: endpoint address %q is not an IP address", name, sa.GetAddress())
			}
			port := sa.GetPortValue()
			if port == 0 || port > 65535 {
				return nil, invalid("ClusterLoadAssignment %q: endpoint %s: port %d out of range (named ports are not supported)", name, addr, port)
			}
			cell, maxLen := xdscontract.EndpointMetadata(lb.GetMetadata())
			place := placementMetadata(lb.GetMetadata(), loc.GetMetadata())
			e := Endpoint{
				Cell:           cell,
				Address:        net.JoinHostPort(addr.Unmap().String(), strconv.FormatUint(uint64(port), 10)),
				Weight:         lb.GetLoadBalancingWeight().GetValue(),
				Region:         loc.GetLocality().GetRegion(),
				Zone:           loc.GetLocality().GetZone(),
				SubZone:        loc.GetLocality().GetSubZone(),
				LocalityWeight: loc.GetLoadBalancingWeight().GetValue(),
				Priority:       loc.GetPriority(),
				MaxModelLen:    maxLen,
				ProbeBudget:    probeBudget(lb.GetMetadata()),
				Degraded:       lb.GetHealthStatus() == core.HealthStatus_DEGRADED,

				PrefillTokensPerSecond: place.prefillRate,
				MaxNumSeqs:             place.maxNumSeqs,
				RTT:                    place.rtt,
				Jitter:                 place.jitter,
			}
			if e.Weight == 0 {
				e.Weight = 1 // Envoy's default
			}
			eps = append(eps, e)
		}
	}
	return eps, nil
}

// DecodeRoutes decodes an RDS response by RouteConfiguration name.
func (d *Decoder) DecodeRoutes(rs []*anypb.Any) (map[string]*RouteConfig, error) {
	if len(rs) > maxResources {
		return nil, invalid("%d route configurations, above %d", len(rs), maxResources)
	}
	out := make(map[string]*RouteConfig, len(rs))
	for _, a := range rs {
		var rc route.RouteConfiguration
		if err := unpack(a, &rc); err != nil {
			return nil, err
		}
		c, err := d.decodeRouteConfig(&rc)
		if err != nil {
			return nil, err
		}
		if _, dup := out[c.Name]; dup {
			return nil, invalid("RouteConfiguration %q listed twice", c.Name)
		}
		out[c.Name] = c
	}
	return out, nil
}

func (d *Decoder) decodeRouteConfig(rc *route.RouteConfiguration) (*RouteConfig, error) {
	out := &RouteConfig{Name: rc.GetName()}
	for _, h := range rc.GetInternalOnlyHeaders() {
		out.InternalOnlyHeaders = append(out.InternalOnlyHeaders, strings.ToLower(h))
	}
	rcFault, err := decodeFault(rc.GetTypedPerFilterConfig())
	if err != nil {
		return nil, invalid("RouteConfiguration %q: %v", rc.GetName(), err)
	}
	for _, vh := range rc.GetVirtualHosts() {
		v := VirtualHost{Name: vh.GetName(), Domains: slices.Clone(vh.GetDomains())}
		for i, dom := range v.Domains {
			v.Domains[i] = strings.ToLower(dom)
		}
		vhFault, err := decodeFault(vh.GetTypedPerFilterConfig())
		if err != nil {
			return nil, invalid("virtual host %q: %v", vh.GetName(), err)
		}
		if vhFault == nil {
			vhFault = rcFault
		}
		for i, r := range vh.GetRoutes() {
			dr, err := d.decodeRoute(r, vh.GetRetryPolicy(), vhFault)
			if err != nil {
				return nil, invalid("virtual host %q route #%d %q: %v", vh.GetName(), i, r.GetName(), err)
			}
			v.Routes = append(v.Routes, dr)
		}
		out.VirtualHosts = append(out.VirtualHosts, v)
	}
	return out, nil
}

// abortFault is a decoded fault abort.
type abortFault struct {
	status     int
	perMillion uint32
}

// decodeFault reads the fault filter's entry of a typed_per_filter_config.
func decodeFault(cfgs map[string]*anypb.Any) (*abortFault, error) {
	a := cfgs[wellknown.Fault]
	if a == nil {
		return nil, nil
	}
	var f fault.HTTPFault
	if err := a.UnmarshalTo(&f); err != nil {
		return nil, fmt.Errorf("fault filter config: %v", err)
	}
	if f.GetDelay() != nil || f.GetResponseRateLimit() != nil || len(f.GetHeaders()) > 0 || len(f.GetDownstreamNodes()) > 0 ||
		f.GetUpstreamCluster() != "" {
		return nil, fmt.Errorf("fault filter: only an unconditional abort is supported")
	}
	ab := f.GetAbort()
	if ab == nil {
		return &abortFault{}, nil // overrides a less specific fault with none
	}
	st, ok := ab.GetErrorType().(*fault.FaultAbort_HttpStatus)
	if !ok {
		return nil, fmt.Errorf("fault abort: only http_status is supported")
	}
	if st.HttpStatus < 200 || st.HttpStatus > 599 {
		return nil, fmt.Errorf("fault abort status %d out of range", st.HttpStatus)
	}
	return &abortFault{status: int(st.HttpStatus), perMillion: perMillion(ab.GetPercentage())}, nil
}

// perMillion converts a FractionalPercent to parts per million (nil: 0, as
// Envoy's abort percentage defaults to 0).
func perMillion(p *typev3.FractionalPercent) uint32 {
	if p == nil {
		return 0
	}
	n := uint64(p.GetNumerator())
	switch p.GetDenominator() {
	case typev3.FractionalPercent_HUNDRED:
		n *= 10000
	case typev3.FractionalPercent_TEN_THOUSAND:
		n *= 100
	}
	return uint32(min(n, 1_000_000))
}

func (d *Decoder) decodeRoute(r *route.Route, vhRetry *route.RetryPolicy, vhFault *abortFault) (Route, error) {
	out := Route{Name: r.GetName()}
	act, ok := r.GetAction().(*route.Route_Route)
	if !ok {
		return out, fmt.Errorf("action %T is not supported; only route actions to a cluster", r.GetAction())
	}
	c, ok := act.Route.GetClusterSpecifier().(*route.RouteAction_Cluster)
	if !ok {
		return out, fmt.Errorf("cluster specifier %T is not supported; name one cluster", act.Route.GetClusterSpecifier())
	}
	out.Cluster = c.Cluster
	out.Timeout = durationOr(act.Route.GetTimeout(), act.Route.GetTimeout() == nil, defaultRouteTimeout)
	rp := act.Route.GetRetryPolicy()
	if rp == nil {
		rp = vhRetry
	}
	if rp != nil {
		var err error
		if out.Retry, err = decodeRetry(rp); err != nil {
			return out, err
		}
	}
	f, err := decodeFault(r.GetTypedPerFilterConfig())
	if err != nil {
		return out, err
	}
	if f == nil {
		f = vhFault
	}
	if f != nil {
		out.AbortStatus, out.AbortPerMillion = f.status, f.perMillion
	}
	if out.match, err = compileMatch(r.GetMatch()); err != nil {
		return out, err
	}
	for _, h := range out.match.headers {
		if h.name == d.ModelHeader && h.kind == matchExact && !h.invert && !h.ignoreCase {
			out.Model = h.value
		}
	}
	return out, nil
}

func decodeRetry(rp *route.RetryPolicy) (RetryPolicy, error) {
	p := RetryPolicy{NumRetries: 1, BackoffBase: defaultRetryBase, HostSelectionRetries: 1}
	for _, tok := range strings.Split(rp.GetRetryOn(), ",") {
		switch strings.TrimSpace(tok) {
		case "connect-failure":
			p.ConnectFailure = true
		case "reset", "reset-before-request":
			p.Reset = true
		case "refused-stream":
			p.RefusedStream = true
		case "5xx":
			p.Any5xx = true
		case "gateway-error":
			p.GatewayError = true
		case "retriable-status-codes":
			p.StatusCodes = slices.Clone(rp.GetRetriableStatusCodes())
		}
	}
	if v := rp.GetNumRetries(); v != nil {
		p.NumRetries = v.GetValue()
	}
	if p.NumRetries > 10 {
		return p, fmt.Errorf("num_retries %d above 10 is not supported", p.NumRetries)
	}
	if n := rp.GetHostSelectionRetryMaxAttempts(); n != 0 {
		p.HostSelectionRetries = uint32(min(max(n, 0), maxHostSelectionRetries))
	}
	if t := rp.GetPerTryTimeout(); t != nil {
		p.PerTryTimeout = t.AsDuration()
	}
	if bo := rp.GetRetryBackOff(); bo != nil {
		p.BackoffBase = bo.GetBaseInterval().AsDuration()
		if bo.GetMaxInterval() != nil {
			p.BackoffMax = bo.GetMaxInterval().AsDuration()
		}
	}
	if p.BackoffMax == 0 {
		p.BackoffMax = 10 * p.BackoffBase
	}
	if p.BackoffBase <= 0 || p.BackoffMax < p.BackoffBase {
		return p, fmt.Errorf("retry back-off base %v max %v are inconsistent", p.BackoffBase, p.BackoffMax)
	}
	for _, hp := range rp.GetRetryHostPredicate() {
		if hp.GetName() == previousHostsName || hp.GetTypedConfig().MessageIs(&previoushosts.PreviousHostsPredicate{}) {
			p.PreviousHosts = true
		}
	}
	return p, nil
}

// matchKind is the kind of a compiled string matcher.
type matchKind uint8

const (
	matchExact matchKind = iota
	matchPrefix
	matchSuffix
	matchContains
	matchRegex
	matchPresent
	matchRange
)

// headerMatcher is a compiled Envoy HeaderMatcher.
type headerMatcher struct {
	name                string // lower case; pseudo-headers ":path", ":method", ":authority", ":scheme"
	kind                matchKind
	value               string
	ignoreCase          bool
	re                  *regexp.Regexp
	present             bool
	start, end          int64
	invert              bool
	treatMissingAsEmpty bool
}

// pathMatcher is a compiled path specifier.
type pathMatcher struct {
	kind          matchKind // matchPrefix, matchExact, matchRegex; sepPrefix uses matchPrefix with sep
	value         string
	sep           bool
	re            *regexp.Regexp
	caseSensitive bool
}

type routeMatch struct {
	path    pathMatcher
	headers []headerMatcher
}

func compileRegex(m *matcher.RegexMatcher) (*regexp.Regexp, error) {
	if len(m.GetRegex()) > maxRegexLen {
		return nil, fmt.Errorf("regex longer than %d bytes", maxRegexLen)
	}
	// Envoy's safe_regex is RE2, which Go's regexp implements; the regex
	// must match the whole value.
	return regexp.Compile(`^(?:` + m.GetRegex() + `)$`)
}

func compileMatch(m *route.RouteMatch) (routeMatch, error) {
	var out routeMatch
	if m.GetRuntimeFraction() != nil || len(m.GetQueryParameters()) > 0 || len(m.GetCookies()) > 0 || m.GetGrpc() != nil ||
		m.GetTlsContext() != nil || len(m.GetDynamicMetadata()) > 0 || len(m.GetFilterState()) > 0 {
		return out, fmt.Errorf("match: only path and header matchers are supported")
	}
	out.path.caseSensitive = m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()
	switch ps := m.GetPathSpecifier().(type) {
	case *route.RouteMatch_Prefix:
		out.path.kind, out.path.value = matchPrefix, ps.Prefix
	case *route.RouteMatch_Path:
		out.path.kind, out.path.value = matchExact, ps.Path
	case *route.RouteMatch_PathSeparatedPrefix:
		out.path.kind, out.path.value, out.path.sep = matchPrefix, ps.PathSeparatedPrefix, true
	case *route.RouteMatch_SafeRegex:
		re, err := compileRegex(ps.SafeRegex)
		if err != nil {
			return out, fmt.Errorf("path regex: %v", err)
		}
		out.path.kind, out.path.re = matchRegex, re
	default:
		return out, fmt.Errorf("path specifier %T is not supported", ps)
	}
	if !out.path.caseSensitive && out.path.kind != matchRegex {
		out.path.value = strings.ToLower(out.path.value)
	}
	for _, h := range m.GetHeaders() {
		hm, err := compileHeader(h)
		if err != nil {
			return out, fmt.Errorf("header %q: %v", h.GetName(), err)
		}
		out.headers = append(out.headers, hm)
	}
	return out, nil
}

func compileHeader(h *route.HeaderMatcher) (headerMatcher, error) {
	hm := headerMatcher{name: strings.ToLower(h.GetName()), invert: h.GetInvertMatch(), treatMissingAsEmpty: h.GetTreatMissingHeaderAsEmpty()}
	var err error
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case *route.HeaderMatcher_ExactMatch:
		hm.kind, hm.value = matchExact, s.ExactMatch
	case *route.HeaderMatcher_PrefixMatch:
		hm.kind, hm.value = matchPrefix, s.PrefixMatch
	case *route.HeaderMatcher_SuffixMatch:
		hm.kind, hm.value = matchSuffix, s.SuffixMatch
	case *route.HeaderMatcher_ContainsMatch:
		hm.kind, hm.value = matchContains, s.ContainsMatch
	case *route.HeaderMatcher_SafeRegexMatch:
		hm.kind = matchRegex
		hm.re, err = compileRegex(s.SafeRegexMatch)
	case *route.HeaderMatcher_PresentMatch:
		hm.kind, hm.present = matchPresent, s.PresentMatch
	case *route.HeaderMatcher_RangeMatch:
		hm.kind, hm.start, hm.end = matchRange, s.RangeMatch.GetStart(), s.RangeMatch.GetEnd()
	case *route.HeaderMatcher_StringMatch:
		sm := s.StringMatch
		hm.ignoreCase = sm.GetIgnoreCase()
		switch p := sm.GetMatchPattern().(type) {
		case *matcher.StringMatcher_Exact:
			hm.kind, hm.value = matchExact, p.Exact
		case *matcher.StringMatcher_Prefix:
			hm.kind, hm.value = matchPrefix, p.Prefix
		case *matcher.StringMatcher_Suffix:
			hm.kind, hm.value = matchSuffix, p.Suffix
		case *matcher.StringMatcher_Contains:
			hm.kind, hm.value = matchContains, p.Contains
		case *matcher.StringMatcher_SafeRegex:
			hm.kind = matchRegex
			hm.re, err = compileRegex(p.SafeRegex)
		default:
			return hm, fmt.Errorf("string matcher %T is not supported", p)
		}
	case nil:
		// No specifier: Envoy treats it as a presence match.
		hm.kind, hm.present = matchPresent, true
	default:
		return hm, fmt.Errorf("matcher %T is not supported", s)
	}
	if err != nil {
		return hm, err
	}
	if hm.ignoreCase {
		hm.value = strings.ToLower(hm.value)
	}
	return hm, nil
}
