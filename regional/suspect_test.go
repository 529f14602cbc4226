package regional

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// TestBrokenStreamMakesCellSuspect runs a controller on a fake clock behind
// real gRPC. The clock only moves where the test moves it, so whatever
// happens while it stands still cannot be the TTL's doing:
//   - an agent whose stream breaks (its process killed: no Terminated) has
//     weight 0 without any time passing;
//   - it is restored when it reconnects (at the next cycle tick: a cell
//     that comes back is not urgent);
//   - an agent that stays connected but silent (hung) is Failed by the TTL,
//     and only once the clock passes it;
//   - an agent that says goodbye (Terminated) and closes is not suspect.
func TestBrokenStreamMakesCellSuspect(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := DefaultConfig("r1")
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.TTLGrace = 100 * time.Millisecond
	cfg.CycleInterval = 20 * time.Millisecond
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(cfg, Deps{Clock: clk, Registerer: prometheus.NewRegistry(), GRPCListener: glis, HTTPListener: hlis})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	cl := dialController(t, c.Addr(), nil)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY

	// connect opens a stream for id and sends its first heartbeat; cancel
	// breaks the stream the way a killed process does (no CloseSend, no
	// Terminated).
	connect := func(id, ep string, seq uint64) (isobarpb.CellRegistry_HeartbeatClient, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s, err := cl.Heartbeat(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(heartbeat(id, ep, ready, seq)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		// A cell that comes (or comes back) is in at the next cycle tick.
		in := func(cv CellView) bool { return cv.Sequence == seq && !cv.Suspect && cv.Weight.Published > 0 }
		for range 50 {
			if cv, ok := c.Registry().View().Cell(id); ok && in(cv) {
				return s, cancel
			}
			advanceCycle(t, c, clk, cfg.CycleInterval)
		}
		t.Fatalf("cell %s not in the load balancer after 50 cycles", id)
		return nil, nil
	}

	_, kill := connect("killed", "127.0.0.1:3001", 1)
	frozen := clk.Now()
	kill()
	cv := waitCell(t, c, "killed", func(cv CellView) bool { return cv.Suspect })
	if cv.Weight.Published != 0 || cv.State != lifecycle.Ready || clk.Since(frozen) != 0 {
		t.Fatalf("broken stream: weight %d state %s after %v of fake time, want 0, ready, none",
			cv.Weight.Published, cv.State, clk.Since(frozen))
	}
	// The agent restarts and reconnects within the TTL: restored.
	connect("killed", "127.0.0.1:3001", 2)

	// A clean goodbye is not a break.
	bye, _ := connect("bye", "127.0.0.1:3002", 1)
	if err := bye.Send(heartbeat("bye", "127.0.0.1:3002", isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED, 2)); err != nil {
		t.Fatal(err)
	}
	waitCell(t, c, "bye", func(cv CellView) bool { return cv.State == lifecycle.Terminated })
	if err := bye.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := bye.Recv(); err == nil {
		t.Fatal("stream still open after CloseSend")
	}

	// A hung agent: the stream stays open, nothing more is sent. Nothing
	// happens while the clock stands still; the TTL fails it.
	connect("hung", "127.0.0.1:3003", 1)
	if cv, _ := c.Registry().View().Cell("hung"); cv.Suspect || cv.State != lifecycle.Ready {
		t.Fatalf("hung agent = %s suspect %v before any time passed", cv.State, cv.Suspect)
	}
	for {
		if cv, _ := c.Registry().View().Cell("hung"); cv.State == lifecycle.Failed {
			if since := clk.Since(cv.LastSeen); since < cfg.TTL() {
				t.Fatalf("hung agent Failed %v after its last heartbeat, before the TTL %v", since, cfg.TTL())
			}
			break
		}
		if clk.Since(frozen) > 10*cfg.TTL() {
			t.Fatalf("hung agent not Failed after %v of fake time (TTL %v)", clk.Since(frozen), cfg.TTL())
		}
		advanceCycle(t, c, clk, cfg.CycleInterval)
	}
	if cv, _ := c.Registry().View().Cell("bye"); cv.Suspect {
		t.Error("the cell that said goodbye was made suspect")
	}
}

// advanceCycle moves the fake clock by d and waits until the registry has
// run a cycle since (the count is read before the clock moves: the tick
// may be taken at once).
func advanceCycle(t *testing.T, c *Controller, clk *clockwork.FakeClock, d time.Duration) {
	t.Helper()
	before := c.Registry().View().Cycle
	clk.Advance(d)
	if !eventually.Wait(10*time.Second, func() bool { return c.Registry().View().Cycle != before }) {
		t.Fatal("registry ran no cycle")
	}
}
