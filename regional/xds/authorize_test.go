package xds

import (
	"context"
	"errors"
	"net"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Deps.Authorize sees every state-of-the-world stream, delta stream and
// fetch before it is served; a refusal is PermissionDenied with its text,
// and counted.
func TestAuthorize(t *testing.T) {
	logger, _ := newTLogger(t)
	reg := prometheus.NewRegistry()
	authorize := func(ctx context.Context) error {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-identity"); len(v) == 1 && v[0] == "gateway" {
			return nil
		}
		return errors.New("not a gateway of this region")
	}
	xs, err := NewServer(testConfig(), Deps{Logger: logger, Registerer: reg, Clock: clockwork.NewFakeClock(), Authorize: authorize})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	xs.Register(gs)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	t.Cleanup(func() { xs.Stop(); gs.Stop(); <-done })
	if _, err := xs.Push(State{Models: []Model{fleet("m", 2)}}); err != nil {
		t.Fatal(err)
	}
	conn := dial(t, lis.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	as := func(id string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-identity", id) }
	req := &discovery.DiscoveryRequest{Node: &core.Node{Id: "gw"}, TypeUrl: resource.ClusterType}

	sotw := func(ctx context.Context) error {
		st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		_ = st.Send(req)
		_, err = st.Recv()
		return err
	}
	delta := func(ctx context.Context) error {
		st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
		if err != nil {
			return err
		}
		_ = st.Send(&discovery.DeltaDiscoveryRequest{Node: req.Node, TypeUrl: resource.ClusterType})
		_, err = st.Recv()
		return err
	}
	fetch := func(ctx context.Context) error {
		_, err := clusterservice.NewClusterDiscoveryServiceClient(conn).FetchClusters(ctx, req)
		return err
	}
	if err := sotw(as("gateway")); err != nil {
		t.Fatalf("authorised stream: %v", err)
	}
	if got := testutil.ToFloat64(xs.m.refused); got != 0 {
		t.Fatalf("refused = %v after an authorised stream", got)
	}
	for i, call := range []struct {
		name string
		do   func(context.Context) error
	}{{"sotw", sotw}, {"delta", delta}, {"fetch", fetch}} {
		err := call.do(as("cell"))
		if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "not a gateway of this region" {
			t.Errorf("%s: %v; want PermissionDenied with the Authorize error", call.name, err)
		}
		if got := testutil.ToFloat64(xs.m.refused); got != float64(i+1) {
			t.Errorf("%s: refused = %v, want %d", call.name, got, i+1)
		}
	}
}
