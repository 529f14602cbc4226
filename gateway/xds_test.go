package gateway

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// rawControl serves hand-made snapshots, bypassing xds.Server's checks, to
// see what the gateway does with resources it must refuse.
type rawControl struct {
	addr  string
	cache cache.SnapshotCache
	ver   int
}

func startRawControl(t *testing.T) *rawControl {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	c := &rawControl{addr: ln.Addr().String(), cache: cache.NewSnapshotCache(false, cache.IDHash{}, nil)}
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, c.cache, nil))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(ln)
	}()
	t.Cleanup(func() {
		cancel()
		gs.Stop()
		<-done
	})
	return c
}

// set serves the Envoy set of res, with edit applied to copies of it.
func (c *rawControl) set(t *testing.T, node string, s xds.Set, edit func(*xds.Set)) string {
	t.Helper()
	cp := xds.Set{}
	for _, r := range s.Routes {
		cp.Routes = append(cp.Routes, proto.Clone(r).(*route.RouteConfiguration))
	}
	for _, e := range s.Endpoints {
		cp.Endpoints = append(cp.Endpoints, proto.Clone(e).(*endpoint.ClusterLoadAssignment))
	}
	cp.Clusters = s.Clusters
	if edit != nil {
		edit(&cp)
	}
	c.ver++
	v := strconv.Itoa(c.ver)
	res := map[resource.Type][]types.Resource{}
	for _, r := range cp.Routes {
		res[resource.RouteType] = append(res[resource.RouteType], r)
	}
	for _, r := range cp.Clusters {
		res[resource.ClusterType] = append(res[resource.ClusterType], r)
	}
	for _, r := range cp.Endpoints {
		res[resource.EndpointType] = append(res[resource.EndpointType], r)
	}
	snap, err := cache.NewSnapshot(v, res)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
	return v
}

// Resources the gateway cannot honour are refused (NACKed, counted) and
// the previous ones stay in use.
func TestNackKeepsPreviousResources(t *testing.T) {
	a := engine(t, model, 4096, nil, 0)
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Build(oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096)))
	if err != nil {
		t.Fatal(err)
	}
	raw := startRawControl(t)
	const node = "isobar-gateway-r1"
	v1 := raw.set(t, node, res.Envoy, nil)
	g := startGateway(t, &control{addr: raw.addr}, Config{Region: "r1"}, Deps{})
	if r := g.completion(t, model, 10, nil); r.status != http.StatusOK {
		t.Fatalf("first configuration: %d", r.status)
	}

	// A route with weighted clusters, which the gateway does not split.
	raw.set(t, node, res.Envoy, func(s *xds.Set) {
		r := s.Routes[0].GetVirtualHosts()[0].GetRoutes()[0]
		r.GetRoute().ClusterSpecifier = &route.RouteAction_WeightedClusters{WeightedClusters: &route.WeightedCluster{
			Clusters: []*route.WeightedCluster_ClusterWeight{{Name: xdscontract.ClusterName(model), Weight: nil}}}}
	})
	eventually.True(t, testTimeout, "the route NACK", func() bool {
		return g.metric(t, "isobar_gateway_xds_nacks_total", map[string]string{"type": "route"}) >= 1
	})
	if v, _ := g.Table().Version("route"); v != v1 {
		t.Errorf("route version in use %q, want %q (the refused one must not replace it)", v, v1)
	}
	if r := g.completion(t, model, 10, nil); r.status != http.StatusOK || r.endpoint != "a" {
		t.Errorf("after the route refusal: %d from %q, want the first configuration", r.status, r.endpoint)
	}
	// Good routes again, and an endpoint with a host name: Envoy refuses
	// that too.
	v3 := raw.set(t, node, res.Envoy, func(s *xds.Set) {
		s.Endpoints[0].GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().Address = "cell.local"
	})
	eventually.True(t, testTimeout, "the endpoint NACK", func() bool {
		return g.metric(t, "isobar_gateway_xds_nacks_total", map[string]string{"type": "endpoint"}) >= 1
	})
	g.waitTable(t, "the good routes", func(tb *xdsclient.Table) bool { v, _ := tb.Version("route"); return v == v3 })
	if v, _ := g.Table().Version("endpoint"); v != "2" {
		t.Errorf("endpoint version in use %q, want 2 (the last good one)", v)
	}
	// The refusals are paced: a server resending the same refused response
	// does not get thousands of NACKs a second.
	if n := g.metric(t, "isobar_gateway_xds_nacks_total", nil); n > 20 {
		t.Errorf("%v NACKs sent", n)
	}
	if r := g.completion(t, model, 10, nil); r.status != http.StatusOK || r.endpoint != "a" {
		t.Errorf("after the refusals: %d from %q, want the first configuration", r.status, r.endpoint)
	}
}

// A route's per-try timeout ends an attempt that has no response headers in
// time, and gateway-error retries it on another endpoint.
func TestPerTryTimeoutRetried(t *testing.T) {
	silent := &gatedUpstream{status: http.StatusOK, firstGate: make(chan struct{}), retryGate: make(chan struct{})}
	defer close(silent.firstGate)
	good := engine(t, model, 4096, nil, 0)
	b, err := xds.NewBuilder(xds.Config{Region: "r1", OutlierConsecutive5xx: 1000})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Build(oneModel(model, endpointOf(t, "silent", startHTTP(t, silent), 1, 4096), endpointOf(t, "good", good.Addr(), 1, 4096)))
	if err != nil {
		t.Fatal(err)
	}
	raw := startRawControl(t)
	raw.set(t, "isobar-gateway-r1", res.Envoy, func(s *xds.Set) {
		for _, r := range s.Routes[0].GetVirtualHosts()[0].GetRoutes() {
			rp := r.GetRoute().GetRetryPolicy()
			rp.RetryOn += ",gateway-error"
			rp.PerTryTimeout = durationpb.New(50 * time.Millisecond)
		}
	})
	g := startGateway(t, &control{addr: raw.addr}, Config{Region: "r1", LB: LBRoundRobin}, Deps{})
	byEP, byStatus := g.spread(t, 10, 2, model, 10, nil)
	if byStatus[http.StatusOK] != 10 || byEP["good"] != 10 {
		t.Errorf("%v %v, want all 10 answered by good", byEP, byStatus)
	}
	timeouts := g.metric(t, "isobar_gateway_upstream_errors_total", map[string]string{"endpoint": "silent", "reason": "timeout"})
	if timeouts == 0 || timeouts != g.metric(t, "isobar_gateway_retries_total", nil) {
		t.Errorf("%v per-try timeouts on silent, %v retries; want each retried", timeouts, g.metric(t, "isobar_gateway_retries_total", nil))
	}
}
