package regional

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/proto/isobarpb"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// startControllerClock is startController on an injected clock.
func startControllerClock(t *testing.T, clk clockwork.Clock, mut func(*Config)) *Controller {
	t.Helper()
	cfg := DefaultConfig("r1")
	cfg.HTTPListen = "-"
	if mut != nil {
		mut(&cfg)
	}
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(cfg, Deps{Clock: clk, Registerer: prometheus.NewRegistry(), GRPCListener: glis})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// awaitCond polls cond until it holds or a generous deadline passes.
func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, 60*time.Second, what, cond)
}

// TestHeartbeatSilentStreamsBounded: one connection opens 3,000 heartbeat
// streams and sends nothing on them (issue 22 item 10: on the old code
// isobar_regional_heartbeat_streams read 3001 after 35 s). Past
// Limits.MaxHeartbeatStreams each is refused at once with
// ResourceExhausted (counted too_many_streams); the ones admitted are
// closed with DeadlineExceeded at FirstHeartbeatTimeout (counted
// first_heartbeat_timeout, time driven by the fake clock), while a stream
// that heartbeats stays.
func TestHeartbeatSilentStreamsBounded(t *testing.T) {
	const total, limit = 3000, 50
	clk := clockwork.NewFakeClock()
	c := startControllerClock(t, clk, func(cfg *Config) {
		cfg.Limits.MaxHeartbeatStreams = limit
		cfg.FirstHeartbeatTimeout = time.Minute
	})
	conn, err := grpc.NewClient(c.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := isobarpb.NewCellRegistryClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// One live stream first: it heartbeats, so the deadline spares it.
	live, err := cl.Heartbeat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := live.Send(heartbeat("live", "127.0.0.1:2001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Recv(); err != nil {
		t.Fatalf("live stream: %v", err)
	}

	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	var wg sync.WaitGroup
	for i := 0; i < total; i++ {
		s, err := cl.Heartbeat(ctx)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		wg.Go(func() {
			_, err := s.Recv()
			mu.Lock()
			codesSeen[status.Code(err)]++
			mu.Unlock()
		})
	}
	seen := func(code codes.Code) int {
		mu.Lock()
		defer mu.Unlock()
		return codesSeen[code]
	}
	streams := func() float64 { return testutil.ToFloat64(c.metrics.streams) }
	awaitCond(t, "streams past the cap refused", func() bool { return seen(codes.ResourceExhausted) == total-(limit-1) })
	if got := streams(); got != limit {
		t.Fatalf("isobar_regional_heartbeat_streams = %v with the cap at %d", got, limit)
	}
	if got := testutil.ToFloat64(c.metrics.rejected.WithLabelValues(reasonTooManyStreams)); got != total-(limit-1) {
		t.Errorf("rejected{too_many_streams} = %v, want %d", got, total-(limit-1))
	}

	// The silent ones admitted reach their first-heartbeat deadline.
	awaitCond(t, "silent streams closed at the first-heartbeat deadline", func() bool {
		clk.Advance(time.Minute)
		return seen(codes.DeadlineExceeded) == limit-1
	})
	wg.Wait()
	if got := testutil.ToFloat64(c.metrics.rejected.WithLabelValues(reasonFirstTimeout)); got != limit-1 {
		t.Errorf("rejected{first_heartbeat_timeout} = %v, want %d", got, limit-1)
	}
	awaitCond(t, "only the live stream left", func() bool { return streams() == 1 })
	if n := len(codesSeen); n != 2 {
		t.Errorf("silent streams ended with %v, want only ResourceExhausted and DeadlineExceeded", codesSeen)
	}
}

// rawCodec sends its input bytes as the message, so a test can put bytes
// on the wire that no proto encoder would produce.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestHeartbeatOversizeRefusedBeforeDecode: a heartbeat over
// MaxMessageBytes is refused with ResourceExhausted (counted oversized) on
// its wire size. The message sent is 100 KiB that is not valid protobuf: a
// server that decoded it first (the old code checked the size after
// decoding) fails it with Internal "failed to unmarshal" instead. A
// well-formed oversized heartbeat is refused the same way, and one under
// the cap still goes through on a fresh stream.
func TestHeartbeatOversizeRefusedBeforeDecode(t *testing.T) {
	c := startControllerClock(t, clockwork.NewRealClock(), nil)
	conn, err := grpc.NewClient(c.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	oversized := func() float64 { return testutil.ToFloat64(c.metrics.rejected.WithLabelValues("oversized")) }

	t.Run("undecodable bytes", func(t *testing.T) {
		before := oversized()
		s, err := conn.NewStream(ctx, &isobarpb.CellRegistry_ServiceDesc.Streams[0], isobarpb.CellRegistry_Heartbeat_FullMethodName,
			grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		junk := []byte(strings.Repeat("\xff", 100<<10)) // an invalid varint tag, repeated
		if err := s.SendMsg(&junk); err != nil {
			t.Fatal(err)
		}
		var out []byte
		err = s.RecvMsg(&out)
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("undecodable 100 KiB heartbeat: %v, want ResourceExhausted before any decode", err)
		}
		if got := oversized(); got != before+1 {
			t.Errorf("rejected{oversized} = %v, want %v", got, before+1)
		}
	})
	t.Run("well-formed but oversized", func(t *testing.T) {
		before := oversized()
		s, err := isobarpb.NewCellRegistryClient(conn).Heartbeat(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hb := heartbeat("big", "127.0.0.1:2002", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
		hb.Incarnation = strings.Repeat("x", 70<<10)
		if err := s.Send(hb); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "limit 65536") {
			t.Fatalf("70 KiB heartbeat: %v, want ResourceExhausted naming the limit", err)
		}
		if got := oversized(); got != before+1 {
			t.Errorf("rejected{oversized} = %v, want %v", got, before+1)
		}
	})
	t.Run("under the cap", func(t *testing.T) {
		s, err := isobarpb.NewCellRegistryClient(conn).Heartbeat(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(heartbeat("small", "127.0.0.1:2003", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)); err != nil {
			t.Fatal(err)
		}
		if ack, err := s.Recv(); err != nil || ack.GetError() != "" {
			t.Fatalf("heartbeat under the cap: %v %v", ack, err)
		}
	})
}
