package global

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// A deposed leader that wakes up — still holding its old term — cannot
// write a plan: the write is fenced by the election key's revision.
func TestDeposedLeaderIsFenced(t *testing.T) {
	e, err := election.StartEmbedded(context.Background(), election.EmbeddedConfig{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	start := func(name string) *Server {
		cli, err := election.NewClient(election.ClientConfig{Endpoints: e.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		g, err := New(Config{Name: name, LeaseTTL: time.Second, CycleInterval: 50 * time.Millisecond, HTTPListen: "-"},
			Deps{Etcd: cli, GRPCListener: ln})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		return g
	}
	waitFor := func(cond func() bool) {
		t.Helper()
		eventually.True(t, 10*time.Second, "the condition", cond)
	}
	g1 := start("g1")
	waitFor(g1.IsLeader)
	old := g1.current.Load()
	g2 := start("g2")

	// Depose g1 (as if its session had expired while it was paused): g2
	// takes over and publishes.
	if _, err := election.Depose(context.Background(), g1.deps.Etcd, g1.cfg.ElectionPrefix); err != nil {
		t.Fatal(err)
	}
	waitFor(func() bool { p := g2.LastPlan(); return g2.IsLeader() && p != nil && p.Epoch > uint64(old.Epoch) })

	// g1 "wakes up" with its old term and tries to publish (its own loop
	// stopped first, so the test goroutine owns its planner state).
	g1.Stop()
	err = g1.cycle(context.Background(), old)
	if !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("deposed leader's cycle = %v, want ErrNotLeader", err)
	}
	resp, err := g1.deps.Etcd.Get(context.Background(), g1.cfg.PlanKey)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("plan key: %v %v", resp, err)
	}
	var stored isobarpb.RoutingPlan
	if err := proto.Unmarshal(resp.Kvs[0].Value, &stored); err != nil {
		t.Fatal(err)
	}
	if stored.LeaderId != g2.ID() || stored.Epoch <= uint64(old.Epoch) {
		t.Fatalf("plan in etcd is from %s epoch %d: the deposed leader overwrote it", stored.LeaderId, stored.Epoch)
	}
}
