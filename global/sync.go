package global

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/summary"
)

// Summary refusal classes; each is a reason label of
// isobar_global_summaries_rejected_total. Test with errors.Is.
var (
	ErrUnknownRegion    = errors.New("global: unknown region")
	ErrRegionMismatch   = errors.New("global: stream bound to another region")
	ErrIdentityMismatch = errors.New("global: client certificate does not name the region")
	// ErrNoRegionIdentity: the client certificate carries no
	// spiffe://isobar/region/<region> identity.
	ErrNoRegionIdentity = errors.New("global: client certificate carries no region identity")
	ErrStale            = errors.New("global: summary older than the one held")
)

func reason(err error) string {
	switch {
	case errors.Is(err, ErrUnknownRegion):
		return "unknown_region"
	case errors.Is(err, ErrRegionMismatch):
		return "region_mismatch"
	case errors.Is(err, ErrIdentityMismatch):
		return "identity_mismatch"
	case errors.Is(err, ErrNoRegionIdentity):
		return "no_identity"
	case errors.Is(err, ErrStale):
		return "stale"
	case errors.Is(err, ErrTooManyRegions):
		return "too_many_regions"
	case errors.Is(err, summary.ErrFuture):
		return "future"
	case errors.Is(err, summary.ErrInvalid):
		return "invalid"
	}
	return "other"
}

// leadership is what the Sync service needs to know about the term.
type leadership interface {
	// term returns a channel closed when the current term ends, or nil when
	// this member is not leading.
	term() <-chan struct{}
	// leaderHint names the current leader for standbys' refusals.
	leaderHint() string
}

// syncService is the gRPC adapter for GlobalControl.
type syncService struct {
	isobarpb.UnsafeGlobalControlServer
	lead    leadership
	store   *store
	hub     *hub
	allowed map[string]bool // nil: any valid name
	mtls    bool
	limits  Limits
	// regionTTL: a held summary older than this (receive time) is
	// replaced by any summary of a new incarnation.
	regionTTL time.Duration
	skew      *skewWatch
	// open counts Sync streams, for Limits.MaxSyncStreams.
	open    atomic.Int64
	clock   clockwork.Clock
	log     *slog.Logger
	metrics *metrics
}

var _ isobarpb.GlobalControlServer = (*syncService)(nil)

// Sync receives one region's summaries and sends it its plans.
func (s *syncService) Sync(stream isobarpb.GlobalControl_SyncServer) error {
	done := s.lead.term()
	if done == nil {
		return status.Errorf(codes.FailedPrecondition, "global: this member is a standby; the leader is %s", s.lead.leaderHint())
	}
	ctx := stream.Context()
	cert, release, err := s.admit(ctx)
	if err != nil {
		return err
	}
	defer release()
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	// A stream must name its region soon: silent streams would hold the
	// cap (zero: a bare syncService in tests waits forever).
	var first <-chan time.Time
	if d := s.limits.FirstSummaryTimeout; d > 0 {
		t := s.clock.NewTimer(d)
		defer t.Stop()
		first = t.Chan()
	}
	return s.serve(ctx, stream, done, first, cert, receive(ctx, stream))
}

// admit checks the peer's region identity (with mTLS) and takes a place
// under Limits.MaxSyncStreams; release gives the place back.
func (s *syncService) admit(ctx context.Context) (cert *certs.Identity, release func(), err error) {
	release = func() {}
	if s.mtls {
		id, err := peerRegion(ctx)
		if err != nil {
			s.metrics.rejected.WithLabelValues(reason(err)).Inc()
			s.log.Warn("region stream refused", "peer_identity", peerName(ctx), "err", err)
			return nil, release, status.Error(codes.PermissionDenied, err.Error())
		}
		cert = &id
	}
	if max := s.limits.MaxSyncStreams; max > 0 {
		if n := s.open.Add(1); n > int64(max) {
			s.open.Add(-1)
			s.metrics.rejected.WithLabelValues("too_many_streams").Inc()
			return nil, release, status.Errorf(codes.ResourceExhausted, "global: %d Sync streams open, at most %d (Limits.MaxSyncStreams)", n-1, max)
		}
		release = func() { s.open.Add(-1) }
	}
	return cert, release, nil
}

// recvd is one Recv's result.
type recvd struct {
	sm  *isobarpb.RegionSummary
	err error
}

