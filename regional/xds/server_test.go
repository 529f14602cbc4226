package xds

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	sotwclient "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// testTimeout bounds every wait on a loopback event; reaching it is a failure.
const testTimeout = 20 * time.Second

type testServer struct {
	xds  *Server
	addr string
	reg  *prometheus.Registry
	logs <-chan string
}

// startServer serves a new Server on 127.0.0.1; cleanup stops both servers
// and joins the serving goroutine.
func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	logger, logs := newTLogger(t)
	ts := startServerLogging(t, cfg, logger)
	ts.logs = logs
	return ts
}

// startServerLogging is startServer logging to logger (its logs channel
// nil).
func startServerLogging(t testing.TB, cfg Config, logger *slog.Logger) *testServer {
	t.Helper()
	reg := prometheus.NewRegistry()
	xs, err := NewServer(cfg, Deps{Logger: logger, Registerer: reg, Clock: clockwork.NewFakeClock()})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	xs.Register(gs)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	t.Cleanup(func() {
		xs.Stop()
		gs.Stop()
		// ErrServerStopped: Stop ran before Serve started.
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	return &testServer{xds: xs, addr: lis.Addr().String(), reg: reg}
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// adsClient is go-control-plane's ADS client for one type, with Fetch run on
// a goroutine so that tests can wait on it with a deadline.
type adsClient struct {
	t      *testing.T
	c      sotwclient.ADSClient
	cancel context.CancelFunc
}

func newADSClient(t *testing.T, conn *grpc.ClientConn, node *core.Node, typeURL string) *adsClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := sotwclient.NewADSClient(ctx, node, typeURL)
	if err := c.InitConnect(conn); err != nil {
		cancel()
		t.Fatalf("InitConnect: %v", err)
	}
	t.Cleanup(cancel)
	return &adsClient{t: t, c: c, cancel: cancel}
}

// fetch returns the next response's resources.
func (a *adsClient) fetch() []*anypb.Any {
	a.t.Helper()
	type result struct {
		r   *sotwclient.Response
		err error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := a.c.Fetch()
		ch <- result{r, err}
	}()
	select {
	case res := <-ch:
		if res.err != nil {
			a.t.Fatalf("Fetch: %v", res.err)
		}
		return res.r.Resources
	case <-time.After(testTimeout):
		a.cancel() // unblocks Fetch so its goroutine ends
		<-ch
		a.t.Fatal("no xDS response before the deadline")
		return nil
	}
}

func assignments(t *testing.T, rs []*anypb.Any) map[string]map[string]uint32 {
	t.Helper()
	out := make(map[string]map[string]uint32)
	for _, a := range rs {
		var cla endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			t.Fatalf("unmarshal assignment: %v", err)
		}
		w := make(map[string]uint32)
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				w[e.GetMetadata().GetFilterMetadata()[xdscontract.MetadataKey].GetFields()["cell"].GetStringValue()] = e.GetLoadBalancingWeight().GetValue()
			}
		}
		out[cla.GetClusterName()] = w
	}
	return out
}

func waitAck(t *testing.T, s *Server, typeURL, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := s.WaitForAck(ctx, typeURL, version); err != nil {
		t.Fatalf("WaitForAck(%s, %s): %v", typeLabel(typeURL), version, err)
	}
}

func gatewayNode(id string) *core.Node { return &core.Node{Id: id, UserAgentName: "isobar-gateway"} }

