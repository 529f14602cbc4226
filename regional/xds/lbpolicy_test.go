package xds

import (
	"slices"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	wrrlocality "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// Type URLs of the load_balancing_policy entries that both non-Go gRPC
// clients isobar is tried with have a factory for, as registered in their
// sources: @grpc/grpc-js-xds 1.14 (src/lb-policy-registry/round-robin.ts,
// src/load-balancer-xds-wrr-locality.ts, src/load-balancer-ring-hash.ts)
// and gRPC C-core 1.51 (src/core/ext/xds/xds_lb_policy_registry.cc:
// RoundRobin, RingHash, WrrLocality). Neither registers least_request.
// test/interop checks the same thing against the real clients.
var everyClientKnows = map[string]bool{
	"type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin":   true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.wrr_locality.v3.WrrLocality": true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash":       true,
}

// firstKnown returns the policy a client with the registry known would run
// from p, following the selection rule of gRFC A52 (the first entry it has
// a factory for; a wrr_locality entry is usable only if its child list is),
// or "" when it would refuse the Cluster.
func firstKnown(t *testing.T, p *cluster.LoadBalancingPolicy, known map[string]bool) string {
	t.Helper()
	for _, pol := range p.GetPolicies() {
		a := pol.GetTypedExtensionConfig().GetTypedConfig()
		if !known[a.GetTypeUrl()] {
			continue
		}
		if a.MessageIs(&wrrlocality.WrrLocality{}) {
			var w wrrlocality.WrrLocality
			if err := a.UnmarshalTo(&w); err != nil {
				t.Fatal(err)
			}
			child := firstKnown(t, w.GetEndpointPickingPolicy(), known)
			if child == "" {
				return "" // a client refuses a wrr_locality whose child it cannot run
			}
			return pol.GetTypedExtensionConfig().GetName() + "{" + child + "}"
		}
		return pol.GetTypedExtensionConfig().GetName()
	}
	return ""
}

// TestLBPolicyListServesEveryClient: with the default least_request, every
// Cluster of both node kinds lists least_request first (Envoy, the gateway
// and grpc-go run it) and ends in a policy the non-Go gRPC clients run, so
// they fall back instead of NACKing the Cluster (issue 23's NACK table).
func TestLBPolicyListServesEveryClient(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"P2C", func(*Config) {}},
		{"full scan", func(c *Config) { c.FullScan = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.edit(&cfg)
			res, err := mustBuilder(t, cfg).Build(State{Models: []Model{fleet("m", 3)}})
			if err != nil {
				t.Fatal(err)
			}
			withLR := map[string]bool{"type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest": true}
			for k := range everyClientKnows {
				withLR[k] = true
			}
			for _, c := range append(slices.Clone(res.Envoy.Clusters), res.GRPC.Clusters...) {
				leastRequestOf(t, c) // least_request first, valid
				p := c.GetLoadBalancingPolicy()
				if got := firstKnown(t, p, withLR); got != xdscontract.LeastRequestExtension {
					t.Errorf("%s: a client with least_request runs %q, want %s", c.GetName(), got, xdscontract.LeastRequestExtension)
				}
				want := "envoy.load_balancing_policies.wrr_locality{envoy.load_balancing_policies.round_robin}"
				if got := firstKnown(t, p, everyClientKnows); got != want {
					t.Errorf("%s: a client without least_request runs %q (empty: refuses the Cluster), want %s", c.GetName(), got, want)
				}
			}
		})
	}
}

// TestOutlierDetectionSuccessRateExplicit: every Cluster writes Envoy's
// success-rate ejection defaults out. @grpc/grpc-js 1.14 overwrites its
// defaults with the unset fields and its Node process dies at the first
// success-rate check (test/interop TestXDSJudges).
func TestOutlierDetectionSuccessRateExplicit(t *testing.T) {
	for _, policy := range []xdscontract.LBPolicy{xdscontract.LeastRequest, xdscontract.RoundRobin, xdscontract.RingHash} {
		cfg := testConfig()
		cfg.LBPolicy = policy
		res, err := mustBuilder(t, cfg).Build(State{Models: []Model{fleet("m", 3)}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range append(slices.Clone(res.Envoy.Clusters), res.GRPC.Clusters...) {
			od := c.GetOutlierDetection()
			got := []uint32{od.GetEnforcingSuccessRate().GetValue(), od.GetSuccessRateMinimumHosts().GetValue(),
				od.GetSuccessRateRequestVolume().GetValue(), od.GetSuccessRateStdevFactor().GetValue()}
			if want := []uint32{100, 5, 100, 1900}; !slices.Equal(got, want) || od.GetSuccessRateMinimumHosts() == nil {
				t.Errorf("%s %s: success-rate settings %v, want Envoy's defaults %v written out", policy, c.GetName(), got, want)
			}
		}
	}
}
