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
	// firstTimeout: a stream that sends no heartbeat this long after it
	// opens is closed (Config.FirstHeartbeatTimeout); maxStreams caps the
	// heartbeat streams open at once (Limits.MaxHeartbeatStreams).
	firstTimeout time.Duration
	maxStreams   int64
	active       atomic.Int64
	sink         heartbeatSink
	clock        clockwork.Clock
	log          *slog.Logger
	metrics      *metrics

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
		maxBytes: cfg.MaxMessageBytes, firstTimeout: cfg.FirstHeartbeatTimeout, maxStreams: int64(cfg.Limits.MaxHeartbeatStreams),
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
	// valid: the id and endpoint of the last heartbeat that passed
	// validation (validateHeartbeatOn).
	valid validMemo
}

// Heartbeat serves one cellagent's stream.
func (s *heartbeatService) Heartbeat(stream isobarpb.CellRegistry_HeartbeatServer) error {
	ctx := stream.Context()
	if n := s.active.Add(1); s.maxStreams > 0 && n > s.maxStreams {
		s.active.Add(-1)
		s.metrics.rejected.WithLabelValues(reasonTooManyStreams).Inc()
		return status.Errorf(codes.ResourceExhausted, "%v: %d heartbeat streams open, limit %d (Limits.MaxHeartbeatStreams)", ErrTooManyStreams, n-1, s.maxStreams)
	}
	defer s.active.Add(-1)
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
	for first := true; ; first = false {
		var hb *isobarpb.CellHeartbeat
		var err error
		if first {
			hb, err = s.recvFirst(ctx, stream)
		} else {
			hb, err = s.recv(stream)
		}
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

// Heartbeat stream refusals, reason labels of
// isobar_regional_heartbeats_rejected_total.
const (
	reasonTooManyStreams = "too_many_streams"
	reasonFirstTimeout   = "first_heartbeat_timeout"
)

// ErrTooManyStreams: Limits.MaxHeartbeatStreams heartbeat streams are open;
// a new one is refused with ResourceExhausted (reason too_many_streams).
var ErrTooManyStreams = errors.New("regional: heartbeat stream limit reached")

// ErrNoFirstHeartbeat: a stream sent no heartbeat within
// Config.FirstHeartbeatTimeout of opening; it is closed with
// DeadlineExceeded (reason first_heartbeat_timeout).
var ErrNoFirstHeartbeat = errors.New("regional: no heartbeat on a new stream")

// recv reads one heartbeat through heartbeatCodec, which refuses a message
// over maxBytes on its wire size, before decoding it: the oversized
// message costs its read (at most Limits.MaxRecvMsgBytes, checked by gRPC
// on the length prefix before reading) but never a decode.
func (s *heartbeatService) recv(stream isobarpb.CellRegistry_HeartbeatServer) (*isobarpb.CellHeartbeat, error) {
	f := &heartbeatFrame{limit: s.maxBytes, hb: new(isobarpb.CellHeartbeat)}
	if err := stream.RecvMsg(f); err != nil {
		return nil, err
	}
	if f.oversize > 0 {
		return nil, status.Errorf(codes.ResourceExhausted, "%v: %d bytes, limit %d", ErrOversized, f.oversize, s.maxBytes)
	}
	return f.hb, nil
}

// recvFirst is recv with the first-heartbeat deadline: a stream that stays
// silent for firstTimeout (on the injected clock) is closed and counted.
// The receive runs in a goroutine so the deadline can end the wait; it
// returns when gRPC closes the stream, right after the handler returns,
// and touches nothing but its buffered channel.
func (s *heartbeatService) recvFirst(ctx context.Context, stream isobarpb.CellRegistry_HeartbeatServer) (*isobarpb.CellHeartbeat, error) {
	if s.firstTimeout <= 0 {
		return s.recv(stream)
	}
	type result struct {
		hb  *isobarpb.CellHeartbeat
		err error
	}
	got := make(chan result, 1)
	t := s.clock.NewTimer(s.firstTimeout)
	defer t.Stop()
	go func() {
		hb, err := s.recv(stream)
		got <- result{hb, err}
	}()
	select {
	case r := <-got:
		return r.hb, r.err
	case <-t.Chan():
		s.metrics.rejected.WithLabelValues(reasonFirstTimeout).Inc()
		s.log.Warn("heartbeat stream closed: no heartbeat since it opened", "peer_identity", peerName(ctx), "timeout", s.firstTimeout)
		return nil, status.Errorf(codes.DeadlineExceeded, "%v within %v (Config.FirstHeartbeatTimeout): send a heartbeat as soon as the stream opens", ErrNoFirstHeartbeat, s.firstTimeout)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
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
	if err := validateHeartbeatOn(hb, s.region, &st.valid); err != nil {
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
