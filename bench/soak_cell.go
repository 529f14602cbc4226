package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// soakModel is the model every synthetic cell serves.
const soakModel = "soak/synthetic-70b"

// cellStats are counters shared by every synthetic cell (atomics).
type cellStats struct {
	heartbeats   atomic.Uint64 // sent
	bytes        atomic.Uint64 // marshalled size of the heartbeats sent
	kills        atomic.Uint64 // streams cut by the churner
	returns      atomic.Uint64 // streams reopened after a kill and acked
	streamErrors atomic.Uint64 // streams that ended without a kill
	ackErrors    atomic.Uint64 // heartbeats the controller refused
	slowKills    atomic.Uint64 // kills whose stream outlived its sockets
	lastError    atomic.Pointer[string]
}

func (s *cellStats) noteError(err string) { s.lastError.Store(&err) }

// synthCell is one synthetic cell: a real heartbeat stream to its region's
// controller, over its own TCP connection, with plausible signals. Its
// goroutine (run) owns everything but up and kill.
type synthCell struct {
	id, region, endpoint, ctrl string
	index                      int
	interval, down             time.Duration
	clock                      clockwork.Clock
	log                        *slog.Logger
	stats                      *cellStats
	rng                        *rand.Rand // run's only

	// up: a stream is open and the controller acked it.
	up atomic.Bool
	// kill asks run to cut its stream (one slot; a second ask is dropped).
	// A non-nil reply receives the time the sockets were closed.
	kill chan chan<- time.Time
	// silence asks run to stop sending on its open stream (one slot), as
	// a hung agent whose connection stays up: only a kill or ctx ends it.
	silence chan struct{}

	load float64 // run's only: the random-walk load behind the signals
}

func newSynthCell(region string, regionIdx, index int, ctrl string, cfg SoakConfig, clock clockwork.Clock, log *slog.Logger, st *cellStats) *synthCell {
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(regionIdx)<<32|uint64(index)))
	return &synthCell{
		id: fmt.Sprintf("%s-cell-%d", region, index), region: region, ctrl: ctrl, index: index,
		// Distinct fake endpoints (a shared one would conflict); the
		// controller's prober dials the soak's sink instead.
		endpoint: fmt.Sprintf("127.%d.%d.%d:8000", 1+regionIdx, index/250, 1+index%250),
		interval: cfg.HeartbeatInterval, down: cfg.ChurnDown, clock: clock, log: log.With("cell", fmt.Sprintf("%s-cell-%d", region, index)),
		stats: st, rng: rng, kill: make(chan chan<- time.Time, 1), silence: make(chan struct{}, 1), load: 0.2 + 0.6*rng.Float64(),
	}
}

// Kill asks the cell to die abruptly; false when it is not up or already
// asked.
func (c *synthCell) Kill() bool { return c.askKill(nil) }

// askKill asks run to die, with reply for the time of the close (nil:
// none wanted); false when it is not up or already asked.
func (c *synthCell) askKill(reply chan<- time.Time) bool {
	if !c.up.Load() {
		return false
	}
	select {
	case c.kill <- reply:
		return true
	default:
		return false
	}
}

// run keeps the cell alive until ctx ends: a stream, and after a kill a
// downtime and a new stream (new incarnation, sequence from 1). When ctx
// ends the cell terminates its stream cleanly.
func (c *synthCell) run(ctx context.Context) {
	// A random phase spreads the cells' heartbeats over the interval.
	if !c.wait(ctx, time.Duration(c.rng.Int64N(int64(c.interval)))) {
		return
	}
	returning := false
	for incarnation := 1; ctx.Err() == nil; incarnation++ {
		killed, err := c.session(ctx, incarnation, returning)
		if ctx.Err() != nil {
			return
		}
		if killed {
			returning = true
			if !c.wait(ctx, c.down) {
				return
			}
			continue
		}
		returning = false
		c.stats.streamErrors.Add(1)
		c.stats.noteError(fmt.Sprintf("%s: stream ended: %v", c.id, err))
		c.log.Warn("heartbeat stream ended unexpectedly", "err", err)
		if !c.wait(ctx, c.interval) {
			return
		}
	}
}

func (c *synthCell) wait(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-c.clock.After(d):
		return true
	}
}

// killTimeout bounds how long a killed cell waits for its stream to break
// after its sockets closed, before it cancels the stream itself.
const killTimeout = 2 * time.Second

// errKilled ends a session the churner cut.
var errKilled = errors.New("bench: killed by the churner")

// connTracker remembers every connection a session dials (gRPC may
// redial, and retries an RPC that never reached the server transparently
// on the new one), so a kill can close them all.
type connTracker struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (t *connTracker) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		t.mu.Lock()
		t.conns = append(t.conns, conn)
		t.mu.Unlock()
	}
	return conn, err
}

