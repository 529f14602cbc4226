package regional

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// heartbeatSink is what the heartbeat service needs from the registry.
type heartbeatSink interface {
	SubmitOrBlock(ctx context.Context, hb *isobarpb.CellHeartbeat) error
	StreamLost(ctx context.Context, id, incarnation string, seq uint64) error
	View() *View
}

var _ heartbeatSink = (*Registry)(nil)

// heartbeatService is the gRPC adapter for CellRegistry: it validates each
// heartbeat, enforces one stream per cell id and the client certificate's
// identity, hands accepted heartbeats to the registry and acks.
type heartbeatService struct {
	isobarpb.UnsafeCellRegistryServer

	region   string
	interval time.Duration
	ttl      time.Duration
	mtls     bool
	binding  endpointBinder
	maxBytes int
	limits   Limits
	sink     heartbeatSink
	clock    clockwork.Clock
	log      *slog.Logger
	metrics  *metrics

	nextStream atomic.Uint64
	mu         sync.Mutex
	owners     map[string]*streamOwner
}

type streamOwner struct {
	stream   uint64
	lastSeen time.Time
}

var _ isobarpb.CellRegistryServer = (*heartbeatService)(nil)

func newHeartbeatService(cfg Config, sink heartbeatSink, clock clockwork.Clock, log *slog.Logger, m *metrics) *heartbeatService {
	return &heartbeatService{
		region: cfg.Region, interval: cfg.HeartbeatInterval, ttl: cfg.TTL(), mtls: cfg.TLS.Enabled(), limits: cfg.Limits,
		sink: sink, clock: clock, log: log, metrics: m, owners: make(map[string]*streamOwner),
		binding: endpointBinder{mode: cfg.endpointBinding(), m: cfg.EndpointMap},
	}
}

// streamState is one stream's own bookkeeping; owned by its handler.
type streamState struct {
	id          uint64
	cell        string
	incarnation string
	lastSeq     uint64
	acked       bool
	drainSent   bool
	bucket      tokenBucket
	// submitted: a heartbeat was handed to the registry; subInc and subSeq
	// identify the last one; terminated: it reported Terminated (a clean
	// goodbye, not a break).
	submitted  bool
	subInc     string
	subSeq     uint64
	terminated bool
}

// Heartbeat serves one cellagent's stream.
func (s *heartbeatService) Heartbeat(stream isobarpb.CellRegistry_HeartbeatServer) error {
	ctx := stream.Context()
	st := &streamState{id: s.nextStream.Add(1), bucket: newTokenBucket(s.limits.HeartbeatRate, s.limits.HeartbeatBurst)}
	s.metrics.streams.Inc()
	defer func() {
		s.metrics.streams.Dec()
		s.lost(st)
		s.release(st)
	}()
	var cert *certs.Identity
	var grant endpointGrant
	if s.mtls {
		id, err := s.peerCell(ctx)
		if err != nil {
			s.metrics.rejected.WithLabelValues(rejectReason(err)).Inc()
			s.log.Warn("heartbeat stream refused", "peer_identity", peerName(ctx), "err", err)
			return status.Error(codes.PermissionDenied, err.Error())
		}
		cert = &id
		grant = s.binding.grant(ctx, id)
	}
	for {
		hb, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if status.Code(err) == codes.ResourceExhausted {
				s.metrics.rejected.WithLabelValues(rejectReason(ErrOversized)).Inc()
				s.log.Warn("oversized heartbeat refused", "cell", st.cell, "err", err)
			}
			return err
		}
		if s.maxBytes > 0 && proto.Size(hb) > s.maxBytes {
			s.metrics.rejected.WithLabelValues(rejectReason(ErrOversized)).Inc()
			return status.Errorf(codes.ResourceExhausted, "%v: %d bytes, limit %d", ErrOversized, proto.Size(hb), s.maxBytes)
		}
		if drop, err := s.admitRate(st); drop {
			if err != nil {
				s.log.Warn("heartbeat stream closed: far above its rate limit", "cell", st.cell, "err", err)
				return status.Error(codes.ResourceExhausted, err.Error())
			}
			continue
		}
		if err := s.check(st, hb, cert, grant); err != nil {
			s.metrics.rejected.WithLabelValues(rejectReason(err)).Inc()
			s.log.Warn("heartbeat refused", "cell", trunc(hb.GetCellId()), "peer_identity", peerName(ctx), "err", err)
			if code := fatalCode(err); code != codes.OK {
				return status.Error(code, err.Error())
			}
			if err := stream.Send(&isobarpb.HeartbeatAck{Sequence: hb.GetSequence(), Error: err.Error()}); err != nil {
				return err
			}
			continue
		}
		inc, seq := hb.GetIncarnation(), hb.GetSequence()
		terminated := hb.GetState() == isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED
		if err := s.sink.SubmitOrBlock(ctx, hb); err != nil {
			if errors.Is(err, ErrStopped) {
				return status.Error(codes.Unavailable, "regional controller is shutting down")
			}
			return status.FromContextError(err).Err()
		}
		// The registry owns hb now; the stream keeps only copies.
		st.submitted, st.subInc, st.subSeq, st.terminated = true, inc, seq, terminated
		if err := s.ack(stream, st, hb); err != nil {
			return err
		}
	}
}

