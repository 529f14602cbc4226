package global_test

// Multi-region end to end: embedded etcd, the global HA pair, three real
// regional controllers with simulated engines and real cellagents, an ADS
// client per region and traffic routed by the locality and endpoint weights
// it receives. Each region's "ingress" is a small reverse proxy to its own
// engines, standing in for the gateway's local-only listener.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/cellagent"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/sim"
)

var insecureDial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}

type testRegion struct {
	name    string
	gossip  *gossip.Node
	ctrl    *regional.Controller
	engines []*sim.Engine
	ingress *http.Server
	watch   *xdsclient.Watcher
}

// leaderFailover drives traffic from b while the leader crashes: b's plan
// moves to the new leader's epoch with no request lost, and traffic
// crosses regions as planned.
func leaderFailover(ctx context.Context, t *testing.T, b *testRegion, leader, g2 *member) {
	t.Helper()
	d := &driver{client: &http.Client{Timeout: 30 * time.Second}}
	driving := make(chan struct{})
	go func() { defer close(driving); d.run(ctx, b, 20, 200) }()
	epoch := b.ctrl.Routes().Epoch
	killed := time.Now()
	_ = leader.cli.Close()
	leader.srv.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for b.ctrl.Routes().Epoch == epoch {
		if time.Now().After(deadline) {
			t.Fatal("no plan from the new leader")
		}
		if src := b.ctrl.Routes().Source; src != regional.RoutesPlan {
			t.Fatalf("b left the plan during the gap: %s", src)
		}
		time.Sleep(10 * time.Millisecond) // polling the route table, bounded above
	}
	t.Logf("leader crash → b applied epoch %d after %v (was %d); leader now %s", b.ctrl.Routes().Epoch, time.Since(killed), epoch, g2.srv.ID())
	<-driving
	t.Logf("requests from b through the failover: %d ok, %d failed, served by %v", d.ok.Load(), d.failed.Load(), d.served())
	if d.failed.Load() != 0 {
		d.errs.Range(func(k, v any) bool { t.Logf("error %v (%v)", k, v); return true })
		t.Errorf("%d requests failed during the leader failover, want 0", d.failed.Load())
	}
	if srv := d.served(); srv["b"] == 0 || srv["a"]+srv["c"] == 0 {
		t.Errorf("traffic did not cross regions as planned: %v", srv)
	}
}

// etcdOutage stops etcd under b's traffic: b keeps its plan until it
// expires, no request fails, and plans resume once etcd is back.
func etcdOutage(ctx context.Context, t *testing.T, e *election.Embedded, b *testRegion) {
	t.Helper()
	before := b.ctrl.Routes()
	cfg := e.Config()
	e.Stop()
	d2 := &driver{client: &http.Client{Timeout: 30 * time.Second}}
	outage, stopOutage := context.WithCancel(ctx)
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		for outage.Err() == nil {
			if got := b.ctrl.Routes(); got.Source != regional.RoutesPlan && time.Now().Before(before.ValidUntil) {
				t.Errorf("b left its plan before it expired: %+v", got)
				return
			}
			time.Sleep(10 * time.Millisecond) // sampling the route table, bounded by the outage
		}
	}()
	d2.run(ctx, b, 20, 40)
	stopOutage()
	<-watching
	if d2.failed.Load() != 0 {
		t.Errorf("%d requests failed during the etcd outage", d2.failed.Load())
	}
	t.Logf("etcd outage: %d requests ok, %d failed; b on %s epoch %d", d2.ok.Load(), d2.failed.Load(), b.ctrl.Routes().Source, b.ctrl.Routes().Epoch)
	e2, err := election.StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e2.Stop)
	eventually.True(t, 30*time.Second, "plans to resume after etcd came back", func() bool { return b.ctrl.Routes().Epoch > before.Epoch })
	t.Logf("etcd back → b on epoch %d", b.ctrl.Routes().Epoch)
}

// startRegion runs a region with two cells and the given ingress demand;
// its gossip node joins seeds.
func startRegion(t *testing.T, e *election.Embedded, name string, demand float64, seeds ...string) *testRegion {
	t.Helper()
	r := &testRegion{name: name}
	ingLn := listen(t)
	cfg := regional.DefaultConfig(name)
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.TTLGrace = 100 * time.Millisecond
	cfg.CycleInterval = 20 * time.Millisecond
	cfg.Global.SummaryInterval = 100 * time.Millisecond
	cfg.Global.IngressAddress = ingLn.Addr().String()
	// The scenarios here are about planning on given capacities: pin each
	// cell to the 1.3 rps prior (so much evidence needed that none of the
	// measurement counts). The engines run 10x fast and would otherwise
	// show ten times the prior.
	cfg.Global.Capacity.EvidenceRequests = 1e12
	// The one assembly of a region (isobar regional's, the lab's, the
	// soak's): the gossip node from cfg.Gossip, the etcd client from
	// cfg.Etcd. The node is built here, as the lab does, so that the test
	// can stop it (a region lost) while the controller runs.
	cfg.Gossip = regional.GossipConfig{Listen: "127.0.0.1:0", Profile: gossip.ProfileLocal, Join: seeds}
	cfg.Etcd = election.ClientConfig{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second}
	deps := regional.Deps{
		GRPCListener: listen(t), HTTPListener: listen(t), GlobalDialOptions: insecureDial,
		Demand: func() map[string]float64 { return map[string]float64{sim.DefaultModel: demand} },
	}
	node, err := regional.NewGossip(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Stop)
	r.gossip, deps.Gossip = node, node
	ctrl, err := regional.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrl.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctrl.Stop)
	r.ctrl = ctrl
	r.serveIngress(t, ingLn, r.startCells(t, ctrl.Addr()))
	return r
}

