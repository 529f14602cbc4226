package election

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Candidate campaigns in one election on behalf of one process. It holds at
// most one term of office at a time. Campaign, Resign and Run may be called
// from any goroutine; Campaign and Run refuse to run twice at once
// (ErrBusy).
type Candidate struct {
	cli   *clientv3.Client
	cfg   Config
	clock clockwork.Clock
	log   *slog.Logger
	m     *metrics

	mu          sync.Mutex
	campaigning bool
	running     bool
	term        *term // current term; nil when not leading

	known atomic.Pointer[LeaderInfo] // last leader seen by Run's observer
}

// Leadership is one term of office. Its fields are fixed for the term.
// Act as leader only while Done is open, and write through FencedPut or
// FencedTxn so that a write racing the end of the term is refused by etcd.
type Leadership struct {
	// ID is the candidate's ID (the election value).
	ID string
	// Key is the leader's election key: Prefix + hex(lease ID), the layout
	// of etcd's concurrency.Election.
	Key string
	// Epoch is the fencing token: the key's CreateRevision. Each term has a
	// fresh key, so epochs strictly increase across terms of the election.
	Epoch int64
	// Done is closed when the term ends: the session's lease was lost (not
	// kept alive within TTL, revoked, expired), the key was deleted or
	// replaced, Resign was called, or the Campaign context ended.
	Done <-chan struct{}

	prefix string
	m      *metrics
	t      *term
}

// Guard is the comparison that fences a transaction to this term:
// CreateRevision(Key) == Epoch. It fails once the key is gone, including
// when it was recreated by a later term.
func (l *Leadership) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.Key), "=", l.Epoch)
}

// term is the state behind one Leadership, owned by its monitor goroutine.
type term struct {
	l          *Leadership
	sess       *concurrency.Session
	cancelTerm context.CancelFunc // cancels the session's own context, after Close
	started    time.Time

	done     chan struct{} // l.Done: closed first when the term ends
	stop     chan struct{} // closed by resign
	stopOnce sync.Once
	exited   chan struct{} // closed after cleanup; err is set before
	err      error
}

// NewCandidate returns a candidate for the election at cfg.Prefix using cli.
// It does not contact etcd. It returns ErrInvalidConfig (wrapped) for a bad
// Config, or an error when its metrics cannot be registered (a registry
// serves one candidate).
func NewCandidate(cli *clientv3.Client, cfg Config, deps Deps) (*Candidate, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil etcd client", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	deps = deps.withDefaults()
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	return &Candidate{
		cli:   cli,
		cfg:   cfg,
		clock: deps.Clock,
		log:   deps.Logger.With("election", cfg.Prefix, "candidate", cfg.ID),
		m:     m,
	}, nil
}

// ID is the candidate's ID.
func (c *Candidate) ID() string { return c.cfg.ID }

// Prefix is the normalised election prefix (ends in "/").
func (c *Candidate) Prefix() string { return c.cfg.Prefix }

// KnownLeader is the leader last reported by the observer that Run runs
// (zero LeaderInfo for "no leader"); ok is false before the first report or
// when Run has never run. It does not contact etcd.
func (c *Candidate) KnownLeader() (info LeaderInfo, ok bool) {
	if p := c.known.Load(); p != nil {
		return *p, true
	}
	return LeaderInfo{}, false
}

// Campaign blocks until this candidate leads, ctx ends or the campaign
// fails. Each call creates a fresh session (lease of TTL) and a fresh key,
// so each term has a new, larger epoch. The term lasts until its Done
// closes; it also ends when ctx ends, so pass a context that lives as long
// as the term should.
//
// On any error the session is closed, which revokes its lease and deletes
// the candidate's key at once. etcd's own concurrency.Election.Campaign
// leaves the key behind until the lease expires when it fails for a reason
// other than ctx (etcd issue #21128); such a key keeps its place in the
// queue and, once the leader goes, is taken for a leader nobody is. Its
// ctx-cancellation path also resigns with the client's context, which
// blocks for as long as etcd is unreachable. This package therefore runs
// the same protocol (same key layout, same ordering by create revision)
// itself and bounds every cleanup by TTL.
//
// Errors: ErrBusy when already campaigning or leading (or the last term's
// cleanup is still running); an error wrapping
// ctx.Err() when ctx ended; ErrSessionLost when the lease ended while
// waiting; otherwise the wrapped etcd error.
func (c *Candidate) Campaign(ctx context.Context) (*Leadership, error) {
	c.mu.Lock()
	if c.campaigning || c.term != nil {
		c.mu.Unlock()
		return nil, ErrBusy
	}
	c.campaigning = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.campaigning = false
		c.mu.Unlock()
	}()

	l, err := c.campaign(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.m.campaignFailures.Inc()
		}
		return nil, err
	}
	return l, nil
}

