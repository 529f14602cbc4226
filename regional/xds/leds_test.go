package xds

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

var deltaLarge = flag.Bool("delta.large", false, "TestDeltaBytesPerEndpointChange also measures 10,000 endpoints")

func ledsConfig() Config {
	cfg := testConfig()
	cfg.LEDS = true
	return cfg
}

func grpcNode(id string) *core.Node { return &core.Node{Id: id, UserAgentName: "gRPC Go"} }

// churnState is a model with a local and a remote locality, and a second
// model, for the churn sequence.
func churnState() State {
	m := fleet("m", 12)
	for i := range m.Localities[0].Endpoints {
		m.Localities[0].Endpoints[i].MaxModelLen = []uint32{8192, 32768, 131072}[i%3]
	}
	m.Localities = append(m.Localities, Locality{Region: "eu-west", Zone: "eu-west-1a", Weight: 10, Priority: 1,
		RTT: 80 * time.Millisecond, Endpoints: []Endpoint{ep("eu-1", "192.0.2.1", 443, 5), ep("eu-2", "192.0.2.2", 443, 5)}})
	return State{Models: []Model{m, fleet("n", 3)}}
}

// TestDeltaClientAgreesWithSnapshotThroughChurn: with the LEDS layout, an
// independent delta client of each node kind assembles, after every step
// of a churn of single endpoints (add, remove, weight, health, context
// length), of a locality and of a model, exactly the state-of-the-world
// snapshot of its kind.
func TestDeltaClientAgreesWithSnapshotThroughChurn(t *testing.T) {
	ts := startServer(t, ledsConfig())
	st := churnState()
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	conn := dial(t, ts.addr)
	clients := map[NodeKind]*deltaClient{
		KindEnvoy: newDeltaClient(t, conn, gatewayNode("delta-envoy")),
		KindGRPC:  newDeltaClient(t, conn, grpcNode("delta-grpc")),
	}
	check := func(step string) {
		t.Helper()
		for kind, c := range clients {
			awaitSame(t, c, ts.xds, kind, step+" ("+string(kind)+")")
		}
	}
	check("initial")
	// The assignments a delta client holds are in LEDS form.
	c := clients[KindEnvoy]
	c.mu.Lock()
	var cla endpoint.ClusterLoadAssignment
	if err := c.res[resource.EndpointType][xdscontract.ClusterName("m")].UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	c.mu.Unlock()
	for _, ll := range cla.GetEndpoints() {
		if ll.GetLedsClusterLocalityConfig() == nil || len(ll.GetLbEndpoints()) != 0 {
			t.Fatalf("delta assignment locality %v is not in LEDS form", ll)
		}
	}
	// State-of-the-world clients on the same server keep the EDS layout:
	// the snapshot's own assignments, endpoints listed.
	sotw := newADSClient(t, conn, gatewayNode("sotw"), resource.EndpointType)
	want := sotwResources(ts.xds, KindEnvoy)[resource.EndpointType]
	got := sotw.fetch()
	if len(got) != len(want) {
		t.Fatalf("SotW client got %d assignments, snapshot has %d", len(got), len(want))
	}
	for _, a := range got {
		var cla endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&cla, want[cla.GetClusterName()]) {
			t.Fatalf("SotW assignment %q differs from the snapshot's", cla.GetClusterName())
		}
	}
	local := func(s *State) *[]Endpoint { return &s.Models[0].Localities[0].Endpoints }
	steps := []struct {
		name string
		do   func(s *State)
	}{
		{"add an endpoint", func(s *State) { *local(s) = append(*local(s), ep("cell-new", "10.9.9.9", 8000, 7)) }},
		{"remove an endpoint", func(s *State) { *local(s) = (*local(s))[1:] }},
		{"change a weight", func(s *State) { (*local(s))[2].Weight = 99 }},
		{"degrade an endpoint", func(s *State) { (*local(s))[3].Degraded = true }},
		{"heal it", func(s *State) { (*local(s))[3].Degraded = false }},
		{"shrink a context length", func(s *State) { (*local(s))[4].MaxModelLen = 4096 }},
		{"give a class weight", func(s *State) { (*local(s))[5].ClassWeight = 3 }},
		{"remove the remote locality", func(s *State) { s.Models[0].Localities = s.Models[0].Localities[:1] }},
		{"remove a model", func(s *State) { s.Models = s.Models[:1] }},
		{"add a model", func(s *State) { s.Models = append(s.Models, fleet("o", 2)) }},
	}
	for _, step := range steps {
		step.do(&st)
		if _, err := ts.xds.Push(st); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		check(step.name)
	}
	if n := metricValue(t, ts.xds.m.nacks.WithLabelValues("lb_endpoint")); n != 0 {
		t.Errorf("LbEndpoint NACKs = %v", n)
	}
	if n := metricValue(t, ts.xds.m.acks.WithLabelValues("lb_endpoint")); n == 0 {
		t.Error("no LbEndpoint ACK counted")
	}
}

