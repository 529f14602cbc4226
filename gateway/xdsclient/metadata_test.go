package xdsclient

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lbcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequest "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	ringhash "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	roundrobin "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// edsCluster is a minimal EDS cluster named name, changed by mod.
func edsCluster(name string, mod func(*cluster.Cluster)) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{EdsConfig: &core.ConfigSource{
			ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}},
		ConnectTimeout: durationpb.New(time.Second),
	}
	if mod != nil {
		mod(c)
	}
	return c
}

// typedLB is a load_balancing_policy listing the given typed configs.
func typedLB(t *testing.T, cfgs ...*anypb.Any) func(*cluster.Cluster) {
	return func(c *cluster.Cluster) {
		p := &cluster.LoadBalancingPolicy{}
		for i, a := range cfgs {
			p.Policies = append(p.Policies, &cluster.LoadBalancingPolicy_Policy{
				TypedExtensionConfig: &core.TypedExtensionConfig{Name: "policy-" + strconv.Itoa(i), TypedConfig: a}})
		}
		c.LoadBalancingPolicy = p
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The gateway honours the pushed policy, typed or legacy, as Envoy would,
// and falls back to ROUND_ROBIN, naming what it replaced, for one it does
// not know.
func TestDecodeLBPolicy(t *testing.T) {
	unknown := &anypb.Any{TypeUrl: "type.googleapis.com/example.lb.v1.Unknown"}
	weighted := &lbcommon.LocalityLbConfig{LocalityConfigSpecifier: &lbcommon.LocalityLbConfig_LocalityWeightedLbConfig_{
		LocalityWeightedLbConfig: &lbcommon.LocalityLbConfig_LocalityWeightedLbConfig{}}}
	for _, tc := range []struct {
		name     string
		mod      func(*cluster.Cluster)
		want     ClusterPolicy // only the LB fields are compared
		fallback string        // substring of LBFallbackFrom; "" none
		err      bool
	}{
		{"legacy round robin", func(c *cluster.Cluster) { c.LbPolicy = cluster.Cluster_ROUND_ROBIN },
			ClusterPolicy{LBPolicy: LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}, "", false},
		{"legacy least request with its config", func(c *cluster.Cluster) {
			c.LbPolicy = cluster.Cluster_LEAST_REQUEST
			c.LbConfig = &cluster.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &cluster.Cluster_LeastRequestLbConfig{
				ChoiceCount: wrapperspb.UInt32(3), ActiveRequestBias: &core.RuntimeDouble{DefaultValue: 0.5, RuntimeKey: "k"}}}
			c.CommonLbConfig = &cluster.Cluster_CommonLbConfig{LocalityConfigSpecifier: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{}}}
		}, ClusterPolicy{LBPolicy: LBLeastRequest, ChoiceCount: 3, ActiveRequestBias: 0.5, LocalityWeighted: true}, "", false},
		{"legacy random", func(c *cluster.Cluster) { c.LbPolicy = cluster.Cluster_RANDOM },
			ClusterPolicy{LBPolicy: LBRandom, ChoiceCount: 2, ActiveRequestBias: 1}, "", false},
		{"legacy ring hash falls back", func(c *cluster.Cluster) { c.LbPolicy = cluster.Cluster_RING_HASH },
			ClusterPolicy{LBPolicy: LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}, "RING_HASH", false},
		{"legacy maglev falls back", func(c *cluster.Cluster) { c.LbPolicy = cluster.Cluster_MAGLEV },
			ClusterPolicy{LBPolicy: LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}, "MAGLEV", false},
		{"typed least request, full scan, locality weighted", typedLB(t, mustAny(t, &leastrequest.LeastRequest{
			SelectionMethod: leastrequest.LeastRequest_FULL_SCAN, LocalityLbConfig: weighted})),
			ClusterPolicy{LBPolicy: LBLeastRequest, ChoiceCount: 2, FullScan: true, ActiveRequestBias: 1, LocalityWeighted: true}, "", false},
		{"typed least request, deprecated enable_full_scan", typedLB(t, mustAny(t, &leastrequest.LeastRequest{
			//lint:ignore SA1019 a control plane may still send the deprecated field, and Envoy honours it
			EnableFullScan: wrapperspb.Bool(true)})),
			ClusterPolicy{LBPolicy: LBLeastRequest, ChoiceCount: 2, FullScan: true, ActiveRequestBias: 1}, "", false},
		{"typed least request, choice count and bias", typedLB(t, mustAny(t, &leastrequest.LeastRequest{
			ChoiceCount: wrapperspb.UInt32(4), ActiveRequestBias: &core.RuntimeDouble{DefaultValue: 2, RuntimeKey: "b"}})),
			ClusterPolicy{LBPolicy: LBLeastRequest, ChoiceCount: 4, ActiveRequestBias: 2}, "", false},
		{"typed: the first known policy wins", typedLB(t, unknown, mustAny(t, &roundrobin.RoundRobin{}),
			mustAny(t, &leastrequest.LeastRequest{})),
			ClusterPolicy{LBPolicy: LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}, "", false},
		{"typed ring hash falls back", typedLB(t, mustAny(t, &ringhash.RingHash{})),
			ClusterPolicy{LBPolicy: LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}, "ring_hash.v3.RingHash", false},
		{"typed unknown extension falls back", typedLB(t, unknown),
			ClusterPolicy{LBPolicy: LBRoundRobin, ChoiceCount: 2, ActiveRequestBias: 1}, "example.lb.v1.Unknown", false},
		{"typed slow start is refused", typedLB(t, mustAny(t, &leastrequest.LeastRequest{
			SlowStartConfig: &lbcommon.SlowStartConfig{SlowStartWindow: durationpb.New(time.Second)}})), ClusterPolicy{}, "", true},
		{"typed choice count 1 is refused", typedLB(t, mustAny(t, &leastrequest.LeastRequest{ChoiceCount: wrapperspb.UInt32(1)})),
			ClusterPolicy{}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := Decoder{ModelHeader: "x-isobar-model"}
			out, err := dec.DecodeClusters([]*anypb.Any{mustAny(t, edsCluster("c", tc.mod))})
			if tc.err {
				if err == nil {
					t.Fatalf("decoded %+v, want an error", out["c"])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p := out["c"]
			got := ClusterPolicy{LBPolicy: p.LBPolicy, ChoiceCount: p.ChoiceCount, FullScan: p.FullScan,
				ActiveRequestBias: p.ActiveRequestBias, LocalityWeighted: p.LocalityWeighted}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("policy %+v, want %+v", got, tc.want)
			}
			if (tc.fallback == "") != (p.LBFallbackFrom == "") || !strings.Contains(p.LBFallbackFrom, tc.fallback) {
				t.Errorf("LBFallbackFrom %q, want one naming %q", p.LBFallbackFrom, tc.fallback)
			}
		})
	}
}

