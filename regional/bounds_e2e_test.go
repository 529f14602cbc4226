package regional

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/summary"
)

// Hostile-part drill: a cell whose heartbeat carries an out-of-range
// signal (ttft_p95_seconds=1e5, request_rate=1e12) over the real gRPC
// stream leaves its region in planning. The controller's summaries keep
// passing validation, so a gossip peer (a real memberlist node on
// loopback, validating with summary.ValidateAt as receivers do) holds the
// region's summary with the cell counted ready and its TTFT capped. On the
// old code the heartbeat passed validation unchanged, every summary after
// it failed summary.Validate and the peer never saw the cell.
func TestE2EOutOfRangeSignalKeepsRegionPublished(t *testing.T) {
	validate := func(s *isobarpb.RegionSummary) error { return summary.ValidateAt(s, time.Now()) }
	node := func(role, region string, join []string) *gossip.Node {
		t.Helper()
		cfg := gossip.Config{Role: role, Region: region, BindAddr: "127.0.0.1", Profile: gossip.ProfileLocal, Join: join}
		if role == gossip.RoleRegional {
			cfg.IngressAddress = "127.0.0.1:10001"
		}
		n, err := gossip.New(cfg, gossip.Deps{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Validate: validate})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Stop)
		return n
	}
	regionNode := node(gossip.RoleRegional, "r1", nil)
	peer := node(gossip.RoleGlobal, "", []string{regionNode.Addr()})

	cfg := DefaultConfig("r1")
	cfg.HeartbeatInterval, cfg.TTLGrace, cfg.CycleInterval = 100*time.Millisecond, 400*time.Millisecond, 20*time.Millisecond
	cfg.Global.SummaryInterval = 100 * time.Millisecond
	cfg.Global.IngressAddress, cfg.HTTPListen = "127.0.0.1:10001", "-"
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(cfg, Deps{Registerer: prometheus.NewRegistry(), GRPCListener: glis, Gossip: regionNode})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)

	s, err := dialController(t, c.Addr(), nil).Heartbeat(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	send := func() {
		t.Helper()
		seq++
		hb := heartbeat("hostile", "127.0.0.1:3001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, seq)
		hb.Signals.TtftP95Seconds, hb.Signals.RequestRate = f64(1e5), f64(1e12)
		if err := s.Send(hb); err != nil {
			t.Fatal(err)
		}
		if seq > 1 {
			return // the controller acks a stream's first heartbeat (and commands) only
		}
		if ack, err := s.Recv(); err != nil || ack.GetError() != "" {
			t.Fatalf("heartbeat refused: %v %v; a finite out-of-range signal is capped, not refused", ack, err)
		}
	}
	var last *isobarpb.RegionSummary
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		send() // paced by the ack round trip; the stream's rate limit allows it
		if ps, ok := peer.Summaries()["r1"]; ok {
			last = ps.Summary
			if ms := last.GetModels(); len(ms) == 1 && ms[0].GetCellsReady() == 1 {
				if got := ms[0].GetTtftP95Seconds(); got != summary.MaxTTFTSeconds {
					t.Fatalf("peer's summary ttft_p95_seconds = %v, want capped at %v", got, float64(summary.MaxTTFTSeconds))
				}
				if err := summary.ValidateAt(last, time.Now()); err != nil {
					t.Fatalf("peer holds an invalid summary: %v", err)
				}
				return
			}
		}
		time.Sleep(50 * time.Millisecond) // pacing heartbeats while polling the peer, bounded by the deadline
	}
	t.Fatalf("the peer never held r1's summary with the cell ready; last: %v", last)
}
