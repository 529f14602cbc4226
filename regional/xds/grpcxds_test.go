package xds

import (
	"context"
	"fmt"
	"math"
	"net"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// startBackends starts n gRPC servers on 127.0.0.1 serving the standard
// health service; the client learns which one answered from the peer.
func startBackends(t *testing.T, n int) []*net.TCPAddr {
	t.Helper()
	addrs := make([]*net.TCPAddr, n)
	for i := range addrs {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = s.Serve(lis)
		}()
		t.Cleanup(func() {
			s.Stop()
			<-done
		})
		addrs[i] = lis.Addr().(*net.TCPAddr)
	}
	return addrs
}

// split sends n RPCs and counts them per backend address.
func split(t *testing.T, client healthpb.HealthClient, n int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out := make(map[string]int)
	for range n {
		var p peer.Peer
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
			t.Fatalf("RPC failed: %v", err)
		}
		out[p.Addr.String()]++
	}
	return out
}

// TestGRPCResolverHonoursWeights drives grpc-go's own xDS resolver and
// ring_hash balancer from this server, in front of three real backends.
func TestGRPCResolverHonoursWeights(t *testing.T) {
	if testing.Short() {
		t.Skip("sends a few thousand RPCs")
	}
	cfg := testConfig()
	cfg.LBPolicy = xdscontract.RingHash
	ts := startServer(t, cfg)
	backends := startBackends(t, 3)
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	weights := []uint32{1, 2, 5}
	state := func(n int) State {
		eps := make([]Endpoint, n)
		for i := range eps {
			eps[i] = Endpoint{CellID: fmt.Sprintf("cell-%d", i), Host: backends[i].IP.String(), Port: uint32(backends[i].Port), Weight: weights[i]}
		}
		return State{Models: []Model{{Name: model, Localities: []Locality{{Weight: 1, Endpoints: eps}}}}}
	}
	v1, err := ts.xds.Push(state(3))
	if err != nil {
		t.Fatal(err)
	}

	conn := dialXDS(t, ts, model)
	for _, typ := range []string{resource.ListenerType, resource.ClusterType, resource.EndpointType} {
		waitAck(t, ts.xds, typ, v1)
	}
	client := healthpb.NewHealthClient(conn)

	// Every backend is reachable before measuring (ring_hash connects lazily).
	seen := make(map[string]int)
	waitFor(t, "all three backends answering", func() bool {
		for a, c := range split(t, client, 50) {
			seen[a] += c
		}
		return len(seen) == 3
	})

	const rpcs = 2000
	got := split(t, client, rpcs)
	total := float64(weights[0] + weights[1] + weights[2])
	for i, b := range backends {
		want := float64(weights[i]) / total
		share := float64(got[b.String()]) / rpcs
		t.Logf("backend %d weight %d: %.1f%% of %d RPCs (want %.1f%%)", i, weights[i], 100*share, rpcs, 100*want)
		if math.Abs(share-want) > 0.05 {
			t.Errorf("backend %d got %.1f%%, want %.1f%% ± 5 pp", i, 100*share, 100*want)
		}
	}

	// Remove the heaviest backend; once the new version is ACKed and the
	// picker has moved, no RPC reaches it.
	removed := backends[2].String()
	v2, err := ts.xds.Push(state(2))
	if err != nil {
		t.Fatal(err)
	}
	waitAck(t, ts.xds, resource.EndpointType, v2)
	waitFor(t, "the picker to drop the removed backend", func() bool {
		return split(t, client, 200)[removed] == 0
	})
	got = split(t, client, 1000)
	if got[removed] != 0 {
		t.Errorf("%d of 1000 RPCs reached the removed backend", got[removed])
	}
	share0 := float64(got[backends[0].String()]) / 1000
	t.Logf("after removal: backend 0 %.1f%%, backend 1 %.1f%% (want 33.3%% / 66.7%%)", 100*share0, 100*(1-share0))
	if math.Abs(share0-1.0/3) > 0.06 {
		t.Errorf("after removal backend 0 got %.1f%%, want 33.3%% ± 6 pp", 100*share0)
	}

	for _, s := range ts.xds.Streams() {
		if s.Kind != KindGRPC || s.UserAgent != "gRPC Go" {
			t.Errorf("stream %+v: want a gRPC Go node", s)
		}
	}
	for _, typ := range []string{"listener", "route", "cluster", "endpoint"} {
		if n := metricValue(t, ts.xds.m.nacks.WithLabelValues(typ)); n != 0 {
			t.Errorf("grpc-go rejected %v %s responses", n, typ)
		}
	}
}

