package regional

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// latestSummary is where the leader session takes the summary it sends.
type latestSummary interface {
	Latest() *isobarpb.RegionSummary
}

// planSink takes each plan the leader sends.
type planSink interface {
	applyPlan(ctx context.Context, p *isobarpb.RoutingPlan)
}

var (
	_ latestSummary = (*summaryBuilder)(nil)
	_ planSink      = (*routeKeeper)(nil)
)

// leaderSession keeps a Sync session with the global leader: it finds the
// leader in etcd, authorises it, sends the latest summary every interval
// and hands each plan it receives to its planSink.
//
// Concurrency: run owns one session at a time; each session runs a send
// goroutine it joins before returning. It keeps no state between
// sessions beyond its backoff, which is run's own.
type leaderSession struct {
	cfg  GlobalConfig
	etcd *clientv3.Client
	dial []grpc.DialOption
	// mtls: this controller runs with TLS, so the global leader must be
	// reached over mTLS too. Whatever it is, a server that presents a
	// certificate must present a global identity.
	mtls    bool
	latest  latestSummary
	plans   planSink
	clock   clockwork.Clock
	log     *slog.Logger
	metrics *metrics
}

func newLeaderSession(cfg syncConfig, d syncDeps, latest latestSummary, plans planSink, log *slog.Logger) *leaderSession {
	return &leaderSession{
		cfg: cfg.Global, etcd: d.Etcd, dial: d.DialOptions, mtls: cfg.MTLS, latest: latest, plans: plans,
		clock: d.Clock, log: log, metrics: d.Metrics,
	}
}

// run keeps a Sync session with the current leader until ctx ends.
func (l *leaderSession) run(ctx context.Context) {
	bo := backoff.New(backoff.Policy{Min: l.cfg.BackoffMin, Max: l.cfg.BackoffMax, Jitter: backoff.Full})
	for ctx.Err() == nil {
		got, err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if got {
			bo.Reset()
		}
		wait := bo.Next()
		l.log.Debug("global session ended; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-l.clock.After(wait):
		}
	}
}

// errNoLeader: no leader is registered in etcd.
var errNoLeader = errors.New("regional: no global leader")

// ErrPlanSource: the server a region dialled as the global leader is not
// a global identity (spiffe://isobar/global/<name>), or was reached
// without mTLS by a controller that runs with TLS. The session is closed
// before any summary is sent or plan read.
var ErrPlanSource = errors.New("regional: routing plans accepted only from a global identity")

// errPlanNotMTLS is the ErrPlanSource case of a plaintext session.
var errPlanNotMTLS = fmt.Errorf("%w: the connection is not mTLS", ErrPlanSource)

// checkLeader authorises the server end of a Sync stream, whose context
// carries the peer of the established connection.
func (l *leaderSession) checkLeader(ctx context.Context) error {
	id, err := certs.GRPCPeerIdentity(ctx)
	if errors.Is(err, certs.ErrNotMTLS) {
		if l.mtls {
			return errPlanNotMTLS
		}
		return nil // plaintext by the operator's choice (--insecure)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPlanSource, err)
	}
	if id.Kind != certs.KindGlobal {
		return fmt.Errorf("%w: the server's certificate identity is %s", ErrPlanSource, id)
	}
	return nil
}

func planPeerReason(err error) string {
	if errors.Is(err, errPlanNotMTLS) {
		return "not_mtls"
	}
	return "not_global"
}

// session finds the leader, streams summaries and applies plans until the
// stream ends. got reports whether any plan arrived.
func (l *leaderSession) session(ctx context.Context) (got bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	id, _, err := election.Leader(lctx, l.etcd, l.cfg.ElectionPrefix)
	cancel()
	if err != nil {
		return false, err
	}
	addr, ok := leaderAddress(id)
	if !ok {
		return false, errNoLeader
	}
	return l.stream(ctx, addr)
}

// stream runs one Sync session with the leader at addr: it authorises the
// server (checkLeader), then streams summaries and applies plans until the
// stream ends. got reports whether any plan arrived.
func (l *leaderSession) stream(ctx context.Context, addr string) (got bool, err error) {
	conn, err := grpc.NewClient(addr, append(l.dial, l.cfg.Keepalive.DialOption())...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := isobarpb.NewGlobalControlClient(conn).Sync(sctx)
	if err != nil {
		return false, err
	}
	if err := l.checkLeader(stream.Context()); err != nil {
		l.metrics.planPeerRefused.WithLabelValues(planPeerReason(err)).Inc()
		l.log.Warn("global leader refused: plans are accepted only from a global identity",
			"address", addr, "peer_identity", peerName(stream.Context()), "err", err)
		return false, err
	}
	sendErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { l.send(sctx, stream, sendErr) })
	for {
		p, err := stream.Recv()
		if err != nil {
			if status.Code(err) == codes.FailedPrecondition {
				l.log.Info("global member is not the leader; looking again", "err", status.Convert(err).Message())
			}
			select {
			case e := <-sendErr:
				return got, e
			default:
			}
			return got, err
		}
		l.plans.applyPlan(ctx, p)
		got = true
	}
}

// send sends the latest summary every interval until ctx ends, or reports
// the first send error on errc. A summary already sent on this stream is
// not sent again: the builder runs on its own ticker of the same period,
// so a send could come before the next build, and the leader refuses a
// summary no newer than the one it holds (it logged and counted each such
// duplicate as stale).
func (l *leaderSession) send(ctx context.Context, stream isobarpb.GlobalControl_SyncClient, errc chan<- error) {
	t := l.clock.NewTicker(l.cfg.SummaryInterval)
	defer t.Stop()
	var sent *isobarpb.RegionSummary
	for {
		if sm := l.latest.Latest(); sm != nil && sm != sent {
			if err := stream.Send(sm); err != nil {
				errc <- err
				return
			}
			sent = sm
		}
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}

// leaderAddress extracts the gRPC address from the leader's election
// value, "name@host:port".
func leaderAddress(id string) (string, bool) {
	i := strings.LastIndexByte(id, '@')
	if i < 0 || i == len(id)-1 {
		return "", false
	}
	return id[i+1:], true
}