// check validates hb in the context of its stream.
// With mTLS, cert is the stream's verified cell identity: a heartbeat for
// any other cell id or region is refused before anything else is looked at,
// and grant (what the certificate allows) must allow the endpoint.
func (s *heartbeatService) check(st *streamState, hb *isobarpb.CellHeartbeat, cert *certs.Identity, grant endpointGrant) error {
	if cert != nil {
		if err := identityMatches(*cert, hb); err != nil {
			return err
		}
	}
	if err := validateHeartbeat(hb, s.region); err != nil {
		return err
	}
	if cert != nil {
		if err := s.binding.allow(grant, hb.GetEndpoint()); err != nil {
			return err
		}
	}
	id := hb.GetCellId()
	if st.cell != "" && st.cell != id {
		return fmt.Errorf("%w: stream bound to cell %s sent a heartbeat for %s", ErrInvalidHeartbeat, st.cell, id)
	}
	if hb.GetIncarnation() != st.incarnation {
		st.incarnation, st.lastSeq = hb.GetIncarnation(), 0
	}
	if hb.GetSequence() <= st.lastSeq {
		return fmt.Errorf("%w: cell %s sequence %d after %d", ErrStaleSequence, id, hb.GetSequence(), st.lastSeq)
	}
	if err := s.claim(st, id); err != nil {
		return err
	}
	st.lastSeq = hb.GetSequence()
	return nil
}

// fatalCode says which refusals end the stream.
func fatalCode(err error) codes.Code {
	switch {
	case errors.Is(err, ErrIdentityMismatch), errors.Is(err, ErrIdentityRegion), errors.Is(err, ErrNoCellIdentity),
		errors.Is(err, ErrEndpointNotAllowed):
		return codes.PermissionDenied
	case errors.Is(err, ErrDuplicateCell):
		return codes.AlreadyExists
	case errors.Is(err, ErrWrongRegion):
		return codes.FailedPrecondition
	case errors.Is(err, ErrTooManyCells):
		return codes.ResourceExhausted
	default:
		return codes.OK
	}
}

// claim binds cell id to this stream. Another stream holding it keeps it
// unless it has been silent for a TTL (a half-open connection of an agent
// that restarted).
func (s *heartbeatService) claim(st *streamState, id string) error {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.owners[id]
	switch {
	case o == nil:
		if err := s.admitCell(id); err != nil {
			return err
		}
		s.owners[id] = &streamOwner{stream: st.id, lastSeen: now}
	case o.stream == st.id:
		o.lastSeen = now
	case now.Sub(o.lastSeen) >= s.ttl:
		s.log.Info("cell id taken over by a new stream; the old one was silent", "cell", id)
		o.stream, o.lastSeen = st.id, now
	default:
		return fmt.Errorf("%w: %s (its stream sent a heartbeat %v ago)", ErrDuplicateCell, id, now.Sub(o.lastSeen).Round(time.Millisecond))
	}
	st.cell = id
	return nil
}

// lost reports the end of a stream that delivered heartbeats without a
// Terminated report, so the registry can take the cell out of the load
// balancer now rather than at the TTL. It runs before release, while the
// stream still owns its cell id; the registry ignores it if a newer
// heartbeat (a reconnect) got there first. The hand-off waits at most a
// TTL: past that the TTL removes the cell anyway.
func (s *heartbeatService) lost(st *streamState) {
	if !st.submitted || st.terminated {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
	defer cancel()
	if err := s.sink.StreamLost(ctx, st.cell, st.subInc, st.subSeq); err != nil && !errors.Is(err, ErrStopped) {
		s.log.Warn("could not report a broken heartbeat stream; the TTL will fail the cell", "cell", st.cell, "err", err)
	}
}

func (s *heartbeatService) release(st *streamState) {
	if st.cell == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.owners[st.cell]; o != nil && o.stream == st.id {
		delete(s.owners, st.cell)
	}
}

// ack answers the first heartbeat of a stream and carries drain commands
// when the operator's wish differs from what the agent was last told.
func (s *heartbeatService) ack(stream isobarpb.CellRegistry_HeartbeatServer, st *streamState, hb *isobarpb.CellHeartbeat) error {
	cv, known := s.sink.View().Cell(st.cell)
	var cmds []isobarpb.Command
	if known && cv.OperatorDrain != st.drainSent {
		st.drainSent = cv.OperatorDrain
		if cv.OperatorDrain {
			cmds = append(cmds, isobarpb.Command_COMMAND_DRAIN)
		} else {
			cmds = append(cmds, isobarpb.Command_COMMAND_UNDRAIN)
		}
	}
	if st.acked && len(cmds) == 0 {
		return nil
	}
	st.acked = true
	ack := &isobarpb.HeartbeatAck{
		Sequence: hb.GetSequence(),
		Interval: durationpb.New(s.interval),
		Commands: cmds,
	}
	if known {
		ack.State = cv.State.Proto()
	}
	return stream.Send(ack)
}