// closeAll ends every connection as a killed process's kernel does: the
// FIN of each goes out at once (CloseWrite: shutdown(2), which waits for
// nothing), then the descriptors are closed. Close alone sends the FIN
// only once the last goroutine using the descriptor (the gRPC transport's
// reader, woken by the close) has let go of it (internal/poll FD.Close):
// in a busy cell process the death's time, taken at the close, would
// count that goroutine's wait for the CPU as the controller's. (Three
// interleaved runs at 10,000 cells each way did not separate the two
// through the machine's noise: docs/bench.md.)
func (t *connTracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, conn := range t.conns {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	for _, conn := range t.conns {
		_ = conn.Close()
	}
}

// session runs one stream. killed reports that the churner cut it.
func (c *synthCell) session(ctx context.Context, incarnation int, returning bool) (killed bool, err error) {
	var conns connTracker
	// As the cellagent dials: static windows, no BDP pings (grpcbounds).
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(conns.dial), grpc.WithReadBufferSize(8 << 10), grpc.WithWriteBufferSize(8 << 10)},
		grpcbounds.SmallMessagesDial()...)
	cc, err := grpc.NewClient(c.ctrl, opts...)
	if err != nil {
		return false, err
	}
	defer cc.Close()
	// The stream outlives ctx by the final heartbeat (bounded below).
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stream, err := isobarpb.NewCellRegistryClient(cc).Heartbeat(sctx)
	if err != nil {
		return false, err
	}
	recvDone := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { recvDone <- c.receiveAcks(stream, returning) })
	defer c.up.Store(false)
	inc := fmt.Sprintf("soak-%d", incarnation)
	var seq uint64
	send := func(final bool) error {
		seq++
		hb := c.heartbeat(inc, seq, final)
		if err := stream.Send(hb); err != nil {
			return err
		}
		c.stats.heartbeats.Add(1)
		c.stats.bytes.Add(uint64(proto.Size(hb)))
		return nil
	}
	select {
	case <-c.silence: // asked of an earlier stream, before its end
	default:
	}
	t := c.clock.NewTicker(c.interval)
	defer t.Stop()
	tick := t.Chan()
	for err := send(false); ; {
		if err != nil {
			// A failed Send means the stream is over; Recv has its status.
			return false, <-recvDone
		}
		select {
		case <-c.silence:
			tick = nil // the stream stays open; nothing more is sent
		case <-ctx.Done():
			c.up.Store(false)
			_ = send(true)
			_ = stream.CloseSend()
			select {
			case <-recvDone:
			case <-c.clock.After(2 * time.Second):
			}
			return false, ctx.Err()
		case reply := <-c.kill:
			c.die(&conns, recvDone, reply, func() { cancel(); _ = cc.Close() })
			return true, errKilled
		case err := <-recvDone:
			if errors.Is(err, io.EOF) {
				err = errors.New("stream closed by the controller")
			}
			return false, err
		case <-tick:
			err = send(false)
		}
	}
}

// receiveAcks reads the stream's acks until it ends and returns Recv's
// error; the first ack of a returning cell counts its return.
func (c *synthCell) receiveAcks(stream isobarpb.CellRegistry_HeartbeatClient, returning bool) error {
	for {
		ack, err := stream.Recv()
		if err != nil {
			return err
		}
		if e := ack.GetError(); e != "" {
			c.stats.ackErrors.Add(1)
			c.stats.noteError(fmt.Sprintf("%s: heartbeat refused: %s", c.id, e))
		}
		if !c.up.Swap(true) && returning {
			c.stats.returns.Add(1)
		}
	}
}

// die ends the session like a SIGKILLed agent: the kernel closes the
// sockets. When the stream outlives them (a transparent retry on a
// connection dialled since), abort ends it from this side. A non-nil
// reply receives the time the sockets were closed (it has room for one).
func (c *synthCell) die(conns *connTracker, recvDone <-chan error, reply chan<- time.Time, abort func()) {
	c.up.Store(false)
	c.stats.kills.Add(1)
	at := c.clock.Now()
	conns.closeAll()
	if reply != nil {
		reply <- at
	}
	select {
	case <-recvDone:
	case <-c.clock.After(killTimeout):
		c.stats.slowKills.Add(1)
		abort()
		<-recvDone
	}
}

// heartbeat renders the cell's state: a random walk of its load drives
// every signal within the ranges a busy vLLM replica shows.
func (c *synthCell) heartbeat(incarnation string, seq uint64, final bool) *isobarpb.CellHeartbeat {
	c.load = min(0.95, max(0.05, c.load+0.04*(c.rng.Float64()-0.5)))
	l := c.load
	f := func(v float64) *float64 { return &v }
	throttle := uint64(0)
	state := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	reason := ""
	if final {
		state, reason = isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED, "soak finished"
	}
	now := timestamppb.New(c.clock.Now())
	return &isobarpb.CellHeartbeat{
		CellId: c.id, Region: c.region, Endpoint: c.endpoint,
		Capability: &isobarpb.Capability{Model: soakModel, MaxModelLen: 32768},
		State:      state,
		Signals: &isobarpb.Signals{
			QueueDepth: f(float64(int(8 * l * l))), Running: f(float64(int(4 + 28*l))),
			TtftP95Seconds: f(0.15 + 0.9*l*l), ErrorRate: f(0.002 * c.rng.Float64()), KvCacheUsage: f(0.1 + 0.8*l),
			GpuUtil: f(0.3 + 0.65*l), VramUsed: f(0.85 + 0.1*l), SmActive: f(0.2 + 0.7*l), DramActive: f(0.15 + 0.6*l),
			TemperatureCelsius: f(45 + 35*l), PowerWatts: f(180 + 450*l), ClockThrottleReasons: &throttle,
			RequestRate: f(0.3 + 1.2*l), WindowRequests: f(10 * (0.3 + 1.2*l)),
		},
		Vllm:     &isobarpb.SourceHealth{Ok: true, LastSuccess: now},
		Dcgm:     &isobarpb.SourceHealth{Ok: true, LastSuccess: now},
		Sequence: seq, SentAt: now, Reason: reason, Incarnation: incarnation,
	}
}