// dialXDS returns a proxyless gRPC client for model, bootstrapped at ts.
func dialXDS(t *testing.T, ts *testServer, model string) *grpc.ClientConn {
	t.Helper()
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],`+
		`"server_features":["ignore_resource_deletion"]}],"node":{"id":"proxyless-test"}}`, ts.addr)
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///"+model, grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.Connect()
	return conn
}

// TestGRPCResolverAcceptsEveryPolicy checks that grpc-go accepts (ACKs) the
// listener, cluster and assignment under each policy and routes RPCs, and
// that locality weights hold under round_robin.
func TestGRPCResolverAcceptsEveryPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("sends a few thousand RPCs")
	}
	for _, policy := range []xdscontract.LBPolicy{xdscontract.LeastRequest, xdscontract.RoundRobin, xdscontract.RingHash} {
		t.Run(string(policy), func(t *testing.T) {
			cfg := testConfig()
			cfg.LBPolicy = policy
			ts := startServer(t, cfg)
			b := startBackends(t, 2)
			// Two localities, one backend each, locality weights 1:3.
			v, err := ts.xds.Push(State{Models: []Model{{Name: "m", Localities: []Locality{
				{Weight: 1, Endpoints: []Endpoint{{CellID: "a", Host: "127.0.0.1", Port: uint32(b[0].Port), Weight: 1}}},
				{Region: "eu-west", Weight: 3, Endpoints: []Endpoint{{CellID: "b", Host: "127.0.0.1", Port: uint32(b[1].Port), Weight: 1}}},
			}}}})
			if err != nil {
				t.Fatal(err)
			}
			conn := dialXDS(t, ts, "m")
			for _, typ := range []string{resource.ListenerType, resource.ClusterType, resource.EndpointType} {
				waitAck(t, ts.xds, typ, v)
			}
			client := healthpb.NewHealthClient(conn)
			seen := make(map[string]int)
			waitFor(t, "both backends answering", func() bool {
				for a, c := range split(t, client, 20) {
					seen[a] += c
				}
				return len(seen) == 2
			})
			for _, typ := range []string{"listener", "route", "cluster", "endpoint"} {
				if n := metricValue(t, ts.xds.m.nacks.WithLabelValues(typ)); n != 0 {
					t.Errorf("grpc-go rejected %v %s responses", n, typ)
				}
			}
			if policy != xdscontract.RoundRobin {
				return // grpc-go ignores locality weights under least_request
			}
			got := split(t, client, 1000)
			share := float64(got[b[1].String()]) / 1000
			t.Logf("round_robin locality weights 1:3: %.1f%% to the weight-3 locality (want 75%%)", 100*share)
			if math.Abs(share-0.75) > 0.05 {
				t.Errorf("weight-3 locality got %.1f%%, want 75%% ± 5 pp", 100*share)
			}
		})
	}
}

// TestGRPCResolverAcceptsDegraded checks that grpc-go ACKs an assignment
// with a DEGRADED endpoint under the default (typed least_request) policy.
// grpc-go, unlike Envoy, drops DEGRADED endpoints (it keeps only HEALTHY
// and UNKNOWN), so every RPC goes to the healthy one.
func TestGRPCResolverAcceptsDegraded(t *testing.T) {
	ts := startServer(t, testConfig())
	b := startBackends(t, 2)
	v, err := ts.xds.Push(State{Models: []Model{{Name: "m", Localities: []Locality{{Weight: 1, Endpoints: []Endpoint{
		{CellID: "a", Host: "127.0.0.1", Port: uint32(b[0].Port), Weight: 100},
		{CellID: "b", Host: "127.0.0.1", Port: uint32(b[1].Port), Weight: 100, Degraded: true},
	}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	conn := dialXDS(t, ts, "m")
	for _, typ := range []string{resource.ListenerType, resource.ClusterType, resource.EndpointType} {
		waitAck(t, ts.xds, typ, v)
	}
	got := split(t, healthpb.NewHealthClient(conn), 100)
	if got[b[0].String()] != 100 {
		t.Errorf("split %v, want every RPC on the healthy endpoint %s", got, b[0])
	}
	for _, typ := range []string{"listener", "route", "cluster", "endpoint"} {
		if n := metricValue(t, ts.xds.m.nacks.WithLabelValues(typ)); n != 0 {
			t.Errorf("grpc-go rejected %v %s responses", n, typ)
		}
	}
}