func (c *Candidate) campaign(ctx context.Context) (*Leadership, error) {
	secs := c.cfg.ttlSeconds()
	grant, err := c.cli.Grant(ctx, secs)
	if err != nil {
		return nil, c.campaignErr(ctx, nil, "grant lease", err)
	}
	// The session outlives the Campaign call: its context is detached from
	// ctx and cancelled by the term's cleanup, after the lease is revoked.
	termCtx, cancelTerm := context.WithCancel(context.WithoutCancel(ctx))
	sess, err := concurrency.NewSession(c.cli, concurrency.WithLease(grant.ID),
		concurrency.WithTTL(int(secs)), concurrency.WithContext(termCtx))
	if err != nil {
		rctx, cancel := context.WithTimeout(termCtx, c.cfg.TTL)
		_, _ = c.cli.Revoke(rctx, grant.ID)
		cancel()
		cancelTerm()
		return nil, c.campaignErr(ctx, nil, "start session", err)
	}

	key, rev, err := c.enter(ctx, sess)
	if err != nil {
		werr := c.campaignErr(ctx, sess, "campaign", err) // before Close ends the session
		// Close the session whatever the error: revoking the lease deletes
		// the candidate's key now rather than after TTL (etcd #21128).
		if cerr := c.endSession(sess); cerr != nil {
			c.log.Warn("failed campaign: lease not revoked, the key lingers until the lease expires",
				"lease_id", int64(sess.Lease()), "err", cerr)
		}
		cancelTerm()
		return nil, werr
	}

	done := make(chan struct{})
	t := &term{
		sess:       sess,
		cancelTerm: cancelTerm,
		started:    c.clock.Now(),
		done:       done,
		stop:       make(chan struct{}),
		exited:     make(chan struct{}),
	}
	t.l = &Leadership{ID: c.cfg.ID, Key: key, Epoch: rev, Done: done, prefix: c.cfg.Prefix, m: c.m, t: t}
	c.mu.Lock()
	c.term = t
	c.mu.Unlock()
	c.m.terms.Inc()
	c.m.isLeader.Set(1)
	c.log.Info("elected leader", "epoch", rev, "key", key, "lease_ttl_s", grant.TTL)
	go c.monitor(ctx, t)
	return t.l, nil
}

func (c *Candidate) campaignErr(ctx context.Context, sess *concurrency.Session, step string, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("election: %s: %w", step, ctx.Err())
	case sess != nil && sess.Ctx().Err() != nil:
		return fmt.Errorf("election: %s: %w (%w)", step, ErrSessionLost, err)
	default:
		return fmt.Errorf("election: %s: %w", step, err)
	}
}

// enter puts the candidate's key and waits until every key created before
// it under the prefix is gone: the protocol of concurrency.Election.Campaign.
// The wait also ends when the session ends.
func (c *Candidate) enter(ctx context.Context, sess *concurrency.Session) (string, int64, error) {
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(sess.Ctx(), cancel)
	defer stop()

	key := fmt.Sprintf("%s%x", c.cfg.Prefix, sess.Lease())
	resp, err := c.cli.Txn(waitCtx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, c.cfg.ID, clientv3.WithLease(sess.Lease()))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return "", 0, err
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		// The lease is fresh, so its key cannot exist unless a previous
		// attempt of this very call wrote it; reuse its revision.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return "", 0, errors.New("election: candidate key vanished during its own creation")
		}
		rev = kvs[0].CreateRevision
	}
	if err := waitDeletes(waitCtx, c.cli, c.cfg.Prefix, rev-1); err != nil {
		return "", 0, err
	}
	// The predecessors are gone; make sure our own key still is there (the
	// lease may have expired while we waited, taking the key with it).
	g, err := c.cli.Get(waitCtx, key)
	if err != nil {
		return "", 0, err
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != rev || clientv3.LeaseID(g.Kvs[0].Lease) != sess.Lease() {
		return "", 0, ErrSessionLost
	}
	select {
	case <-sess.Done():
		return "", 0, ErrSessionLost
	default:
	}
	return key, rev, nil
}

// waitDeletes waits until no key under prefix has a create revision of at
// most maxCreateRev (as concurrency's waitDeletes).
//
// etcd unreachable while waiting (status Unavailable: a restart, a
// partition) is a normal day, not the end of the campaign: the wait goes
// on, retried every waitRetry, until ctx ends (the caller's, or the
// session's when its lease expires) or etcd answers again.
func waitDeletes(ctx context.Context, cli *clientv3.Client, prefix string, maxCreateRev int64) error {
	opts := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(maxCreateRev))
	for {
		resp, err := cli.Get(ctx, prefix, opts...)
		if err == nil {
			if len(resp.Kvs) == 0 {
				return nil
			}
			err = waitDelete(ctx, cli, string(resp.Kvs[0].Key), resp.Header.Revision)
			if err == nil {
				continue
			}
		}
		if !unreachable(err) || !pause(ctx, waitRetry) {
			return err
		}
	}
}

