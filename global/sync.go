package global

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
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
	case errors.Is(err, ErrStale):
		return "stale"
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
	var cert *x509.Certificate
	if s.mtls {
		p, _ := peer.FromContext(ctx)
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			cert = ti.State.VerifiedChains[0][0]
		}
		if cert == nil {
			s.metrics.rejected.WithLabelValues("identity_mismatch").Inc()
			return status.Error(codes.Unauthenticated, "global: no verified client certificate")
		}
	}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()

	type recvd struct {
		sm  *isobarpb.RegionSummary
		err error
	}
	in := make(chan recvd, 1)
	go func() { // ends when the stream does (ctx cancelled after return)
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

	var region string
	var plans <-chan *isobarpb.RoutingPlan
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return status.Errorf(codes.FailedPrecondition, "global: leadership ended; the leader is %s", s.lead.leaderHint())
		case r := <-in:
			if r.err != nil {
				return r.err
			}
			if err := s.accept(region, r.sm, cert); err != nil {
				s.metrics.rejected.WithLabelValues(reason(err)).Inc()
				s.log.Warn("region summary refused", "region", region, "err", err)
				if errors.Is(err, ErrStale) || errors.Is(err, summary.ErrInvalid) {
					continue // the stream stays; the bad summary is dropped
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
func (s *syncService) accept(region string, sm *isobarpb.RegionSummary, cert *x509.Certificate) error {
	if err := summary.Validate(sm); err != nil {
		return err
	}
	r := sm.GetRegion()
	if s.allowed != nil && !s.allowed[r] {
		return fmt.Errorf("%w: %q is not in --regions", ErrUnknownRegion, r)
	}
	if region != "" && r != region {
		return fmt.Errorf("%w: stream of %s sent a summary for %s", ErrRegionMismatch, region, r)
	}
	if cert != nil && !certNames(cert, r) {
		return fmt.Errorf("%w: %s", ErrIdentityMismatch, r)
	}
	if !s.store.put(sm, s.clock.Now()) {
		return fmt.Errorf("%w: %s sequence %d", ErrStale, r, sm.GetSequence())
	}
	s.metrics.summaries.Inc()
	return nil
}

// RegionURI is the URI SAN that identifies a region's controller.
func RegionURI(region string) string { return certs.RegionURI(region) }

func certNames(cert *x509.Certificate, region string) bool {
	for _, u := range cert.URIs {
		if u.String() == RegionURI(region) {
			return true
		}
	}
	return slices.Contains(cert.DNSNames, region) || cert.Subject.CommonName == region
}