// startCells runs the region's two engines, their exporter and agents,
// and returns the engines' URLs.
func (r *testRegion) startCells(t *testing.T, ctrlAddr string) []*url.URL {
	t.Helper()
	name := r.name
	dcgm := sim.NewDCGMExporter(sim.DCGMConfig{Hostname: name}, sim.Deps{})
	var targets []*url.URL
	for i := range 2 {
		eng, err := sim.NewEngine(sim.EngineConfig{Name: fmt.Sprintf("%s-%d", name, i), TimeScale: 0.1, GPUIndex: i}, sim.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.Start(listen(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopWith(eng.Stop) })
		dcgm.AddGPU(eng.GPU())
		r.engines = append(r.engines, eng)
		u, _ := url.Parse("http://" + eng.Addr())
		targets = append(targets, u)
	}
	if err := dcgm.Start(listen(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopWith(dcgm.Stop) })
	for i, eng := range r.engines {
		ag, err := cellagent.NewAgent(cellagent.Config{
			CellID: fmt.Sprintf("%s-cell-%d", name, i), Region: name, ControllerAddr: ctrlAddr,
			VLLMURL: "http://" + eng.Addr() + "/metrics", DCGMURL: "http://" + dcgm.Addr() + "/metrics", DCGMGPU: fmt.Sprint(i),
			Interval: 100 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		}, cellagent.Deps{DialOptions: insecureDial})
		if err != nil {
			t.Fatal(err)
		}
		if err := ag.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ag.Stop)
	}
	return targets
}

// serveIngress proxies the region's ingress round-robin to targets and
// watches its controller's xDS as a gateway would.
func (r *testRegion) serveIngress(t *testing.T, ingLn net.Listener, targets []*url.URL) {
	t.Helper()
	var next atomic.Uint64
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(targets[next.Add(1)%uint64(len(targets))])
	}}
	r.ingress = &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.ingress.Serve(ingLn) }()
	t.Cleanup(func() { _ = r.ingress.Close() })
	w, err := xdsclient.NewWatcher(xdsclient.WatchConfig{Server: r.ctrl.Addr(), NodeID: "e2e-" + r.name, MinBackoff: 20 * time.Millisecond},
		xdsclient.WatchDeps{DialOptions: insecureDial})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	r.watch = w
}

func stopWith(stop func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = stop(ctx)
}

// localities returns locality → weight in the region's assignment.
func localities(a xdsclient.Assignment) map[string]uint32 {
	out := map[string]uint32{}
	for _, eps := range a.Clusters {
		for _, e := range eps {
			out[e.Region] = e.LocalityWeight
		}
	}
	return out
}

func (r *testRegion) waitLocalities(t *testing.T, what string, within time.Duration, cond func(map[string]uint32) bool) map[string]uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	a, err := r.watch.WaitFor(ctx, func(a xdsclient.Assignment) bool { return cond(localities(a)) })
	if err != nil {
		t.Fatalf("%s: %s not reached within %v; localities %v; routes %+v", r.name, what, within, localities(a), r.ctrl.Routes())
	}
	return localities(a)
}

// driver sends requests as Envoy would: a locality by locality weight, an
// endpoint in it by endpoint weight.
type driver struct {
	ok, failed atomic.Int64
	byRegion   sync.Map // region → *atomic.Int64
	client     *http.Client
	errs       sync.Map
}

func pickLocal(a xdsclient.Assignment, rng *rand.Rand) (xdsclient.Endpoint, bool) {
	byLoc := map[string][]xdsclient.Endpoint{}
	lw := map[string]float64{}
	for _, eps := range a.Clusters {
		for _, e := range eps {
			byLoc[e.Region] = append(byLoc[e.Region], e)
			lw[e.Region] = float64(e.LocalityWeight)
		}
	}
	names := make([]string, 0, len(byLoc))
	var sum float64
	for n := range byLoc {
		names = append(names, n)
		sum += lw[n]
	}
	if sum == 0 {
		return xdsclient.Endpoint{}, false
	}
	sort.Strings(names)
	x := rng.Float64() * sum
	for _, n := range names {
		if x -= lw[n]; x < 0 {
			return xdsclient.Pick(xdsclient.Assignment{Seq: 1, Clusters: map[string][]xdsclient.Endpoint{n: byLoc[n]}}, rng.Float64())
		}
	}
	return xdsclient.Endpoint{}, false
}