func TestADSClientReceivesWeightsAndUpdates(t *testing.T) {
	ts := startServer(t, testConfig())
	m := Model{Name: "m", Localities: []Locality{local(ep("c1", "10.0.0.1", 8000, 1), ep("c2", "10.0.0.2", 8000, 2), ep("c3", "10.0.0.3", 8000, 5))}}
	v1, err := ts.xds.Push(State{Models: []Model{m}})
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, ts.addr)
	eds := newADSClient(t, conn, gatewayNode("gw-1"), resource.EndpointType)
	cds := newADSClient(t, conn, gatewayNode("gw-2"), resource.ClusterType)

	// Envoy-kind nodes get the main cluster and its Envoy-only siblings
	// (local, context classes): count them with a builder of their own.
	setSize := func(st State) int {
		res, err := mustBuilder(t, testConfig()).Build(st)
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Envoy.Clusters)
	}
	want1 := setSize(State{Models: []Model{m}})
	got := assignments(t, eds.fetch())
	if w := got[xdscontract.ClusterName("m")]; len(got) != want1 || w["c1"] != 1 || w["c2"] != 2 || w["c3"] != 5 || len(w) != 3 {
		t.Fatalf("first assignment = %v, want %d assignments, main c1:1 c2:2 c3:5", got, want1)
	}
	if err := eds.c.Ack(); err != nil {
		t.Fatal(err)
	}
	if rs := cds.fetch(); len(rs) != want1 {
		t.Fatalf("first CDS response holds %d clusters, want %d", len(rs), want1)
	}
	if err := cds.c.Ack(); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ts.xds, resource.EndpointType, v1)
	waitAck(t, ts.xds, resource.ClusterType, v1)

	// Change one weight and remove an endpoint: only EDS moves.
	m.Localities[0].Endpoints = []Endpoint{ep("c1", "10.0.0.1", 8000, 4), ep("c3", "10.0.0.3", 8000, 5)}
	v2, err := ts.xds.Push(State{Models: []Model{m}})
	if err != nil {
		t.Fatal(err)
	}
	got = assignments(t, eds.fetch())
	if w := got[xdscontract.ClusterName("m")]; len(w) != 2 || w["c1"] != 4 || w["c3"] != 5 {
		t.Fatalf("second assignment = %v, want c1:4 c3:5", got)
	}
	if err := eds.c.Ack(); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ts.xds, resource.EndpointType, v2)
	// The weight change did not bump CDS: the cluster ACK of v1 still
	// satisfies v2.
	waitAck(t, ts.xds, resource.ClusterType, v2)

	// Adding a model changes CDS. If the weight change had sent a spurious
	// CDS response, this fetch would return it, with one cluster.
	v3, err := ts.xds.Push(State{Models: []Model{m, fleet("n", 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if rs, want := cds.fetch(), setSize(State{Models: []Model{m, fleet("n", 1)}}); len(rs) != want || want <= want1 {
		t.Fatalf("CDS response after adding a model holds %d clusters, want %d", len(rs), want)
	}
	if err := cds.c.Ack(); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ts.xds, resource.ClusterType, v3)

	if n := metricValue(t, ts.xds.m.nacks.WithLabelValues("endpoint")) + metricValue(t, ts.xds.m.nacks.WithLabelValues("cluster")); n != 0 {
		t.Errorf("%v NACKs counted, want 0", n)
	}
	if n := metricValue(t, ts.xds.m.acks.WithLabelValues("endpoint")); n != 2 {
		t.Errorf("%v endpoint ACKs counted, want 2", n)
	}
	if n := metricValue(t, ts.xds.m.acks.WithLabelValues("cluster")); n != 2 {
		t.Errorf("%v cluster ACKs counted, want 2", n)
	}
	byNode := make(map[string]StreamStatus)
	for _, s := range ts.xds.Streams() {
		byNode[s.NodeID] = s
	}
	if len(byNode) != 2 || byNode["gw-1"].Kind != KindEnvoy || byNode["gw-1"].UserAgent != "isobar-gateway" ||
		byNode["gw-1"].Types[resource.EndpointType].Acked != v2 || byNode["gw-2"].Types[resource.ClusterType].Acked != v3 {
		t.Errorf("Streams() = %+v", byNode)
	}
}

func TestADSClientNackIsCountedLoggedOnceAndNotResent(t *testing.T) {
	ts := startServer(t, testConfig())
	m := Model{Name: "m", Localities: []Locality{local(ep("c1", "10.0.0.1", 8000, 1))}}
	v1, err := ts.xds.Push(State{Models: []Model{m}})
	if err != nil {
		t.Fatal(err)
	}
	eds := newADSClient(t, dial(t, ts.addr), gatewayNode("picky"), resource.EndpointType)
	eds.fetch()
	if err := eds.c.Nack("weights look wrong"); err != nil {
		t.Fatal(err)
	}
	// Wait for the NACK to be recorded.
	waitFor(t, "NACK recorded", func() bool { return ts.xds.Streams()[0].Types[resource.EndpointType].Nacked == v1 })
	st := ts.xds.Streams()[0].Types[resource.EndpointType]
	if st.NackDetail != "weights look wrong" || st.Acked != "" {
		t.Errorf("stream type status = %+v", st)
	}
	if n := metricValue(t, ts.xds.m.nacks.WithLabelValues("endpoint")); n != 1 {
		t.Errorf("%v endpoint NACKs counted, want 1", n)
	}

	// Without the rewrite, the cache would resend v1 at once; the next
	// response must be the new version instead.
	m.Localities[0].Endpoints[0].Weight = 7
	v2, err := ts.xds.Push(State{Models: []Model{m}})
	if err != nil {
		t.Fatal(err)
	}
	if w := assignments(t, eds.fetch())[xdscontract.ClusterName("m")]["c1"]; w != 7 {
		t.Fatalf("response after NACK has weight %d, want the new 7 (the rejected version was resent)", w)
	}
	// Reject v2 as well, then a second NACK of the same version (the client
	// repeating itself) is counted but not logged again.
	if err := eds.c.Nack("still wrong"); err != nil {
		t.Fatal(err)
	}
	if err := eds.c.Nack("still wrong"); err != nil {
		t.Fatal(err)
	}
	m.Localities[0].Endpoints[0].Weight = 8
	v3, err := ts.xds.Push(State{Models: []Model{m}})
	if err != nil {
		t.Fatal(err)
	}
	if w := assignments(t, eds.fetch())[xdscontract.ClusterName("m")]["c1"]; w != 8 {
		t.Fatalf("weight %d, want 8", w)
	}
	if err := eds.c.Ack(); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ts.xds, resource.EndpointType, v3)

	nackLogs := 0
	for done := false; !done; {
		select {
		case msg := <-ts.logs:
			if msg == "xds client rejected resources" {
				nackLogs++
			}
		default:
			done = true
		}
	}
	// v1 and v2 were each logged once; the repeated NACK of v2 arrives with
	// a stale nonce or the same version and is not logged again.
	if nackLogs != 2 {
		t.Errorf("%d NACK log lines, want 2 (once per rejected version)", nackLogs)
	}
	if got := ts.xds.Streams()[0].Types[resource.EndpointType]; got.Nacked != v2 || got.Acked != v3 {
		t.Errorf("stream type status = %+v, want nacked %s acked %s", got, v2, v3)
	}
}

func TestPushRefusedKeepsPreviousSnapshot(t *testing.T) {
	ts := startServer(t, testConfig())
	good := State{Models: []Model{fleet("m", 3)}}
	v1, err := ts.xds.Push(good)
	if err != nil {
		t.Fatal(err)
	}
	before, err := ts.xds.cache.GetSnapshot(string(KindEnvoy))
	if err != nil {
		t.Fatal(err)
	}
	bad := State{Models: []Model{fleet("m", 3)}}
	bad.Models[0].Localities[0].Endpoints[1].Weight = 0
	if _, err := ts.xds.Push(bad); !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "weight 0") {
		t.Fatalf("Push(bad) = %v", err)
	}
	after, _ := ts.xds.cache.GetSnapshot(string(KindEnvoy))
	if after != before || ts.xds.Version() != v1 {
		t.Error("a refused push replaced the snapshot")
	}
	if n := metricValue(t, ts.xds.m.pushErrors); n != 1 {
		t.Errorf("push errors = %v, want 1", n)
	}
	if n := metricValue(t, ts.xds.m.pushes); n != 1 {
		t.Errorf("pushes = %v, want 1", n)
	}
}

