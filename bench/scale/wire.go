package scale

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/stats"
)

// maxWireTimes bounds the times a wireLog keeps (the oldest half goes when
// it is full); a point's death rounds need the last few seconds' only.
const maxWireTimes = 1 << 14

// wireLog is a gRPC stats.Handler that records when xDS responses cross
// the wire on ADS streams (state-of-the-world or delta): on the xDS
// client's connection, when each response has been read (InPayload); on
// region 0's controller, when each was written to the transport
// (OutPayload). Times come from the point's clock, as the removals' do.
// Every other RPC (heartbeats, health) is ignored. The gRPC stream
// goroutines call HandleRPC; lastBefore is called by the harness, under
// mu.
type wireLog struct {
	clock clockwork.Clock
	// client: record InPayload of a client stream, else OutPayload of a
	// server stream.
	client bool

	mu sync.Mutex
	at []time.Time // in the order they happened
}

type adsTag struct{}

func newWireLog(clock clockwork.Clock, client bool) *wireLog {
	return &wireLog{clock: clock, client: client}
}

// isADS reports whether method is one of ADS's two streams.
func isADS(method string) bool {
	return strings.HasPrefix(method, "/envoy.service.discovery.v3.AggregatedDiscoveryService/")
}

// TagRPC implements stats.Handler: it marks ADS streams.
func (w *wireLog) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if isADS(info.FullMethodName) {
		return context.WithValue(ctx, adsTag{}, true)
	}
	return ctx
}

// HandleRPC implements stats.Handler: it records a response read by the
// client or written by the server on an ADS stream.
func (w *wireLog) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if ctx.Value(adsTag{}) == nil {
		return
	}
	switch s.(type) {
	case *stats.InPayload:
		if !w.client || !s.IsClient() {
			return
		}
	case *stats.OutPayload:
		if w.client || s.IsClient() {
			return
		}
	default:
		return
	}
	w.record(w.clock.Now())
}

func (w *wireLog) record(at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.at) == maxWireTimes {
		w.at = append(w.at[:0], w.at[maxWireTimes/2:]...)
	}
	w.at = append(w.at, at)
}

// TagConn implements stats.Handler.
func (w *wireLog) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn implements stats.Handler.
func (w *wireLog) HandleConn(context.Context, stats.ConnStats) {}

// lastBefore returns the latest recorded time not after t; ok is false when
// there is none.
func (w *wireLog) lastBefore(t time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.at) - 1; i >= 0; i-- {
		if !w.at[i].After(t) {
			return w.at[i], true
		}
	}
	return time.Time{}, false
}
