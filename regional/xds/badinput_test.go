package xds

import (
	"context"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// A client that answers with a nonce it was never sent, or names a
// resource the server does not hold, is counted each time and logged once
// per version; the stream keeps working and another client still gets
// updates.
func TestBadNonceAndUnknownNamesCountedLoggedOnce(t *testing.T) {
	ts := startServer(t, testConfig())
	m := Model{Name: "m", Localities: []Locality{local(ep("c1", "10.0.0.1", 8000, 1))}}
	if _, err := ts.xds.Push(State{Models: []Model{m}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(dial(t, ts.addr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := gatewayNode("bad-input")
	name := xdscontract.ClusterName("m")
	send := func(r *discovery.DiscoveryRequest) {
		t.Helper()
		r.TypeUrl = resource.EndpointType
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	send(&discovery.DiscoveryRequest{Node: node, ResourceNames: []string{name}})
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		send(&discovery.DiscoveryRequest{VersionInfo: resp.GetVersionInfo(), ResponseNonce: "forged", ResourceNames: []string{name}})
	}
	for range 2 {
		send(&discovery.DiscoveryRequest{VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
			ResourceNames: []string{name, "isobar/no-such-model"}})
	}
	waitFor(t, "bad input counted", func() bool {
		return metricValue(t, ts.xds.m.staleNonces.WithLabelValues("endpoint")) == 2 &&
			metricValue(t, ts.xds.m.unknownNames.WithLabelValues("endpoint")) == 2
	})

	// Another client is served, and so is this stream, after the next push.
	eds := newADSClient(t, dial(t, ts.addr), gatewayNode("good"), resource.EndpointType)
	eds.fetch()
	if err := eds.c.Ack(); err != nil {
		t.Fatal(err)
	}
	m.Localities[0].Endpoints[0].Weight = 9
	if _, err := ts.xds.Push(State{Models: []Model{m}}); err != nil {
		t.Fatal(err)
	}
	if w := assignments(t, eds.fetch())[name]["c1"]; w != 9 {
		t.Fatalf("the other client got weight %d, want 9", w)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the bad client's stream after the push: %v", err)
	}

	logs := map[string]int{}
	for done := false; !done; {
		select {
		case msg := <-ts.logs:
			logs[msg]++
		default:
			done = true
		}
	}
	for _, msg := range []string{"xds request with a stale or unknown nonce ignored", "xds request names resources this server does not have"} {
		if logs[msg] != 1 {
			t.Errorf("%q logged %d times, want once", msg, logs[msg])
		}
	}
}