func snapshotVersions(t *testing.T, s *Server, k NodeKind) [numTypes]string {
	t.Helper()
	snap, err := s.cache.GetSnapshot(string(k))
	if err != nil {
		t.Fatal(err)
	}
	var out [numTypes]string
	for i := range numTypes {
		out[i] = snap.(*cache.Snapshot).GetVersion(i.url())
	}
	return out
}

func TestVersionsMoveOnlyWithContent(t *testing.T) {
	xs, err := NewServer(testConfig(), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer xs.Stop()
	st := State{Models: []Model{fleet("a", 4)}}
	push := func() string {
		t.Helper()
		v, err := xs.Push(st)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	type vs = [numTypes]string // listener, route, cluster, endpoint
	steps := []struct {
		name        string
		edit        func()
		version     string
		envoy, grpc vs
	}{
		{"first push", func() {}, "1", vs{"1", "1", "1", "1"}, vs{"1", "1", "1", "1"}},
		{"same state", func() {}, "1", vs{"1", "1", "1", "1"}, vs{"1", "1", "1", "1"}},
		{"same state reordered", func() {
			e := st.Models[0].Localities[0].Endpoints
			e[0], e[3] = e[3], e[0]
		}, "1", vs{"1", "1", "1", "1"}, vs{"1", "1", "1", "1"}},
		{"weight change", func() { st.Models[0].Localities[0].Endpoints[1].Weight++ }, "2", vs{"1", "1", "1", "2"}, vs{"1", "1", "1", "2"}},
		{"add a model", func() { st.Models = append(st.Models, fleet("b", 1)) }, "3", vs{"1", "3", "3", "3"}, vs{"3", "1", "3", "3"}},
		{"remove it", func() { st.Models = st.Models[:1] }, "4", vs{"1", "4", "4", "4"}, vs{"4", "1", "4", "4"}},
		{"shed by criticality", func() { st.Models[0].ShedSheddable = 0.5 }, "5", vs{"1", "5", "4", "4"}, vs{"4", "1", "4", "4"}},
		{"retry budget", func() { st.Models[0].RetryBudgetPercent = 5 }, "6", vs{"1", "5", "6", "4"}, vs{"4", "1", "6", "4"}},
		{"retry budget rounds to the same", func() { st.Models[0].RetryBudgetPercent = 5.2 }, "6", vs{"1", "5", "6", "4"}, vs{"4", "1", "6", "4"}},
		{"pin a residency set", func() {
			st.Models[0].Pinned = []Pinned{{Set: "us", Regions: []string{"us-east"}, Localities: copyLocalities(st.Models[0].Localities, nil)}}
		}, "7", vs{"1", "7", "7", "7"}, vs{"4", "1", "6", "4"}},
		{"pinned copy, unchanged", func() { st.Models[0].Pinned[0].Localities = copyLocalities(st.Models[0].Pinned[0].Localities, nil) },
			"7", vs{"1", "7", "7", "7"}, vs{"4", "1", "6", "4"}},
		{"pinned weight change", func() { st.Models[0].Pinned[0].Localities[0].Endpoints[0].Weight++ },
			"8", vs{"1", "7", "7", "8"}, vs{"4", "1", "6", "4"}},
	}
	for _, s := range steps {
		s.edit()
		if v := push(); v != s.version {
			t.Errorf("%s: version %s, want %s", s.name, v, s.version)
		}
		if got := snapshotVersions(t, xs, KindEnvoy); got != s.envoy {
			t.Errorf("%s: envoy versions %v, want %v", s.name, got, s.envoy)
		}
		if got := snapshotVersions(t, xs, KindGRPC); got != s.grpc {
			t.Errorf("%s: grpc versions %v, want %v", s.name, got, s.grpc)
		}
	}
}

func TestNodeKindsGetTheirSets(t *testing.T) {
	ts := startServer(t, testConfig())
	v, err := ts.xds.Push(State{Models: []Model{fleet("m1", 2), fleet("m2", 2)}})
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, ts.addr)
	names := func(rs []*anypb.Any) []string {
		var out []string
		for _, a := range rs {
			var l listener.Listener
			if err := a.UnmarshalTo(&l); err != nil {
				t.Fatal(err)
			}
			out = append(out, l.GetName())
		}
		return out
	}
	envoyLDS := newADSClient(t, conn, &core.Node{Id: "envoy-1", UserAgentName: "envoy"}, resource.ListenerType)
	if got := names(envoyLDS.fetch()); len(got) != 1 || got[0] != xdscontract.ListenerName {
		t.Errorf("envoy node got listeners %v, want [%s]", got, xdscontract.ListenerName)
	}
	grpcLDS := newADSClient(t, conn, &core.Node{Id: "whatever-id", UserAgentName: "gRPC Go"}, resource.ListenerType)
	got := names(grpcLDS.fetch())
	if len(got) != 2 || !(got[0] == "m1" && got[1] == "m2" || got[0] == "m2" && got[1] == "m1") {
		t.Errorf("gRPC node got listeners %v, want [m1 m2]", got)
	}
	if err := grpcLDS.c.Ack(); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ts.xds, resource.ListenerType, v)
}

