package xds

import (
	"slices"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/wellknown"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// A client's hop header cannot reach the unshed hop routes through Envoy:
// the route configuration lists the hop header and its proof as
// internal_only_headers, which Envoy removes from an external request
// before matching (conn_manager_utility.cc cleanInternalHeaders); the
// request then takes the client route, with the shed fault.
func TestHopHeaderIsInternalOnly(t *testing.T) {
	st := State{Models: []Model{{Name: "m", Shed: 0.5, Localities: []Locality{
		{Weight: 1, Endpoints: []Endpoint{{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 1, MaxModelLen: 8192}}},
	}}}}
	cfg := testConfig()
	res, err := mustBuilder(t, cfg).Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	rc := res.Envoy.Routes[0]
	internal := rc.GetInternalOnlyHeaders()
	for _, h := range xdscontract.InternalHeaders(cfg.withDefaults().HopHeader) {
		if !slices.Contains(internal, h) {
			t.Errorf("internal_only_headers %q lack %q", internal, h)
		}
	}
	client := map[string]string{"x-isobar-model": "m", "x-isobar-hop": "eu", xdscontract.HopAuthHeader: "v1.1.x"}
	for _, h := range internal { // what Envoy does to an external request
		delete(client, h)
	}
	r := matchRoute(t, rc, client)
	if got := r.GetRoute().GetCluster(); got != xdscontract.ClusterName("m") {
		t.Errorf("external request with the hop header routed to %s, want the client cluster %s", got, xdscontract.ClusterName("m"))
	}
	if r.GetTypedPerFilterConfig()[wellknown.Fault] == nil {
		t.Errorf("external request with the hop header took route %q, which has no shed fault", r.GetName())
	}
	// Who is external is the TCP peer's business (not a client's
	// x-forwarded-for), and no peer is internal.
	m := unpackHCM(t, res.Envoy.Listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig())
	if !m.GetUseRemoteAddress().GetValue() {
		t.Error("ingress listener without use_remote_address: a client's x-forwarded-for would decide whether it is internal")
	}
	if iac := m.GetInternalAddressConfig(); iac == nil || len(iac.GetCidrRanges()) != 0 || iac.GetUnixSockets() {
		t.Errorf("internal_address_config %v, want present and empty (no peer internal)", iac)
	}
	// Internal traffic (an isobar data plane's, as Envoy's
	// internal_address_config admits it) keeps the header and the hop route.
	r = matchRoute(t, rc, map[string]string{"x-isobar-model": "m", "x-isobar-hop": "eu"})
	if got := r.GetRoute().GetCluster(); got != xdscontract.LocalClusterName("m") {
		t.Errorf("internal hop request routed to %s, want %s", got, xdscontract.LocalClusterName("m"))
	}
}