// sotwEDS is a raw state-of-the-world ADS stream of assignments, to size
// what a state-of-the-world client is sent.
type sotwEDS struct {
	t      *testing.T
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
}

func newSotwEDS(t *testing.T, conn *grpc.ClientConn, node *core.Node) *sotwEDS {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType}); err != nil {
		t.Fatal(err)
	}
	return &sotwEDS{t: t, stream: stream}
}

// next receives the next response, ACKs it and returns its size.
func (s *sotwEDS) next() int {
	s.t.Helper()
	resp, err := s.stream.Recv()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		s.t.Fatal(err)
	}
	return proto.Size(resp)
}

// lastDeltaNonce is the number of responses the server sent on the delta
// stream of node id: go-control-plane numbers a delta stream's responses
// 1, 2, ... across types (pkg/server/delta/v3/server.go, send).
func lastDeltaNonce(s *Server, id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	best := 0
	for _, ds := range s.deltaStreams {
		if ds.nodeID != id {
			continue
		}
		for _, n := range ds.sent {
			if v, err := strconv.Atoi(n); err == nil && v > best {
				best = v
			}
		}
	}
	return best
}

// measureChange serves n endpoints, with the LEDS layout or without,
// changes the weight of one, and returns the bytes a delta client and a
// state-of-the-world EDS client were sent for that change.
func measureChange(t *testing.T, n int, leds bool) (delta, responses, sotw int) {
	cfg := testConfig()
	cfg.LEDS = leds
	ts := startServer(t, cfg)
	st := State{Models: []Model{fleet("m", n)}}
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	// A state-of-the-world assignment set of 10,000 endpoints (7 MB) and
	// a delta client's first LbEndpoint response pass gRPC's default 4 MiB.
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	dc := newDeltaClient(t, conn, gatewayNode("delta"))
	sw := newSotwEDS(t, conn, gatewayNode("sotw"))
	sw.next()
	settle := func(step string) (int, int) {
		awaitSame(t, dc, ts.xds, KindEnvoy, step)
		waitFor(t, step+": every delta response received", func() bool {
			_, count := dc.received()
			return count == lastDeltaNonce(ts.xds, "delta")
		})
		return dc.received()
	}
	before, count0 := settle(fmt.Sprintf("%d endpoints", n))
	st.Models[0].Localities[0].Endpoints[n/2].Weight += 1000
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	after, count1 := settle(fmt.Sprintf("%d endpoints, one weight changed", n))
	return after - before, count1 - count0, sw.next()
}

// TestDeltaBytesPerEndpointChange: with the LEDS layout, the bytes a delta
// client is sent when one endpoint's weight changes do not grow with the
// cluster (10 to 1,000 endpoints; 10,000 with -delta.large), while a
// state-of-the-world EDS client is resent every endpoint.
func TestDeltaBytesPerEndpointChange(t *testing.T) {
	sizes := []int{10, 100, 1000}
	if *deltaLarge {
		sizes = append(sizes, 10000)
	}
	deltas := make([]int, len(sizes))
	sotws := make([]int, len(sizes))
	for i, n := range sizes {
		var responses int
		deltas[i], responses, sotws[i] = measureChange(t, n, true)
		edsDelta, _, _ := measureChange(t, n, false)
		t.Logf("endpoints %6d: delta (LEDS) %6d B in %d responses per change; delta without LEDS %9d B; state-of-the-world EDS %9d B (%.0fx LEDS)",
			n, deltas[i], responses, edsDelta, sotws[i], float64(sotws[i])/float64(deltas[i]))
	}
	last := len(sizes) - 1
	if deltas[0] == 0 || deltas[last] > deltas[0]+deltas[0]/10 || deltas[last] < deltas[0]-deltas[0]/10 {
		t.Errorf("delta bytes per change %v: want constant (±10%%) in the number of endpoints", deltas)
	}
	growth := float64(sotws[last]) / float64(sotws[0])
	if want := float64(sizes[last]) / float64(sizes[0]) / 2; growth < want {
		t.Errorf("state-of-the-world bytes %v grew %.0fx over %v endpoints: want at least %.0fx (linear)", sotws, growth, sizes, want)
	}
}

