package cellagent

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// fakeRegistry is a CellRegistry on 127.0.0.1 that checks the heartbeat
// protocol as it runs: required fields set, sequence strictly increasing per
// incarnation across streams, nothing after TERMINATED, signals in range and
// absent when their source is down. It acks the first heartbeat of each
// stream, as the controller does, and sends whatever acks the test queues.
type fakeRegistry struct {
	isobarpb.UnimplementedCellRegistryServer
	t    testing.TB
	addr string

	mu         sync.Mutex
	srv        *grpc.Server
	served     chan struct{}
	lastSeq    map[string]uint64
	terminated map[string]bool
	violations []string

	hbs     chan *isobarpb.CellHeartbeat
	acks    chan *isobarpb.HeartbeatAck
	streams atomic.Int32
	eofs    atomic.Int32
	opts    []grpc.ServerOption
	peers   chan []string // URI SANs of each stream's client certificate
	// holdOpen makes the controller ignore a half-close and keep the
	// stream open until the client cancels it.
	holdOpen atomic.Bool
}

func newFakeRegistry(t testing.TB, opts ...grpc.ServerOption) *fakeRegistry {
	r := &fakeRegistry{
		t:          t,
		opts:       opts,
		peers:      make(chan []string, 16),
		lastSeq:    map[string]uint64{},
		terminated: map[string]bool{},
		hbs:        make(chan *isobarpb.CellHeartbeat, 4096),
		acks:       make(chan *isobarpb.HeartbeatAck, 16),
	}
	r.start("127.0.0.1:0")
	t.Cleanup(func() {
		r.stop()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, v := range r.violations {
			t.Errorf("protocol violation: %s", v)
		}
	})
	return r
}

func (r *fakeRegistry) start(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatalf("registry listen %s: %v", addr, err)
	}
	srv := grpc.NewServer(r.opts...)
	isobarpb.RegisterCellRegistryServer(srv, r)
	served := make(chan struct{})
	r.mu.Lock()
	r.addr, r.srv, r.served = ln.Addr().String(), srv, served
	r.mu.Unlock()
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
}

// stop kills the server and its streams (Stop, not GracefulStop: the
// controller goes away).
func (r *fakeRegistry) stop() {
	r.mu.Lock()
	srv, served := r.srv, r.served
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		srv.Stop()
		<-served
	}
}

// restart serves again on the same address.
func (r *fakeRegistry) restart() { r.start(r.addr) }

func (r *fakeRegistry) violate(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

func (r *fakeRegistry) Heartbeat(stream grpc.BidiStreamingServer[isobarpb.CellHeartbeat, isobarpb.HeartbeatAck]) error {
	r.streams.Add(1)
	if p, ok := peer.FromContext(stream.Context()); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			var uris []string
			for _, u := range ti.State.PeerCertificates[0].URIs {
				uris = append(uris, u.String())
			}
			r.peers <- uris
		}
	}
	recvErr := make(chan error, 1)
	first := make(chan uint64, 1)
	// The reader ends when the stream does (the handler's return cancels it).
	go func() {
		n := 0
		for {
			hb, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			r.check(hb)
			r.t.Logf("HB seq=%d at=%v state=%v dcgm=%v", hb.GetSequence(), hb.GetSentAt().AsTime().Format("05.000"), hb.GetState(), hb.GetDcgm().GetOk())
			r.hbs <- hb
			if n++; n == 1 {
				first <- hb.GetSequence()
			}
		}
	}()
	for {
		select {
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				r.eofs.Add(1)
				if r.holdOpen.Load() {
					<-stream.Context().Done()
				}
				return nil
			}
			return err
		case seq := <-first:
			if err := stream.Send(&isobarpb.HeartbeatAck{Sequence: seq, State: isobarpb.LifecycleState_LIFECYCLE_STATE_READY}); err != nil {
				return err
			}
		case ack := <-r.acks:
			if err := stream.Send(ack); err != nil {
				return err
			}
		}
	}
}

