package xdsclient

import (
	"context"
	"log/slog"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sotw "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/internal/truncate"
)

// UserAgent is the node user_agent_name the gateway and the Watcher send;
// the regional controller classifies it as an Envoy-kind node.
const UserAgent = "isobar-gateway"

// Subscription keeps one state-of-the-world ADS stream for one resource type
// (wildcard: every resource of the type) alive on go-control-plane's ADS
// client, reconnecting with full-jitter exponential backoff. Each response
// goes to Apply: nil ACKs it, an error NACKs it (the previous resources stay
// in use). Run's goroutine is the only one; Apply, Connected and Size are
// called from it. The fields are set before Run and not changed after.
type Subscription struct {
	TypeURL string
	Label   string // "cluster", "endpoint", "route", for logs and metrics
	Node    *core.Node
	Conn    grpc.ClientConnInterface
	Clock   clockwork.Clock
	Log     *slog.Logger
	// Min and Max bound the reconnect and NACK backoff.
	Min, Max time.Duration
	// Apply validates and stores one response. version is the response's
	// version_info.
	Apply func(resources []*anypb.Any, version string) error
	// Connected reports the stream going up (true) or down (false); may be
	// nil.
	Connected func(bool)
	// MaxMsg is the largest response received (grpc.MaxCallRecvMsgSize);
	// 0: gRPC's default 4 MiB.
	MaxMsg int
	// Size, when set, is told the encoded size of every response received
	// and whether a stream broke on one above MaxMsg (n is then 0).
	Size func(n int, tooLarge bool)
	// Delta, with TypeURL the ClusterLoadAssignment type, runs the delta
	// (incremental) variant of ADS instead, with LEDS when the controller
	// serves it (delta.go); Apply still gets every assignment, whole,
	// unless ApplyDecoded is set.
	// Default false: state-of-the-world.
	Delta bool
	// ApplyDecoded, when set, takes Apply's place on a Delta stream: it
	// gets what DecodeAssignments makes of every assignment, kept up to
	// date by the changed endpoints alone (delta_apply.go), and the
	// clusters whose list changed since its last successful call, sorted.
	// The map is new on each call; a cluster not in changed has the slice
	// of that last call. The receiver must not change the slices in place.
	// nil: Apply gets the assignments reassembled whole.
	ApplyDecoded func(clusters map[string][]Endpoint, changed []string, version string) error
	// Refused, when set, is told of each Delta response refused (NACKed)
	// before Apply or ApplyDecoded, which count their own refusals.
	Refused func(error)
}

// Run serves the subscription until ctx ends.
func (s *Subscription) Run(ctx context.Context) {
	bo := backoff.New(backoff.Policy{Min: s.Min, Max: s.Max, Jitter: backoff.Full})
	for ctx.Err() == nil {
		var got bool
		var err error
		if s.Delta && s.TypeURL == resource.EndpointType {
			got, err = s.deltaSession(ctx)
		} else {
			got, err = s.session(ctx)
		}
		if s.Connected != nil {
			s.Connected(false)
		}
		if ctx.Err() != nil {
			return
		}
		if got {
			bo.Reset()
		}
		wait := bo.Next()
		s.Log.Info("xds stream ended; reconnecting", "type", s.Label, "err", err, "retry_in", wait)
		t := s.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}

// session runs one stream; got reports whether any response was accepted.
func (s *Subscription) session(ctx context.Context) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rec := &recordingConn{ClientConnInterface: s.Conn, maxMsg: s.MaxMsg, size: s.Size}
	cl := sotw.NewADSClient(sctx, s.Node, s.TypeURL)
	if err := cl.InitConnect(rec); err != nil {
		return false, err
	}
	first := true
	// The wait before each NACK doubles from min to max; an ACK resets it.
	nackPace := backoff.New(backoff.Policy{Min: s.Min, Max: s.Max, Jitter: backoff.None})
	for {
		resp, err := cl.Fetch()
		if err != nil {
			if status.Code(err) == codes.ResourceExhausted && s.Size != nil {
				s.Size(0, true)
				s.Log.Error("xds response above the receive limit; the stream reconnects and the last configuration stays in use: set --xds-max-cells to the controller's --max-cells",
					"type", s.Label, "limit_bytes", s.MaxMsg, "err", err)
			}
			return got, err
		}
		if first && s.Connected != nil {
			s.Connected(true)
			first = false
		}
		version := rec.lastVersion()
		if err := s.Apply(resp.Resources, version); err != nil {
			nackWait := nackPace.Next()
			s.Log.Warn("xds update refused", "type", s.Label, "version", version, "err", err, "nack_in", nackWait)
			// A server may resend a refused response at once, forever;
			// waiting before each NACK bounds that loop's rate.
			t := s.Clock.NewTimer(nackWait)
			select {
			case <-ctx.Done():
				t.Stop()
				return got, ctx.Err()
			case <-t.Chan():
			}
			if err := cl.Nack(truncate.String(err.Error(), 1024)); err != nil {
				return got, err
			}
			continue
		}
		nackPace.Reset()
		got = true
		if err := cl.Ack(); err != nil {
			return got, err
		}
	}
}

// recordingConn wraps the gRPC connection so that the version_info of the
// responses the ADS client receives can be read (the client's Response
// carries only the resources), their sizes measured, and the stream opened
// with the receive limit (go-control-plane's client takes no call
// options).
type recordingConn struct {
	grpc.ClientConnInterface
	maxMsg  int
	size    func(n int, tooLarge bool)
	mu      sync.Mutex
	version string
}

func (c *recordingConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if c.maxMsg > 0 {
		opts = append(opts, grpc.MaxCallRecvMsgSize(c.maxMsg))
	}
	st, err := c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &recordingStream{ClientStream: st, c: c}, nil
}

func (c *recordingConn) lastVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

type recordingStream struct {
	grpc.ClientStream
	c *recordingConn
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*discovery.DiscoveryResponse); ok && err == nil {
		if s.c.size != nil {
			s.c.size(proto.Size(r), false)
		}
		s.c.mu.Lock()
		s.c.version = r.GetVersionInfo()
		s.c.mu.Unlock()
	}
	return err
}
