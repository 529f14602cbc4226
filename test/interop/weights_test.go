package interop

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// ackLog records, per xDS node ID, the last version of each resource type
// the node ACKed and every NACK, from a go-control-plane ADS server.
type ackLog struct {
	mu     sync.Mutex
	node   map[int64]string          // stream → node ID
	nonce  map[int64]map[string]bool // stream → nonces sent
	acked  map[string]map[string]string
	nacked map[string][]string
}

func newAckLog() *ackLog {
	return &ackLog{node: map[int64]string{}, nonce: map[int64]map[string]bool{},
		acked: map[string]map[string]string{}, nacked: map[string][]string{}}
}

func (a *ackLog) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			if n := req.GetNode().GetId(); n != "" {
				a.node[id] = n // C-core sends the node on a stream's first request only
			}
			if req.GetResponseNonce() == "" || !a.nonce[id][req.GetResponseNonce()] {
				return nil
			}
			n := a.node[id]
			typ := req.GetTypeUrl()[strings.LastIndex(req.GetTypeUrl(), ".")+1:]
			if d := req.GetErrorDetail(); d != nil {
				a.nacked[n] = append(a.nacked[n], typ+": "+d.GetMessage())
				return nil
			}
			if a.acked[n] == nil {
				a.acked[n] = map[string]string{}
			}
			a.acked[n][typ] = req.GetVersionInfo()
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.nonce[id] == nil {
				a.nonce[id] = map[string]bool{}
			}
			a.nonce[id][resp.GetNonce()] = true
		},
	}
}

// check fails t on any NACK from node and unless node ACKed version of
// every type the gRPC set holds.
func (a *ackLog) check(t *testing.T, node, version string) (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.nacked[node]) > 0 {
		t.Errorf("%s NACKed: %v", node, a.nacked[node])
		return true, ""
	}
	for _, typ := range []string{"Listener", "Cluster", "ClusterLoadAssignment"} {
		if a.acked[node][typ] != version {
			return false, fmt.Sprintf("%s: ACKed %v, want version %s of every type", node, a.acked[node], version)
		}
	}
	return true, ""
}

// wlServer is a go-control-plane ADS server on loopback serving snapshots
// of isobar's gRPC resource set to the judges' node IDs.
type wlServer struct {
	addr  string
	sc    cache.SnapshotCache
	log   *ackLog
	nodes []string
	ver   int
}

func startWLServer(t *testing.T, nodes []string) *wlServer {
	t.Helper()
	s := &wlServer{sc: cache.NewSnapshotCache(true, cache.IDHash{}, nil), log: newAckLog(), nodes: nodes}
	ctx, cancel := context.WithCancel(context.Background())
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, s.sc, s.log.callbacks()))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(func() { cancel(); gs.Stop() })
	s.addr = ln.Addr().String()
	return s
}