// receive hands the stream's summaries over a channel, so the serve loop
// can select on them; the goroutine ends when the stream does (ctx is
// cancelled once Sync returns).
func receive(ctx context.Context, stream isobarpb.GlobalControl_SyncServer) <-chan recvd {
	in := make(chan recvd, 1)
	go func() {
		for {
			sm, err := stream.Recv()
			select {
			case in <- recvd{sm, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return in
}

// serve is the stream's loop: summaries in, plans of its region out,
// until the stream, the term or the first-summary deadline ends it.
func (s *syncService) serve(ctx context.Context, stream isobarpb.GlobalControl_SyncServer, done <-chan struct{},
	first <-chan time.Time, cert *certs.Identity, in <-chan recvd) error {
	var region string
	var plans <-chan *isobarpb.RoutingPlan
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return status.Errorf(codes.FailedPrecondition, "global: leadership ended; the leader is %s", s.lead.leaderHint())
		case <-first:
			first = nil
			if region == "" {
				s.metrics.rejected.WithLabelValues("first_summary_timeout").Inc()
				return status.Errorf(codes.DeadlineExceeded, "global: no valid summary within %v of the stream opening (Limits.FirstSummaryTimeout)", s.limits.FirstSummaryTimeout)
			}
		case r := <-in:
			if r.err != nil {
				return r.err
			}
			if err := s.accept(region, r.sm, cert); err != nil {
				s.metrics.rejected.WithLabelValues(reason(err)).Inc()
				s.log.Warn("region summary refused", "region", region, "peer_identity", peerName(ctx), "err", err)
				if errors.Is(err, ErrStale) || errors.Is(err, summary.ErrInvalid) {
					continue // the stream stays; the bad summary is dropped
				}
				if errors.Is(err, ErrTooManyRegions) {
					return status.Error(codes.ResourceExhausted, err.Error())
				}
				return status.Error(codes.PermissionDenied, err.Error())
			}
			if region == "" {
				region = r.sm.GetRegion()
				var unsub func()
				plans, unsub = s.hub.subscribe(region)
				defer unsub()
				s.log.Info("region connected", "region", region)
			}
		case p := <-plans:
			if err := stream.Send(p); err != nil {
				return err
			}
		}
	}
}

// accept validates sm for a stream bound to region ("" before the first
// summary) and stores it.
// With mTLS, cert is the stream's verified region identity.
func (s *syncService) accept(region string, sm *isobarpb.RegionSummary, cert *certs.Identity) error {
	// A time from the future would outlive the region TTL on this clock
	// and win every later-time comparison: refused past the shared
	// allowance (summary.MaxFutureSkew), as gossip refuses it.
	if err := summary.ValidateAt(sm, s.clock.Now()); err != nil {
		return err
	}
	r := sm.GetRegion()
	if s.allowed != nil && !s.allowed[r] {
		return fmt.Errorf("%w: %q is not in --regions", ErrUnknownRegion, r)
	}
	if region != "" && r != region {
		return fmt.Errorf("%w: stream of %s sent a summary for %s", ErrRegionMismatch, region, r)
	}
	if cert != nil && cert.Name != r {
		return fmt.Errorf("%w: %s sent a summary for region %s", ErrIdentityMismatch, cert, r)
	}
	now := s.clock.Now()
	if err := s.store.putLimited(sm, now, s.limits, s.regionTTL); err != nil {
		return err
	}
	if s.skew != nil {
		s.skew.observe(r, sm.GetAt().AsTime().Sub(now))
	}
	s.metrics.summaries.Inc()
	return nil
}

// RegionURI is the URI SAN that identifies a region's controller.
func RegionURI(region string) string { return certs.RegionURI(region) }

// peerRegion returns the stream's verified region identity. Only the URI
// SAN spiffe://isobar/region/<region> counts: a cell, gateway, global or
// operator certificate, or one naming no isobar identity (a common name or
// DNS SAN alone), is refused with ErrNoRegionIdentity.
func peerRegion(ctx context.Context) (certs.Identity, error) {
	id, err := certs.GRPCPeerIdentity(ctx)
	if err != nil {
		return certs.Identity{}, fmt.Errorf("%w: %w", ErrNoRegionIdentity, err)
	}
	if id.Kind != certs.KindRegion {
		return certs.Identity{}, fmt.Errorf("%w: certificate identity %s is not a regional controller", ErrNoRegionIdentity, id)
	}
	return id, nil
}

// peerName is the peer's certificate identity for logs.
func peerName(ctx context.Context) string { return certs.GRPCPeerName(ctx) }
