package global_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

const prefix = "/isobar/global/election/"

func startEtcd(t *testing.T) *election.Embedded {
	t.Helper()
	e, err := election.StartEmbedded(context.Background(), election.EmbeddedConfig{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

func etcdClient(t *testing.T, e *election.Embedded) *clientv3.Client {
	t.Helper()
	cli, err := election.NewClient(election.ClientConfig{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

type member struct {
	srv  *global.Server
	cli  *clientv3.Client
	prom *prometheus.Registry
}

func startGlobal(t *testing.T, name string, e *election.Embedded, mut func(*global.Config)) *member {
	t.Helper()
	cfg := global.Config{
		Name: name, LeaseTTL: time.Second, CycleInterval: 100 * time.Millisecond,
		RegionTTL: 600 * time.Millisecond, PlanTTL: 10 * time.Second,
	}
	if mut != nil {
		mut(&cfg)
	}
	m := &member{cli: etcdClient(t, e), prom: prometheus.NewRegistry()}
	srv, err := global.New(cfg, global.Deps{Etcd: m.cli, Registerer: m.prom, GRPCListener: listen(t), HTTPListener: listen(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	m.srv = srv
	return m
}

// waitLeader waits until one of ms leads and returns it.
func waitLeader(t *testing.T, within time.Duration, ms ...*member) *member {
	t.Helper()
	var leader *member
	eventually.True(t, within, "a leader", func() bool {
		for _, m := range ms {
			if m.srv.IsLeader() {
				leader = m
				return true
			}
		}
		return false
	})
	return leader
}

// region is a fake regional controller: it finds the leader in etcd,
// streams a summary every 100 ms and records the plans it receives.
type region struct {
	t    *testing.T
	name string
	cli  *clientv3.Client

	mu       sync.Mutex
	demand   float64
	capacity float64
	rtt      map[string]float64
	stopped  bool
	plans    []*isobarpb.RoutingPlan
	changed  chan struct{}
	seq      uint64
	cancel   context.CancelFunc
	done     chan struct{}
}

func newRegion(t *testing.T, e *election.Embedded, name string, demand, capacity float64, rtt map[string]float64) *region {
	t.Helper()
	r := &region{t: t, name: name, cli: etcdClient(t, e), demand: demand, capacity: capacity, rtt: rtt,
		changed: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { defer close(r.done); r.loop(ctx) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func (r *region) summary() *isobarpb.RegionSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	s := &isobarpb.RegionSummary{
		Region: r.name, Incarnation: "test", Sequence: r.seq, At: timestamppb.Now(),
		IngressAddress: fmt.Sprintf("127.0.0.%d:7000", 10+len(r.name)),
		Models: []*isobarpb.ModelSummary{{
			Model: "m", CellsReady: 3, CapacityRps: r.capacity, DemandRps: r.demand, LoadRps: r.demand, EngineLatencyMs: 300,
		}},
	}
	for p, ms := range r.rtt {
		s.Rtt = append(s.Rtt, &isobarpb.PeerRTT{Region: p, RttMs: ms})
	}
	return s
}

func (r *region) loop(ctx context.Context) {
	for ctx.Err() == nil {
		_ = r.session(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond): // reconnect pause; not synchronisation
		}
	}
}

func (r *region) session(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	id, _, err := election.Leader(lctx, r.cli, prefix)
	cancel()
	if err != nil {
		return err
	}
	addr, _ := global.LeaderAddress(id)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := isobarpb.NewGlobalControlClient(conn).Sync(sctx)
	if err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			r.mu.Lock()
			stopped := r.stopped
			r.mu.Unlock()
			if !stopped {
				if stream.Send(r.summary()) != nil {
					return
				}
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	for {
		p, err := stream.Recv()
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.plans = append(r.plans, p)
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}
}

// silence stops (or resumes) the region's summaries; its stream stays.
func (r *region) silence(on bool) {
	r.mu.Lock()
	r.stopped = on
	r.mu.Unlock()
}

// waitPlan waits for a plan satisfying cond and returns it.
func (r *region) waitPlan(within time.Duration, cond func(*isobarpb.RoutingPlan) bool) *isobarpb.RoutingPlan {
	r.t.Helper()
	deadline := time.After(within)
	for {
		r.mu.Lock()
		var last *isobarpb.RoutingPlan
		if n := len(r.plans); n > 0 {
			last = r.plans[n-1]
		}
		ch := r.changed
		r.mu.Unlock()
		if last != nil && cond(last) {
			return last
		}
		select {
		case <-ch:
		case <-deadline:
			r.t.Fatalf("region %s: no matching plan within %v; last %v", r.name, within, last)
			return nil
		}
	}
}

// routes returns the plan's split of model m for this region.
func routes(p *isobarpb.RoutingPlan, ingress string) (map[string]float64, float64) {
	out := map[string]float64{}
	for _, mp := range p.GetPlans() {
		if mp.GetIngressRegion() == ingress {
			for _, r := range mp.GetRoutes() {
				out[r.GetDestination()] = r.GetFraction()
			}
			return out, mp.GetShed()
		}
	}
	return out, 0
}