// TestDeltaBadInputIsCountedAndStreamDoesNotLeak: a delta client naming
// resources the server does not have and answering with a made-up nonce is
// counted and logged, keeps its stream (the next change still reaches it),
// and when it goes away the stream gauge and the goroutines come back.
func TestDeltaBadInputIsCountedAndStreamDoesNotLeak(t *testing.T) {
	ts := startServer(t, ledsConfig())
	st := State{Models: []Model{fleet("m", 3)}}
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	conn := dial(t, ts.addr)
	// Warm the connection so that its own goroutines are in the baseline.
	warm := newSotwEDS(t, conn, gatewayNode("warm"))
	warm.next()
	baseline := runtime.NumGoroutine()

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *discovery.DeltaDiscoveryRequest) {
		t.Helper()
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	unknown := func(label string) float64 { return metricValue(t, ts.xds.m.unknownNames.WithLabelValues(label)) }
	stale := func() float64 { return metricValue(t, ts.xds.m.staleNonces.WithLabelValues("endpoint")) }
	send(&discovery.DeltaDiscoveryRequest{Node: gatewayNode("bad"), TypeUrl: resource.EndpointType,
		ResourceNamesSubscribe: []string{xdscontract.ClusterName("m"), "no-such-cluster"}})
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// The protocol's answer to a name that does not exist is nothing (the
	// client's does-not-exist timeout): only the known assignment came.
	if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != xdscontract.ClusterName("m") {
		t.Fatalf("response = %v, want the assignment of m only", resp.GetResources())
	}
	waitFor(t, "the unknown assignment to be counted", func() bool { return unknown("endpoint") == 1 })
	send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: "not-a-nonce-we-sent"})
	waitFor(t, "the made-up nonce to be counted", func() bool { return stale() == 1 })
	send(&discovery.DeltaDiscoveryRequest{TypeUrl: xdscontract.LbEndpointType,
		ResourceNamesSubscribe: []string{xdscontract.LEDSCollection("isobar/nope", "x", "y")}})
	waitFor(t, "the unknown collection to be counted", func() bool { return unknown("lb_endpoint") == 1 })
	if acks := metricValue(t, ts.xds.m.acks.WithLabelValues("endpoint")); acks != 1 { // the warm SotW client's
		t.Errorf("endpoint ACKs = %v, want 1: a made-up nonce is no ACK", acks)
	}

	// The stream still works: the next change reaches it (in LEDS form, a
	// weight change is an LbEndpoint update; the unknown collection was
	// served as the kind's wildcard, leds.go).
	st.Models[0].Localities[0].Endpoints[0].Weight = 50
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	for seen := false; !seen; {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		// ACK: the library watches a type again on the client's next
		// request (pkg/server/delta/v3/server.go).
		send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
		for _, r := range resp.GetResources() {
			var lb endpoint.LbEndpoint
			if resp.GetTypeUrl() == xdscontract.LbEndpointType && r.GetResource().UnmarshalTo(&lb) == nil && lb.GetLoadBalancingWeight().GetValue() == 50 {
				seen = true
			}
		}
	}
	if n := metricValue(t, ts.xds.m.streams); n != 2 {
		t.Errorf("connected streams = %v, want 2", n)
	}
	cancel()
	waitFor(t, "the bad client's stream to close", func() bool { return metricValue(t, ts.xds.m.streams) == 1 })
	waitFor(t, "the stream's goroutines to end", func() bool { return runtime.NumGoroutine() <= baseline })
}

// FuzzDeltaStreamRequests feeds the delta callbacks (with LEDS on) any
// sequence of stream opens and closes, responses and requests naming any
// type, names (LEDS collections and endpoints, garbage) and nonces: they
// never panic, keep per-stream state only for served types, and the
// stream gauge counts the open delta streams.
func FuzzDeltaStreamRequests(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 1, 1, 2, 1, 3, 3, 1, 0, 2})
	f.Add([]byte{0, 5, 0, 0, 4, 2, 3, 2, 1, 1, 4, 3, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := NewServer(Config{Region: "r", LEDS: true}, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		if _, err := s.Push(State{Models: []Model{fleet("m", 2)}}); err != nil {
			t.Fatal(err)
		}
		cb := callbacks{s}
		coll := xdscontract.LEDSCollection(xdscontract.ClusterName("m"), "r", "")
		types := []string{resource.EndpointType, xdscontract.LbEndpointType, resource.ClusterType, "", "type.googleapis.com/x", "\xff"}
		names := []string{"*", coll, xdscontract.LEDSEndpointName(coll, "10.0.0.0:8000"), xdscontract.ClusterName("m"), "", "xdstp://isobar/envoy.config.endpoint.v3.LbEndpoint//", string(data)}
		words := []string{"", "1", "2", "abc", string(data)}
		r := &byteReader{b: data}
		open := map[int64]bool{}
		for op := 0; r.i < len(data) && op < 64; op++ {
			id := int64(r.next() % 3)
			typ := types[int(r.next())%len(types)]
			switch r.next() % 4 {
			case 0:
				if cb.OnDeltaStreamOpen(context.Background(), id, typ) == nil {
					if open[id] {
						t.Skip("the library never reuses a stream id")
					}
					open[id] = true
				}
			case 1:
				cb.OnDeltaStreamClosed(id, nil)
				delete(open, id)
			case 2:
				cb.OnStreamDeltaResponse(id, nil, &discovery.DeltaDiscoveryResponse{TypeUrl: typ, Nonce: words[int(r.next())%len(words)]})
			default:
				req := &discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: words[int(r.next())%len(words)],
					ResourceNamesSubscribe: []string{names[int(r.next())%len(names)], names[int(r.next())%len(names)]}}
				if r.next()%2 == 0 {
					req.Node = &core.Node{Id: words[int(r.next())%len(words)], UserAgentName: []string{"envoy", "gRPC Go"}[r.next()%2]}
				}
				_ = cb.OnStreamDeltaRequest(id, req)
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.deltaStreams) != len(open) {
			t.Fatalf("%d delta streams tracked, %d open", len(s.deltaStreams), len(open))
		}
		for id, ds := range s.deltaStreams {
			for typ := range ds.sent {
				if !deltaServed(typ) {
					t.Fatalf("stream %d keeps state for unserved type %q", id, typ)
				}
			}
		}
	})
}