// unreachable reports whether err says etcd could not be reached: gRPC
// status Unavailable, which clientv3's watch may hand over as a plain
// error carrying the status text ("rpc error: code = Unavailable desc =
// error reading from server: EOF") rather than as a status.
func unreachable(err error) bool {
	return status.Code(err) == codes.Unavailable || strings.Contains(err.Error(), "code = Unavailable")
}

// waitRetry is how long a campaign's wait pauses before asking an
// unreachable etcd again.
const waitRetry = 100 * time.Millisecond

// pause waits d; false when ctx ends first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func waitDelete(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(rev)) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("election: watch closed while waiting for a predecessor to go")
}

// endSession stops the keep-alive and revokes the lease, bounded by the
// session's TTL. A lease that is already gone is not an error; a closed
// client cannot revoke, and the lease then expires on its own.
func (c *Candidate) endSession(s *concurrency.Session) error {
	if c.cli.Ctx().Err() != nil {
		s.Orphan()
		return ErrClientClosed
	}
	err := s.Close()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// monitor owns a term: it waits for its end, closes Done, then revokes the
// lease (deleting the key) and exits. Started by campaign; joined through
// t.exited by resign (Resign and Run wait on it).
func (c *Candidate) monitor(ctx context.Context, t *term) {
	reason := c.watchTerm(ctx, t)
	close(t.done)
	c.m.isLeader.Set(0)
	err := c.endSession(t.sess)
	t.cancelTerm()
	held := c.clock.Since(t.started)
	if err != nil {
		c.log.Warn("term ended: lease not revoked, the key lingers until the lease expires",
			"epoch", t.l.Epoch, "reason", reason, "held_s", held.Seconds(), "err", err)
	} else {
		c.log.Info("term ended", "epoch", t.l.Epoch, "reason", reason, "held_s", held.Seconds())
	}
	c.mu.Lock()
	if c.term == t {
		c.term = nil
	}
	c.mu.Unlock()
	t.err = err
	close(t.exited)
}

// watchTerm blocks until the term ends and says why: the session ended,
// the Campaign context ended, resign was asked, or the key was deleted or
// replaced (someone deposed this leader).
func (c *Candidate) watchTerm(ctx context.Context, t *term) string {
	wctx, cancel := context.WithCancel(t.sess.Ctx())
	defer cancel()
	key, epoch := t.l.Key, t.l.Epoch
	wch := c.cli.Watch(wctx, key, clientv3.WithRev(epoch+1))
	var retry <-chan time.Time
	bo := newBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
	for {
		select {
		case <-t.sess.Done():
			return "session_lost"
		case <-ctx.Done():
			return "context_done"
		case <-t.stop:
			return "resigned"
		case <-retry:
			retry = nil
			gctx, gcancel := context.WithTimeout(wctx, c.cfg.TTL)
			g, err := c.cli.Get(gctx, key)
			gcancel()
			if err != nil {
				retry = c.clock.After(bo.Next())
				continue
			}
			if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != epoch {
				return "key_lost"
			}
			wch = c.cli.Watch(wctx, key, clientv3.WithRev(g.Header.Revision+1))
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				if c.cli.Ctx().Err() != nil {
					return "client_closed"
				}
				// The watch broke (compaction, cancellation): re-check the
				// key after a pause, then watch again. The session decides
				// liveness meanwhile.
				wch = nil
				retry = c.clock.After(bo.Next())
				continue
			}
			bo.Reset()
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE || ev.Kv.CreateRevision != epoch {
					return "key_lost"
				}
			}
		}
	}
}

// Resign ends the current term, if any: Done closes, then the lease is
// revoked, which deletes the key, so a waiting candidate takes over at once
// (a planned hand-off). It returns when the cleanup is done or ctx ends,
// and nil when there is no term. An error means the lease could not be
// revoked and the key lingers until it expires (within TTL). A Campaign in
// progress is not affected.
func (c *Candidate) Resign(ctx context.Context) error {
	c.mu.Lock()
	t := c.term
	c.mu.Unlock()
	if t == nil {
		return nil
	}
	return t.resign(ctx)
}

func (t *term) resign(ctx context.Context) error {
	t.stopOnce.Do(func() { close(t.stop) })
	select {
	case <-t.exited:
		if t.err != nil {
			return fmt.Errorf("election: resign: revoke lease: %w", t.err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("election: resign: %w", ctx.Err())
	}
}
