package global_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/isobar-mesh/isobar/cellagent"
	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/lab/wan"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/sim"
)

// streamWatch is a client stats handler that records when an RPC of one
// method ends with an error: the client seeing its stream fail.
type streamWatch struct {
	method string
	mu     sync.Mutex
	since  time.Time   // failures before this are ignored
	failed []time.Time // failures after since
	errs   []error
}

type methodKey struct{}

func (w *streamWatch) TagRPC(ctx context.Context, i *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, i.FullMethodName)
}

func (w *streamWatch) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok || end.Error == nil || ctx.Value(methodKey{}) != w.method {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.since.IsZero() && end.EndTime.After(w.since) {
		w.failed = append(w.failed, end.EndTime)
		w.errs = append(w.errs, end.Error)
	}
}

func (w *streamWatch) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (w *streamWatch) HandleConn(context.Context, stats.ConnStats)                       {}

func (w *streamWatch) arm(at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.since, w.failed, w.errs = at, nil, nil
}

// first returns the first failure after arm, if any.
func (w *streamWatch) first() (time.Time, error, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failed) == 0 {
		return time.Time{}, nil, false
	}
	return w.failed[0], w.errs[0], true
}

func (w *streamWatch) dial() grpc.DialOption { return grpc.WithStatsHandler(w) }

func startPath(t *testing.T, name, target string) *wan.Proxy {
	t.Helper()
	p, err := wan.New(wan.Config{Path: name, Target: target}, wan.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// TestBlackHoledPeerDetected (issue 22 item 11): each long-lived stream
// runs through an L4 proxy (lab/wan) that, when partitioned, stops
// forwarding without closing anything, as a black-holed route or a dead
// host does. The client of each stream must see it fail within its
// keepalive Time + Timeout: cellagent → regional (CellRegistry.Heartbeat),
// regional → global leader (GlobalControl.Sync) and gateway → regional
// (ADS). Without keepalive the clients wait for the kernel's TCP
// retransmission timeout (~15 min), far beyond this test's deadline.
//
// Keepalive here is Time 10 s (grpc-go's floor: WithKeepaliveParams raises
// anything lower to internal.KeepaliveMinPingTime, which only grpc-go's own
// tests can lower) and Timeout 1 s, so the test takes about 11 s; the
// detection times are logged (figures, not asserted): go test -v -run
// TestBlackHoledPeerDetected ./global/.
func TestBlackHoledPeerDetected(t *testing.T) {
	if testing.Short() {
		t.Skip("takes grpc-go's 10 s minimum keepalive interval")
	}
	ka := grpcbounds.Client{Time: 10 * time.Second, Timeout: time.Second}
	e := startEtcd(t)

	// Global leader, reached by regions through pathGlobal.
	gln := listen(t)
	pathGlobal := startPath(t, "to-global", gln.Addr().String())
	gcfg := global.Config{Name: "g1", LeaseTTL: time.Second, CycleInterval: 100 * time.Millisecond,
		RegionTTL: 600 * time.Millisecond, PlanTTL: 10 * time.Second, Advertise: pathGlobal.Addr()}
	gsrv, err := global.New(gcfg, global.Deps{Etcd: etcdClient(t, e), GRPCListener: gln, HTTPListener: listen(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := gsrv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gsrv.Stop)

	// Regional controller, dialling the leader with keepalive ka.
	syncWatch := &streamWatch{method: isobarpb.GlobalControl_Sync_FullMethodName}
	cfg := regional.DefaultConfig("r1")
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.TTLGrace = 100 * time.Millisecond
	cfg.CycleInterval = 20 * time.Millisecond
	cfg.Global.SummaryInterval = 100 * time.Millisecond
	cfg.Global.Keepalive = ka
	rln := listen(t)
	ctrl, err := regional.New(cfg, regional.Deps{GRPCListener: rln, HTTPListener: listen(t), Etcd: etcdClient(t, e),
		GlobalDialOptions: append(insecureDial, syncWatch.dial())})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrl.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctrl.Stop)
	pathAgent := startPath(t, "agent-to-regional", rln.Addr().String())
	pathGateway := startPath(t, "gateway-to-regional", rln.Addr().String())

	// A cell agent heartbeating through pathAgent.
	eng, err := sim.NewEngine(sim.EngineConfig{Name: "bh-0", TimeScale: 0.1}, sim.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Start(listen(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopWith(eng.Stop) })
	hbWatch := &streamWatch{method: isobarpb.CellRegistry_Heartbeat_FullMethodName}
	ag, err := cellagent.NewAgent(cellagent.Config{
		CellID: "bh-cell-0", Region: "r1", ControllerAddr: pathAgent.Addr(), VLLMURL: "http://" + eng.Addr() + "/metrics",
		Interval: 100 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Keepalive: ka,
	}, cellagent.Deps{DialOptions: append(insecureDial, hbWatch.dial())})
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ag.Stop)

	// A gateway following the controller's xDS through pathGateway.
	adsWatch := &streamWatch{method: "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"}
	gw, err := gateway.New(gateway.Config{Controller: pathGateway.Addr(), Region: "r1", Keepalive: ka,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, DrainTimeout: 5 * time.Second},
		gateway.Deps{DialOptions: append(insecureDial, adsWatch.dial())})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(context.Background(), listen(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Stop)

	// Every stream up: the cell is in the registry, the region follows
	// the leader's plan, the gateway has the cell's endpoint.
	awaitWithin(t, "cell registered, plan applied and gateway configured", 30*time.Second, func() bool {
		_, cell := ctrl.Registry().View().Cell("bh-cell-0")
		rt := ctrl.Routes()
		return cell && rt != nil && rt.Source == regional.RoutesPlan && gw.Table().Ready()
	})

	watches := []struct {
		name string
		w    *streamWatch
		p    *wan.Proxy
	}{
		{"cellagent→regional heartbeat", hbWatch, pathAgent},
		{"regional→global sync", syncWatch, pathGlobal},
		{"gateway→regional ADS", adsWatch, pathGateway},
	}
	t0 := time.Now()
	for _, s := range watches {
		s.w.arm(t0)
		s.p.Partition(true)
	}
	bound := ka.Detection()
	for _, s := range watches {
		awaitWithin(t, s.name+" failure seen by its client", 5*bound, func() bool { _, _, ok := s.w.first(); return ok })
		at, err, _ := s.w.first()
		t.Logf("%s: black-holed peer detected after %v (keepalive bound %v): %v", s.name, at.Sub(t0).Round(10*time.Millisecond), bound, err)
	}
	for _, s := range watches {
		s.p.Partition(false)
	}
}

// awaitWithin polls cond until it holds, failing after within (a generous
// real-time bound, not a measurement).
func awaitWithin(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	eventually.True(t, within, what, cond)
}