// run sends up to n requests at about rps from region r until ctx ends.
func (d *driver) run(ctx context.Context, r *testRegion, rps float64, n int) {
	rng := rand.New(rand.NewPCG(7, 9))
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rps))
	defer tick.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		a, ok := r.watch.Latest()
		if !ok {
			continue
		}
		ep, ok := pickLocal(a, rng)
		if !ok {
			continue
		}
		wg.Go(func() { d.one(ep) })
	}
}

func (d *driver) one(ep xdsclient.Endpoint) {
	body, _ := json.Marshal(map[string]any{"model": sim.DefaultModel, "prompt": strings.Repeat("abcd", 64), "max_tokens": 4})
	resp, err := d.client.Post("http://"+ep.Address+"/v1/completions", "application/json", bytes.NewReader(body))
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			d.ok.Add(1)
			c, _ := d.byRegion.LoadOrStore(ep.Region, new(atomic.Int64))
			c.(*atomic.Int64).Add(1)
			return
		}
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	d.failed.Add(1)
	d.errs.Store(err.Error(), ep.Address)
}

func (d *driver) served() map[string]int64 {
	out := map[string]int64{}
	d.byRegion.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return out
}

// TestMultiRegion: plans become locality weights; traffic crosses regions
// as planned; a leader crash and an etcd outage cost zero requests (regions
// keep routing on the last plan); a region that goes silent leaves every
// other region's assignment within the region TTL.
func TestMultiRegion(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole multi-region fleet")
	}
	e := startEtcd(t)
	planCfg := func(c *global.Config) {
		c.CycleInterval = 200 * time.Millisecond
		c.RegionTTL = 1500 * time.Millisecond
		c.PlanTTL = 6 * time.Second
	}
	g1 := startGlobal(t, "g1", e, planCfg)
	leader := waitLeader(t, 5*time.Second, g1)
	g2 := startGlobal(t, "g2", e, planCfg)
	// Two cells of 1.3 RPS each per region; b's ingress demand is beyond
	// its capacity × headroom, a and c have room.
	a := startRegion(t, e, "a", 0.5)
	b := startRegion(t, e, "b", 4, a.gossip.Addr())
	c := startRegion(t, e, "c", 0.5, a.gossip.Addr())

	locs := b.waitLocalities(t, "b spills to other regions", 20*time.Second, func(l map[string]uint32) bool {
		return l["b"] > 0 && (l["a"] > 0 || l["c"] > 0)
	})
	t.Logf("b's localities from plan epoch %d: %v", b.ctrl.Routes().Epoch, locs)
	if src := b.ctrl.Routes().Source; src != regional.RoutesPlan {
		t.Fatalf("b routes from %q, want plan", src)
	}
	if l := a.waitLocalities(t, "a local", 5*time.Second, func(map[string]uint32) bool { return true }); l["b"] != 0 {
		t.Errorf("a sends to overloaded b: %v", l)
	}

	// Traffic from b through the leader crash.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaderFailover(ctx, t, b, leader, g2)

	// Region c goes silent (its controller, with its gossip member, stops):
	// after the region TTL nobody routes to it.
	c.ctrl.Stop()
	c.gossip.Stop()
	silent := time.Now()
	b.waitLocalities(t, "c removed from b", 30*time.Second, func(l map[string]uint32) bool { _, ok := l["c"]; return !ok })
	t.Logf("region c down → gone from b's assignment after %v (region TTL 1.5s)", time.Since(silent))

	// etcd outage: plans stop; regions keep the last plan until it expires
	// (then they fall back), and requests keep succeeding.
	etcdOutage(ctx, t, e, b)

	// The global pair gone for good: once the plan expires, b falls back
	// to local-first routing with spill-over computed from the gossiped
	// summaries (a is still up and has room), and requests keep working.
	g1.srv.Stop()
	g2.srv.Stop()
	gone := time.Now()
	eventually.True(t, 15*time.Second, "b to fall back", func() bool { return b.ctrl.Routes().Source == regional.RoutesFallback })
	fb := b.ctrl.Routes()
	t.Logf("global gone → b on the fallback after %v (plan TTL 6s): %+v", time.Since(gone), fb.Models)
	b.waitLocalities(t, "fallback spills to a", 5*time.Second, func(l map[string]uint32) bool { return l["b"] > 0 && l["a"] > 0 })
	d3 := &driver{client: &http.Client{Timeout: 30 * time.Second}}
	d3.run(ctx, b, 20, 40)
	t.Logf("on the fallback: %d ok, %d failed, served by %v", d3.ok.Load(), d3.failed.Load(), d3.served())
	if d3.failed.Load() != 0 || d3.served()["a"] == 0 {
		t.Errorf("fallback routing: %d failed, served %v", d3.failed.Load(), d3.served())
	}
}
