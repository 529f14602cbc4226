package interop

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/regional/xds"
)

// verdicts records, per client user agent, the first ACK or NACK of each
// resource type a go-control-plane ADS server saw.
type verdicts struct {
	mu    sync.Mutex
	nonce map[int64]map[string]bool // stream → nonces sent
	agent map[int64]string
	got   map[string]map[string]string // agent → type → "ACK" or the NACK detail
}

func (v *verdicts) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			v.mu.Lock()
			defer v.mu.Unlock()
			if req.GetNode() != nil {
				v.agent[id] = req.GetNode().GetUserAgentName()
			}
			if req.GetResponseNonce() == "" || !v.nonce[id][req.GetResponseNonce()] {
				return nil
			}
			a := v.agent[id]
			if v.got[a] == nil {
				v.got[a] = map[string]string{}
			}
			typ := req.GetTypeUrl()[strings.LastIndex(req.GetTypeUrl(), ".")+1:]
			if _, seen := v.got[a][typ]; !seen {
				if d := req.GetErrorDetail(); d != nil {
					v.got[a][typ] = "NACK: " + d.GetMessage()
				} else {
					v.got[a][typ] = "ACK"
				}
			}
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			v.mu.Lock()
			defer v.mu.Unlock()
			if v.nonce[id] == nil {
				v.nonce[id] = map[string]bool{}
			}
			v.nonce[id][resp.GetNonce()] = true
		},
	}
}

func (v *verdicts) of(agentPrefix, typ string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	for a, m := range v.got {
		if strings.HasPrefix(a, agentPrefix) {
			return m[typ]
		}
	}
	return ""
}

// serveBroken serves isobar's gRPC resource set for model with every
// Cluster's load_balancing_policy cut down to its first entry — the
// least_request-only list isobar sent before issue 23 — from a
// go-control-plane ADS server on loopback.
func serveBroken(t *testing.T, backendAddr string) (string, *verdicts) {
	t.Helper()
	host, port, _ := net.SplitHostPort(backendAddr)
	var p uint32
	for _, c := range port {
		p = p*10 + uint32(c-'0')
	}
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Build(xds.State{Models: []xds.Model{{Name: model, Localities: []xds.Locality{{Weight: 1,
		Endpoints: []xds.Endpoint{{CellID: "cell-0", Host: host, Port: p, Weight: 1}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var clusters []types.Resource
	for _, c := range res.GRPC.Clusters {
		c = proto.Clone(c).(*cluster.Cluster)
		c.LoadBalancingPolicy.Policies = c.LoadBalancingPolicy.Policies[:1] // least_request only
		clusters = append(clusters, c)
	}
	var listeners, endpoints []types.Resource
	for _, l := range res.GRPC.Listeners {
		listeners = append(listeners, l)
	}
	for _, e := range res.GRPC.Endpoints {
		endpoints = append(endpoints, e)
	}
	snap, err := cache.NewSnapshot("1", map[resource.Type][]types.Resource{
		resource.ListenerType: listeners, resource.ClusterType: clusters, resource.EndpointType: endpoints,
	})
	if err != nil {
		t.Fatal(err)
	}
	sc := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	v := &verdicts{nonce: map[int64]map[string]bool{}, agent: map[int64]string{}, got: map[string]map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, sc, v.callbacks())
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(func() { cancel(); gs.Stop() })
	for _, j := range []string{"grpc-js-xds", "c-core", "c-core+custom-lb"} {
		if err := sc.SetSnapshot(ctx, "interop-"+j, snap); err != nil {
			t.Fatal(err)
		}
	}
	return ln.Addr().String(), v
}

// TestJudgesRefuseLeastRequestOnly is the judges' negative case: served the
// Cluster isobar sent before issue 23 (load_balancing_policy holding only
// least_request), grpc-js-xds and C-core with custom LB configs on must
// NACK it, and C-core 1.51 without GRPC_EXPERIMENTAL_XDS_CUSTOM_LB_CONFIG
// must ACK it — it ignores load_balancing_policy and runs the unset
// lb_policy enum, ROUND_ROBIN. That is the issue's "NACK in one run, ACK
// in another": the two runs differed in that variable. The NACK texts are
// logged as "NACK-TEXT".
func TestJudgesRefuseLeastRequestOnly(t *testing.T) {
	suite(t)
	js := judges(t)
	be := startBackend(t, "b0")
	addr, v := serveBroken(t, be.addr)
	// The verdict each judge must give: ACK, or NACK with that text in its
	// error detail.
	want := map[string][2]string{
		"grpc-js-xds":      {"NACK", "load_balancing_policy parsing failed with error No registered LB policy found in list"},
		"c-core":           {"ACK", ""},
		"c-core+custom-lb": {"NACK", "no supported load balancing policy config found"},
	}
	agents := map[string]string{"grpc-js-xds": "gRPC Node", "c-core": "gRPC C-core", "c-core+custom-lb": "gRPC C-core"}
	for _, j := range js {
		t.Run(j.name, func(t *testing.T) {
			c := startClient(t, j, addr)
			poll(t, j.name+" answers the Cluster", 60*time.Second, func() (bool, string) {
				got := v.of(agents[j.name], "Cluster")
				v.mu.Lock()
				defer v.mu.Unlock()
				return got != "", fmt.Sprintf("%q; seen %v", got, v.got)
			})
			got := v.of(agents[j.name], "Cluster")
			w := want[j.name]
			if !strings.HasPrefix(got, w[0]) || !strings.Contains(got, w[1]) {
				t.Errorf("%s on a least_request-only Cluster: %q, want %s %q", j.name, got, w[0], w[1])
			}
			t.Logf("NACK-TEXT %s: %s", j.name, got)
			c.p.stop()
			v.mu.Lock()
			clear(v.got) // the next judge shares the Python user agent
			v.mu.Unlock()
		})
	}
}
