package election

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LeaderInfo names an election's leader. The zero value means "no leader".
type LeaderInfo struct {
	ID    string // the leader's election value
	Epoch int64  // its fencing token (the key's CreateRevision)
}

// Elected reports whether i names a leader.
func (i LeaderInfo) Elected() bool { return i.Epoch != 0 }

// Leader returns the current leader of the election at prefix (either
// form: "/a/election" and "/a/election/" are the same election; "" is
// DefaultPrefix): the candidate key with the oldest create revision. It
// returns ErrNoLeader when there is none.
func Leader(ctx context.Context, cli *clientv3.Client, prefix string) (id string, epoch int64, err error) {
	info, _, err := leaderAt(ctx, cli, normalizePrefix(prefix))
	if err != nil {
		return "", 0, fmt.Errorf("election: leader: %w", err)
	}
	if !info.Elected() {
		return "", 0, ErrNoLeader
	}
	return info.ID, info.Epoch, nil
}

// leaderAt reads the leader and the store revision of the read.
func leaderAt(ctx context.Context, cli *clientv3.Client, prefix string) (LeaderInfo, int64, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithFirstCreate()...)
	if err != nil {
		return LeaderInfo{}, 0, err
	}
	if len(resp.Kvs) == 0 {
		return LeaderInfo{}, resp.Header.Revision, nil
	}
	kv := resp.Kvs[0]
	return LeaderInfo{ID: string(kv.Value), Epoch: kv.CreateRevision}, resp.Header.Revision, nil
}

// Depose deletes the current leader's key, guarded by its create revision,
// and returns who was deposed (ErrNoLeader if nobody led). The deposed
// candidate's term ends when it sees its key go (its Done closes); the next
// candidate in line leads at once. For operators and chaos drills.
func Depose(ctx context.Context, cli *clientv3.Client, prefix string) (LeaderInfo, error) {
	pfx := normalizePrefix(prefix)
	resp, err := cli.Get(ctx, pfx, clientv3.WithFirstCreate()...)
	if err != nil {
		return LeaderInfo{}, fmt.Errorf("election: depose: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return LeaderInfo{}, ErrNoLeader
	}
	kv := resp.Kvs[0]
	info := LeaderInfo{ID: string(kv.Value), Epoch: kv.CreateRevision}
	tr, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
		Then(clientv3.OpDelete(string(kv.Key))).
		Commit()
	if err != nil {
		return LeaderInfo{}, fmt.Errorf("election: depose: %w", err)
	}
	if !tr.Succeeded {
		return LeaderInfo{}, fmt.Errorf("election: depose: leader %q (epoch %d) already gone: %w", info.ID, info.Epoch, ErrNotLeader)
	}
	return info, nil
}

// ObserveOption configures Observe.
type ObserveOption func(*observeOptions)

type observeOptions struct {
	clock  clockwork.Clock
	logger *slog.Logger
}

// WithClock sets the clock of Observe's retry back-off (default: real).
func WithClock(c clockwork.Clock) ObserveOption {
	return func(o *observeOptions) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithLogger sets Observe's logger (default: discard).
func WithLogger(l *slog.Logger) ObserveOption {
	return func(o *observeOptions) {
		if l != nil {
			o.logger = l
		}
	}
}

// Observe reports the leader of the election at prefix: first the current
// one (or "no leader", the zero LeaderInfo), then every change of identity
// or epoch, including to "no leader". Unlike concurrency.Election.Observe,
// which waits for the next leader, it reports the gap. Intermediate states
// that come and go while the receiver is slow may be skipped; the latest
// state is always delivered.
//
// One goroutine serves the channel; it exits and closes the channel when
// ctx ends or cli is closed, so ranging over the channel joins it. Read
// errors and broken watches are retried after a jittered back-off (100 ms
// to 2 s); while etcd is unreachable the reports simply stop.
func Observe(ctx context.Context, cli *clientv3.Client, prefix string, opts ...ObserveOption) <-chan LeaderInfo {
	o := observeOptions{clock: clockwork.NewRealClock(), logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, opt := range opts {
		opt(&o)
	}
	out := make(chan LeaderInfo)
	go observe(ctx, cli, normalizePrefix(prefix), o, out)
	return out
}

func observe(ctx context.Context, cli *clientv3.Client, prefix string, o observeOptions, out chan<- LeaderInfo) {
	defer close(out)
	bo := newBackoff(defaultMinBackoff, defaultMaxBackoff)
	pause := func() bool {
		t := o.clock.NewTimer(bo.Next())
		defer t.Stop()
		select {
		case <-t.Chan():
			return true
		case <-ctx.Done():
			return false
		}
	}
	var last LeaderInfo
	sent := false
	for ctx.Err() == nil && cli.Ctx().Err() == nil {
		info, rev, err := leaderAt(ctx, cli, prefix)
		if err != nil {
			if ctx.Err() != nil || cli.Ctx().Err() != nil {
				return
			}
			o.logger.Debug("observe: leader read failed", "err", err)
			if !pause() {
				return
			}
			continue
		}
		if !sent || info != last {
			select {
			case out <- info:
			case <-ctx.Done():
				return
			}
			last, sent = info, true
		}
		if !awaitChange(ctx, cli, prefix, rev) {
			if ctx.Err() != nil || cli.Ctx().Err() != nil {
				return
			}
			if !pause() {
				return
			}
			continue
		}
		bo.Reset()
	}
}

// awaitChange waits for any event under prefix after rev. It returns false
// when the watch ended without one (error, compaction, closed client).
func awaitChange(ctx context.Context, cli *clientv3.Client, prefix string, rev int64) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if wr.Err() != nil {
			return false
		}
		if len(wr.Events) > 0 {
			return true
		}
	}
	return false
}