// TestDiffLocalityShifted: the shifted walk names every endpoint as
// lbName does and records exactly the messages that changed and the
// names that went, whatever moved; a duplicate address is left to the
// full comparison, which refuses it.
func TestDiffLocalityShifted(t *testing.T) {
	const coll = "xdstp://isobar/envoy.config.endpoint.v3.LbEndpoint/m/r1/r1/*"
	lb := func(host string, w uint32) *endpoint.LbEndpoint {
		return &endpoint.LbEndpoint{LoadBalancingWeight: wrapperspb.UInt32(w), HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
			Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
				Address: host, PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8000}}}}}}}
	}
	var prevLbs []*endpoint.LbEndpoint
	for i := range 6 {
		prevLbs = append(prevLbs, lb(fmt.Sprintf("10.0.0.%d", i+1), 1))
	}
	prev := &ledsLocality{coll: coll, lbs: prevLbs}
	u0 := &ledsUpdate{toUpdate: map[string]types.Resource{}}
	if err := u0.diffLocality("m", prev, nil); err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return prev.names[i] }
	for _, tc := range []struct {
		label   string
		lbs     []*endpoint.LbEndpoint
		updated []string
		deleted []string
	}{
		{"unchanged", prevLbs, nil, nil},
		{"one removed", slices.Delete(slices.Clone(prevLbs), 2, 3), nil, []string{name(2)}},
		{"two removed", []*endpoint.LbEndpoint{prevLbs[1], prevLbs[2], prevLbs[4], prevLbs[5]}, nil, []string{name(0), name(3)}},
		{"one added", slices.Insert(slices.Clone(prevLbs), 3, lb("10.0.0.35", 1)), []string{lbName(coll, lb("10.0.0.35", 1))}, nil},
		{"one reweighted, one removed", []*endpoint.LbEndpoint{prevLbs[0], lb("10.0.0.2", 7), prevLbs[3], prevLbs[4], prevLbs[5]}, []string{name(1)}, []string{name(2)}},
	} {
		loc := &ledsLocality{coll: coll, lbs: tc.lbs, names: make([]string, len(tc.lbs))}
		u := &ledsUpdate{toUpdate: map[string]types.Resource{}}
		if !u.diffShifted("m", loc, prev) {
			t.Fatalf("%s: left to the full comparison", tc.label)
		}
		got := slices.Sorted(maps.Keys(u.toUpdate))
		if want := slices.Sorted(slices.Values(tc.updated)); !slices.Equal(got, want) {
			t.Errorf("%s: updated %v, want %v", tc.label, got, want)
		}
		if got, want := slices.Sorted(slices.Values(u.toDelete)), slices.Sorted(slices.Values(tc.deleted)); !slices.Equal(got, want) {
			t.Errorf("%s: deleted %v, want %v", tc.label, got, want)
		}
		for j, l := range tc.lbs {
			if want := lbName(coll, l); loc.names[j] != want {
				t.Errorf("%s: endpoint %d named %q, want %q", tc.label, j, loc.names[j], want)
			}
		}
	}
	dupLbs := slices.Insert(slices.Clone(prevLbs), 2, lb("10.0.0.2", 3))
	dup := &ledsLocality{coll: coll, lbs: dupLbs, names: make([]string, len(dupLbs))}
	u := &ledsUpdate{toUpdate: map[string]types.Resource{}}
	if u.diffShifted("m", dup, prev) || len(u.toUpdate) > 0 || len(u.toDelete) > 0 {
		t.Errorf("a duplicate address: taken by the shifted walk (%v, %v)", u.toUpdate, u.toDelete)
	}
	if err := u.diffLocality("m", dup, prev); err == nil {
		t.Error("a duplicate address: accepted")
	}
}