// set serves the gRPC set (edit, when not nil, changes the
// ClusterLoadAssignments first) as the next snapshot version, which it
// returns.
func (s *wlServer) set(t *testing.T, set xds.Set, edit func(*endpoint.ClusterLoadAssignment)) string {
	t.Helper()
	s.ver++
	v := strconv.Itoa(s.ver)
	var ls, cs, es []types.Resource
	for _, l := range set.Listeners {
		ls = append(ls, l)
	}
	for _, c := range set.Clusters {
		cs = append(cs, c)
	}
	for _, e := range set.Endpoints {
		if edit != nil {
			e = proto.Clone(e).(*endpoint.ClusterLoadAssignment)
			edit(e)
		}
		es = append(es, e)
	}
	snap, err := cache.NewSnapshot(v, map[resource.Type][]types.Resource{
		resource.ListenerType: ls, resource.ClusterType: cs, resource.EndpointType: es,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Consistent(); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.nodes {
		if err := s.sc.SetSnapshot(context.Background(), n, snap); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// bandWeights are isobar's default weight bands (projection: MaxWeight 100,
// 3 bands: 100, 50, 25), one local cell in each.
var bandWeights = map[string]uint32{"b0": 100, "b1": 50, "b2": 25}

// wlState is the State isobar's registry builds (regional/registry.go
// cycle.BuildState) for one model with three local cells in r1 (b0, b1, b2, one
// per weight band) and a remote region r2 whose ingress is b3:
//   - spill: the plan keeps localShare of the demand (locality weight
//     round(localShare × 1000)) and sends the rest to r2 (its locality
//     weight; the ingress endpoint has weight 1), both priority 0;
//   - localShare 0: the plan sends everything to r2: r2 at priority 0
//     with weight 1000, the local cells at priority 1 with weight 1.
func wlState(be map[string]*backend, localShare float64) xds.State {
	ep := func(name string, w uint32) xds.Endpoint {
		host, port, _ := net.SplitHostPort(be[name].addr)
		p, _ := strconv.ParseUint(port, 10, 32)
		id := "cell-" + name
		if name == "b3" {
			id = "region/r2"
		}
		return xds.Endpoint{CellID: id, Host: host, Port: uint32(p), Weight: w}
	}
	local := xds.Locality{Region: "r1", Zone: "r1", Weight: uint32(math.Round(localShare * 1000)),
		Endpoints: []xds.Endpoint{ep("b0", bandWeights["b0"]), ep("b1", bandWeights["b1"]), ep("b2", bandWeights["b2"])}}
	remote := xds.Locality{Region: "r2", Zone: "r2", Weight: uint32(math.Round((1 - localShare) * 1000)),
		Endpoints: []xds.Endpoint{ep("b3", 1)}}
	if localShare == 0 {
		local.Weight, local.Priority = 1, 1
	}
	return xds.State{Models: []xds.Model{{Name: model, Localities: []xds.Locality{local, remote}}}}
}

// markUnhealthy sets every endpoint of region's localities UNHEALTHY.
func markUnhealthy(region string) func(*endpoint.ClusterLoadAssignment) {
	return func(cla *endpoint.ClusterLoadAssignment) {
		for _, l := range cla.GetEndpoints() {
			if l.GetLocality().GetRegion() != region {
				continue
			}
			for _, e := range l.GetLbEndpoints() {
				e.HealthStatus = core.HealthStatus_UNHEALTHY
			}
		}
	}
}

// shift is how a judge's traffic moved after a snapshot change.
type shift struct {
	lastOld, firstNew time.Duration // after the change; lastOld 0: no RPC to the old set after it
	errors            int
	lastErr           string
}

func (s shift) String() string {
	e := ""
	if s.errors > 0 {
		e = fmt.Sprintf(", %d RPCs failed (last: %s)", s.errors, s.lastErr)
	}
	return fmt.Sprintf("first RPC to the new set %v, last to the old %v after the update%s", s.firstNew, s.lastOld, e)
}

// moves consumes the judge's RPCs completed after since until quiet
// answered RPCs in a row went to backends in to, within max RPCs and a
// minute; it fails t otherwise, with the counts seen.
func (c *client) moves(t *testing.T, since time.Time, to map[string]bool, quiet, max int) shift {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var s shift
	run, seen, gotNew := 0, 0, false
	counts := map[string]int{}
	for run < quiet {
		if seen >= max {
			t.Fatalf("%s: %d RPCs after the update and no %d in a row to %v: %s", c.j.name, seen, quiet, to, sortedCounts(counts))
		}
		e := c.next(t, deadline)
		if e.ms < since.UnixMilli() {
			continue
		}
		seen++
		d := time.Duration(e.ms-since.UnixMilli()) * time.Millisecond
		if e.err != "" {
			s.errors++
			s.lastErr = e.err
			counts["error"]++
			run = 0
			continue
		}
		counts[e.backend]++
		if !to[e.backend] {
			s.lastOld, run = d, 0
			continue
		}
		if !gotNew {
			s.firstNew, gotNew = d, true
		}
		run++
	}
	return s
}

// count counts the judge's next n RPCs by backend; a failed one fails t.
func (c *client) count(t *testing.T, n int) map[string]int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	counts := map[string]int{}
	for range n {
		e := c.next(t, deadline)
		if e.err != "" {
			t.Fatalf("%s: RPC failed: %s", c.j.name, e.err)
		}
		counts[e.backend]++
	}
	return counts
}

// wlExpect is the share of RPCs each backend should get from a judge,
// given the locality weights lw of the highest ready priority. The gRPC
// clients here run weighted_target over those localities (a random pick
// by locality weight) and, under least_request and round_robin,
// round_robin inside a locality, which ignores endpoint weights
// (grpc-js-xds 1.14, C-core 1.51 either way): share lw/Σlw/size. Under
// ring_hash grpc-js-xds gives each endpoint locality weight × endpoint
// weight on one ring (load-balancer-cds.js, endpointWeight): share
// lw·ew/Σ. docs/interop.md.
func wlExpect(lw map[string]float64, members map[string][]string, ringHash bool) map[string]float64 {
	w := map[string]float64{}
	var tot float64
	for loc, l := range lw {
		for _, b := range members[loc] {
			w[b] = l / float64(len(members[loc]))
			if ringHash {
				ew, ok := bandWeights[b]
				if !ok {
					ew = 1 // a remote region's ingress
				}
				w[b] = l * float64(ew)
			}
			tot += w[b]
		}
	}
	for b := range w {
		w[b] /= tot
	}
	return w
}

// checkSplit fails t when a count is off its expected share by more than
// 5 binomial standard deviations, and logs the split.
func checkSplit(t *testing.T, c *client, what string, counts map[string]int, want map[string]float64, n int, ring float64) {
	t.Helper()
	var b strings.Builder
	for _, name := range []string{"b0", "b1", "b2", "b3"} {
		p := want[name]
		exp, tol := float64(n)*p, tolerance(n, p, ring)
		fmt.Fprintf(&b, " %s=%d (want %.0f±%.0f)", name, counts[name], exp, tol)
		if math.Abs(float64(counts[name])-exp) > tol {
			t.Errorf("%s, %s: %s got %d of %d RPCs, want %.0f ± %.0f", c.j.name, what, name, counts[name], n, exp, tol)
		}
	}
	t.Logf("SPLIT weights %s %s:%s of %d", what, c.j.name, b.String(), n)
}

// TestXDSJudgesWeightsAndLocalities serves the judges what isobar's own
// builder (regional/xds) makes of a State with unequal endpoint weights
// (the three weight bands), two localities with different locality
// weights, and priorities, from a go-control-plane server on loopback with
// real gRPC backends as endpoints. For least_request, round_robin and
// ring_hash (grpc-js-xds only: C-core 1.51 crashes there): every resource
// ACKed at every version, no NACK; the spill split (local 0.7, r2 0.3)
// matches wlExpect within 5 binomial standard deviations; with the plan
// sending everything to r2, the priority-0 locality takes every RPC; once
// r2's endpoint is UNHEALTHY the traffic moves to priority 1 and splits as
// wlExpect says; when r2 is healthy again it moves back. The splits are
// logged as "SPLIT weights", the times as "FIGURE failover", not asserted.
func TestXDSJudgesWeightsAndLocalities(t *testing.T) {
	suite(t)
	js := judges(t)
	be := map[string]*backend{}
	for _, n := range []string{"b0", "b1", "b2", "b3"} {
		be[n] = startBackend(t, n)
	}
	members := map[string][]string{"r1": {"b0", "b1", "b2"}, "r2": {"b3"}}
	local := map[string]bool{"b0": true, "b1": true, "b2": true}
	remote := map[string]bool{"b3": true}
	for _, policy := range []xdscontract.LBPolicy{xdscontract.LeastRequest, xdscontract.RoundRobin, xdscontract.RingHash} {
		t.Run(string(policy), func(t *testing.T) {
			rh, ring := policy == xdscontract.RingHash, 0.0
			js := js
			if rh {
				// C-core 1.51 dies in its ring_hash picker
				// (grpc/grpc#31766; TestXDSJudges checks the crash).
				ring = ringMinSize
				js = slices.DeleteFunc(slices.Clone(js), func(j judge) bool { return strings.HasPrefix(j.name, "c-core") })
				t.Log("INTEROP-KNOWN: C-core 1.51 is not run under ring_hash with localities: it dies with SIGSEGV in its ring_hash picker (grpc/grpc#31766, fixed in 1.52)")
				if len(js) == 0 {
					t.Skip("INTEROP-SKIP: no judge runs ring_hash")
				}
			}
			b, err := xds.NewBuilder(xds.Config{Region: "r1", Zone: "r1", LBPolicy: policy})
			if err != nil {
				t.Fatal(err)
			}
			spill, err := b.Build(wlState(be, 0.7))
			if err != nil {
				t.Fatal(err)
			}
			away, err := b.Build(wlState(be, 0))
			if err != nil {
				t.Fatal(err)
			}
			wlCheckShape(t, spill.GRPC, away.GRPC)
			var nodes []string
			for _, j := range js {
				nodes = append(nodes, "interop-"+j.name)
			}
			s := startWLServer(t, nodes)
			acked := func(v string) {
				for _, n := range nodes {
					poll(t, n+" ACKs version "+v, 30*time.Second, func() (bool, string) { return s.log.check(t, n, v) })
				}
			}
			v := s.set(t, spill.GRPC, nil)
			var clients []*client
			for _, j := range js {
				clients = append(clients, startClient(t, j, s.addr))
			}

			// Spill: both localities at priority 0, weights 700 and 300.
			const n = 1000
			for _, c := range clients {
				counts := c.split(t, []string{"b0", "b1", "b2", "b3"}, n)
				checkSplit(t, c, string(policy)+" spill", counts, wlExpect(map[string]float64{"r1": 700, "r2": 300}, members, rh), n, ring)
			}
			acked(v)

			// Everything to r2: r2 priority 0 (weight 1000), r1 priority 1.
			at := time.Now()
			v = s.set(t, away.GRPC, nil)
			for _, c := range clients {
				sh := c.moves(t, at, remote, 400, 5000)
				t.Logf("FIGURE failover %s %s: plan to r2 (r2 priority 0, local priority 1): %v", policy, c.j.name, sh)
			}
			acked(v)

			// r2's ingress UNHEALTHY: priority 1 takes over.
			at = time.Now()
			v = s.set(t, away.GRPC, markUnhealthy("r2"))
			for _, c := range clients {
				sh := c.moves(t, at, local, 300, 5000)
				t.Logf("FIGURE failover %s %s: r2 UNHEALTHY, to priority 1: %v", policy, c.j.name, sh)
				counts := c.count(t, 600)
				checkSplit(t, c, string(policy)+" priority 1", counts, wlExpect(map[string]float64{"r1": 1}, members, rh), 600, ring)
			}
			acked(v)

			// r2 healthy again: back to priority 0.
			at = time.Now()
			v = s.set(t, away.GRPC, nil)
			for _, c := range clients {
				sh := c.moves(t, at, remote, 400, 5000)
				t.Logf("FIGURE failover %s %s: r2 healthy again, back to priority 0: %v", policy, c.j.name, sh)
			}
			acked(v)
			for _, c := range clients {
				c.p.stop()
			}
		})
	}
}

// wlCheckShape fails t unless isobar's builder wrote what the test
// assumes: the model's ClusterLoadAssignment with localities r1 and r2,
// their weights and priorities, and the band weights on the endpoints.
func wlCheckShape(t *testing.T, spill, away xds.Set) {
	t.Helper()
	find := func(s xds.Set) map[string]*endpoint.LocalityLbEndpoints {
		out := map[string]*endpoint.LocalityLbEndpoints{}
		for _, cla := range s.Endpoints {
			if cla.GetClusterName() != xdscontract.ClusterName(model) {
				continue
			}
			for _, l := range cla.GetEndpoints() {
				out[l.GetLocality().GetRegion()] = l
			}
		}
		return out
	}
	type lp struct{ w, p uint32 }
	for _, c := range []struct {
		name string
		set  xds.Set
		want map[string]lp
	}{
		{"spill", spill, map[string]lp{"r1": {700, 0}, "r2": {300, 0}}},
		{"away", away, map[string]lp{"r1": {1, 1}, "r2": {1000, 0}}},
	} {
		got := find(c.set)
		if len(got) != len(c.want) {
			t.Fatalf("%s: localities %v, want %v", c.name, got, c.want)
		}
		for r, w := range c.want {
			l := got[r]
			if g := (lp{l.GetLoadBalancingWeight().GetValue(), l.GetPriority()}); g != w {
				t.Fatalf("%s: locality %s weight/priority %v, want %v", c.name, r, g, w)
			}
		}
		var ws []uint32
		for _, e := range got["r1"].GetLbEndpoints() {
			ws = append(ws, e.GetLoadBalancingWeight().GetValue())
		}
		slices.Sort(ws)
		if fmt.Sprint(ws) != "[25 50 100]" {
			t.Fatalf("%s: local endpoint weights %v, want the bands 100, 50, 25", c.name, ws)
		}
	}
}