func TestStopAndWaitForAckErrors(t *testing.T) {
	ts := startServer(t, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := ts.xds.WaitForAck(ctx, resource.EndpointType, "1"); !errors.Is(err, ErrBadVersion) {
		t.Errorf("WaitForAck before any push = %v, want ErrBadVersion", err)
	}
	if err := ts.xds.WaitForAck(ctx, resource.EndpointType, "x"); !errors.Is(err, ErrBadVersion) {
		t.Errorf("WaitForAck(x) = %v", err)
	}
	v, err := ts.xds.Push(State{Models: []Model{fleet("m", 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.xds.WaitForAck(ctx, resource.SecretType, v); !errors.Is(err, ErrBadVersion) {
		t.Errorf("WaitForAck(secret) = %v", err)
	}
	short, cancelShort := context.WithCancel(ctx)
	cancelShort()
	if err := ts.xds.WaitForAck(short, resource.EndpointType, v); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForAck(cancelled ctx) = %v", err)
	}

	eds := newADSClient(t, dial(t, ts.addr), gatewayNode("gw"), resource.EndpointType)
	eds.fetch()
	// A waiter for an ACK that never comes is released by Stop.
	waitErr := make(chan error, 1)
	go func() { waitErr <- ts.xds.WaitForAck(ctx, resource.EndpointType, v) }()
	ts.xds.Stop()
	ts.xds.Stop() // idempotent
	select {
	case err := <-waitErr:
		if !errors.Is(err, ErrStopped) {
			t.Errorf("WaitForAck across Stop = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Stop did not release WaitForAck")
	}
	if _, err := ts.xds.Push(State{}); !errors.Is(err, ErrStopped) {
		t.Errorf("Push after Stop = %v", err)
	}
	// The open stream was closed by Stop.
	if _, err := eds.c.Fetch(); err == nil {
		t.Error("Fetch after Stop succeeded")
	}
}

// TestDeltaStreamIsServedAndCounted: delta ADS is served from the same
// snapshots and counted in the stream gauge (its ACKs are not tracked).
func TestDeltaStreamIsServedAndCounted(t *testing.T) {
	ts := startServer(t, testConfig())
	if _, err := ts.xds.Push(State{Models: []Model{fleet("m", 2)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(dial(t, ts.addr)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{
		Node:                   gatewayNode("delta"),
		TypeUrl:                resource.EndpointType,
		ResourceNamesSubscribe: []string{xdscontract.ClusterName("m")},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != xdscontract.ClusterName("m") {
		t.Fatalf("delta response = %v", resp.GetResources())
	}
	if n := metricValue(t, ts.xds.m.streams); n != 1 {
		t.Errorf("connected streams = %v, want 1", n)
	}
	cancel()
	waitFor(t, "the delta stream to close", func() bool { return metricValue(t, ts.xds.m.streams) == 0 })
}