func TestPlacementMetadata(t *testing.T) {
	md := func(kv map[string]any) *core.Metadata {
		s, err := structpb.NewStruct(kv)
		if err != nil {
			t.Fatal(err)
		}
		return &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: s}}
	}
	for _, tc := range []struct {
		name    string
		ep, loc *core.Metadata
		want    placementMeta
	}{
		{"absent", nil, nil, placementMeta{}},
		{"endpoint", md(map[string]any{xdscontract.MetadataPrefillRate: 30000.0, xdscontract.MetadataRTT: 12.5, xdscontract.MetadataJitter: 2.0}), nil,
			placementMeta{prefillRate: 30000, rtt: 12500 * time.Microsecond, jitter: 2 * time.Millisecond}},
		{"locality RTT, endpoint wins", md(map[string]any{xdscontract.MetadataRTT: 5.0}), md(map[string]any{xdscontract.MetadataRTT: 40.0, xdscontract.MetadataJitter: 3.0}),
			placementMeta{rtt: 5 * time.Millisecond, jitter: 3 * time.Millisecond}},
		{"the rate is the endpoint's only", nil, md(map[string]any{xdscontract.MetadataPrefillRate: 30000.0}), placementMeta{}},
		{"bad values are unknown", md(map[string]any{xdscontract.MetadataPrefillRate: "fast", xdscontract.MetadataRTT: -3.0, xdscontract.MetadataJitter: 1e12}), nil,
			placementMeta{}},
		{"batch cap", md(map[string]any{xdscontract.MetadataMaxNumSeqs: 12.0}), nil, placementMeta{maxNumSeqs: 12}},
		{"the batch cap is the endpoint's only", nil, md(map[string]any{xdscontract.MetadataMaxNumSeqs: 12.0}), placementMeta{}},
		{"a batch cap of no sequence is unknown", md(map[string]any{xdscontract.MetadataMaxNumSeqs: 0.0}), nil, placementMeta{}},
		{"a fractional batch cap is unknown", md(map[string]any{xdscontract.MetadataMaxNumSeqs: 2.5}), nil, placementMeta{}},
		{"a negative batch cap is unknown", md(map[string]any{xdscontract.MetadataMaxNumSeqs: -12.0}), nil, placementMeta{}},
		{"an absurd batch cap is unknown", md(map[string]any{xdscontract.MetadataMaxNumSeqs: 1e9}), nil, placementMeta{}},
		{"an absurd rate is unknown", md(map[string]any{xdscontract.MetadataPrefillRate: 1e15, xdscontract.MetadataMaxNumSeqs: "many"}), nil, placementMeta{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := placementMetadata(tc.ep, tc.loc); got != tc.want {
				t.Errorf("placementMetadata = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// EDS DEGRADED is kept as a flag; the placement metadata is read.
func TestDecodeDegradedAndPlacementMetadata(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{"cell": "c1", xdscontract.MetadataPrefillRate: 45000.0, xdscontract.MetadataRTT: 3.0})
	if err != nil {
		t.Fatal(err)
	}
	lbe := func(ip string, hs core.HealthStatus) *endpoint.LbEndpoint {
		return &endpoint.LbEndpoint{HealthStatus: hs, Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: md}},
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{Address: &core.Address_SocketAddress{
				SocketAddress: &core.SocketAddress{Address: ip, PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8000}}}}}}}
	}
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "c", Endpoints: []*endpoint.LocalityLbEndpoints{{
		LbEndpoints: []*endpoint.LbEndpoint{lbe("10.0.0.1", core.HealthStatus_HEALTHY), lbe("10.0.0.2", core.HealthStatus_DEGRADED),
			lbe("10.0.0.3", core.HealthStatus_UNHEALTHY)}}}}
	out, err := DecodeAssignments([]*anypb.Any{mustAny(t, cla)})
	if err != nil {
		t.Fatal(err)
	}
	eps := out["c"]
	if len(eps) != 2 || eps[0].Degraded || !eps[1].Degraded {
		t.Fatalf("endpoints %+v, want a healthy and a degraded one", eps)
	}
	if eps[0].PrefillTokensPerSecond != 45000 || eps[0].RTT != 3*time.Millisecond {
		t.Errorf("placement metadata %v %v, want 45000 tokens/s and 3ms", eps[0].PrefillTokensPerSecond, eps[0].RTT)
	}
}
