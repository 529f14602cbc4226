package election

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/isobar-mesh/isobar/internal/backoff"
)

// Run is the HA loop. It campaigns; when elected it calls lead with a
// context that is cancelled when the term ends (or ctx ends); when lead
// returns or the term ends it waits for lead to return, ends the term
// (revoking the lease so the standby takes over at once) and campaigns
// again with a fresh session, until ctx ends.
//
// While Run runs, an observer keeps KnownLeader current and counts leader
// changes. Failed campaigns, and terms shorter than MaxBackoff, are
// followed by a jittered exponential back-off on the injected clock, so an
// unreachable etcd or a lead that returns at once never makes the loop
// spin. While etcd is unreachable, campaigning blocks inside the client
// until it is back.
//
// Run returns nil when ctx ends, ErrClientClosed when the etcd client was
// closed, ErrBusy if Run is already running, and ErrInvalidConfig for a
// nil lead. It never returns with a term open: its own terms are ended
// (bounded by TTL) before it returns.
func (c *Candidate) Run(ctx context.Context, lead func(ctx context.Context, l *Leadership) error) error {
	if lead == nil {
		return fmt.Errorf("%w: Run needs a lead function", ErrInvalidConfig)
	}
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return ErrBusy
	}
	c.running = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()

	obsCtx, stopObs := context.WithCancel(ctx)
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		c.observeLeader(obsCtx)
	}()
	defer func() {
		stopObs()
		<-obsDone
	}()

	bo := newBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
	for {
		if ctx.Err() != nil {
			return nil
		}
		if c.cli.Ctx().Err() != nil {
			return ErrClientClosed
		}
		l, err := c.Campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if c.cli.Ctx().Err() != nil {
				return ErrClientClosed
			}
			d := bo.Next()
			c.log.Warn("campaign failed", "err", err, "retry_in_s", d.Seconds())
			if !c.sleep(ctx, d) {
				return nil
			}
			continue
		}
		started := c.clock.Now()
		if err := c.serve(ctx, l, lead); err != nil {
			c.log.Warn("lead returned an error; term ended", "epoch", l.Epoch, "err", err)
		}
		if ctx.Err() != nil {
			return nil
		}
		if c.clock.Since(started) >= c.cfg.MaxBackoff {
			bo.Reset()
			continue
		}
		if !c.sleep(ctx, bo.Next()) {
			return nil
		}
	}
}

// serve runs lead for one term and ends the term once lead has returned.
func (c *Candidate) serve(ctx context.Context, l *Leadership, lead func(context.Context, *Leadership) error) error {
	leadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-l.Done:
			cancel()
		case <-stop:
		}
	})
	err := lead(leadCtx, l)
	close(stop)
	wg.Wait()
	// Ends the term if lead stepped down while still leading; either way
	// waits for the cleanup, which is bounded by TTL even when ctx is done.
	// A failed revoke has been logged by the term's monitor.
	_ = l.t.resign(context.WithoutCancel(ctx))
	return err
}

// observeLeader follows the election's leader for KnownLeader and the
// leader-change counter, until ctx ends.
func (c *Candidate) observeLeader(ctx context.Context) {
	var last LeaderInfo
	first := true
	for info := range Observe(ctx, c.cli, c.cfg.Prefix, WithClock(c.clock), WithLogger(c.log)) {
		c.known.Store(&info)
		if !first && info != last {
			c.m.leaderChanges.Inc()
			c.log.Info("leader changed", "leader", info.ID, "epoch", info.Epoch, "previous", last.ID, "previous_epoch", last.Epoch)
		}
		first, last = false, info
	}
}

func (c *Candidate) sleep(ctx context.Context, d time.Duration) bool {
	t := c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
		return true
	case <-ctx.Done():
		return false
	}
}

// newBackoff is the election's retry schedule: each delay is drawn from
// [cur/2, cur], cur doubling from lo up to hi.
func newBackoff(lo, hi time.Duration) *backoff.Backoff {
	return backoff.New(backoff.Policy{Min: lo, Max: hi, Jitter: backoff.Equal})
}