func (r *fakeRegistry) check(hb *isobarpb.CellHeartbeat) {
	switch {
	case hb.GetCellId() == "", hb.GetRegion() == "", hb.GetEndpoint() == "", hb.GetIncarnation() == "":
		r.violate("identity fields missing: %v", hb)
	case hb.GetSentAt() == nil || hb.GetSentAt().CheckValid() != nil:
		r.violate("sent_at missing: %v", hb)
	case hb.GetState() == isobarpb.LifecycleState_LIFECYCLE_STATE_UNSPECIFIED:
		r.violate("state unspecified: %v", hb)
	case hb.GetSignals() == nil || hb.GetVllm() == nil || hb.GetDcgm() == nil || hb.GetCapability() == nil:
		r.violate("signals, sources or capability missing: %v", hb)
	case hb.GetState() != isobarpb.LifecycleState_LIFECYCLE_STATE_READY && hb.GetReason() == "":
		r.violate("state %v without a reason", hb.GetState())
	}
	r.mu.Lock()
	inc := hb.GetIncarnation()
	if last := r.lastSeq[inc]; hb.GetSequence() <= last {
		r.violations = append(r.violations, fmt.Sprintf("sequence %d after %d", hb.GetSequence(), last))
	}
	r.lastSeq[inc] = hb.GetSequence()
	if r.terminated[inc] {
		r.violations = append(r.violations, fmt.Sprintf("heartbeat %d after TERMINATED", hb.GetSequence()))
	}
	if hb.GetState() == isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED {
		r.terminated[inc] = true
	}
	r.mu.Unlock()

	s := hb.GetSignals()
	for name, v := range map[string]*float64{
		"kv_cache_usage": s.KvCacheUsage, "error_rate": s.ErrorRate, "gpu_util": s.GpuUtil,
		"vram_used": s.VramUsed, "sm_active": s.SmActive, "dram_active": s.DramActive,
	} {
		if v != nil && !(*v >= 0 && *v <= 1) {
			r.violate("%s = %v outside [0,1]", name, *v)
		}
	}
	for name, v := range map[string]*float64{
		"queue_depth": s.QueueDepth, "running": s.Running, "ttft_p95_seconds": s.TtftP95Seconds,
		"request_rate": s.RequestRate, "window_requests": s.WindowRequests,
	} {
		if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0) {
			r.violate("%s = %v", name, *v)
		}
	}
	if !hb.GetDcgm().GetOk() && hasHardware(s) {
		r.violate("dcgm down but hardware signals sent: %v", s)
	}
	if !hb.GetVllm().GetOk() && (s.QueueDepth != nil || s.TtftP95Seconds != nil || s.KvCacheUsage != nil) {
		r.violate("vllm down but application signals sent: %v", s)
	}
}

func hasHardware(s *isobarpb.Signals) bool {
	return s.GpuUtil != nil || s.VramUsed != nil || s.SmActive != nil || s.DramActive != nil ||
		s.TemperatureCelsius != nil || s.PowerWatts != nil || s.ClockThrottleReasons != nil
}

// next returns the next heartbeat, failing after a real-time deadline.
func (r *fakeRegistry) next(t testing.TB) *isobarpb.CellHeartbeat {
	t.Helper()
	select {
	case hb := <-r.hbs:
		return hb
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat within 10s")
		return nil
	}
}

// nextMatching discards heartbeats until one satisfies ok.
func (r *fakeRegistry) nextMatching(t testing.TB, what string, ok func(*isobarpb.CellHeartbeat) bool) *isobarpb.CellHeartbeat {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case hb := <-r.hbs:
			if ok(hb) {
				return hb
			}
		case <-deadline:
			t.Fatalf("no heartbeat with %s within 10s", what)
			return nil
		}
	}
}

// none reports whether no heartbeat is queued.
func (r *fakeRegistry) none() bool { return len(r.hbs) == 0 }
