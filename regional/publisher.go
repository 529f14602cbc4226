package regional

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional/xds"
)

type viewHolder = atomic.Pointer[View]

// removal is a cell that failed while in the load balancer: the failover
// histogram measures from since to the push that took it out.
type removal struct {
	id    string
	since time.Time
}

// publisher pushes xDS states on its own goroutine. offer never blocks: a
// state offered while a push is running replaces any older pending one, so
// bursts coalesce into one snapshot build.
type publisher struct {
	push pushFunc
	// saved, when set, is told of every state pushed successfully (the
	// warm-state file); it runs on the publisher goroutine.
	saved   func(xds.State, time.Time)
	clock   clockwork.Clock
	log     *slog.Logger
	metrics *metrics

	mu       sync.Mutex
	pending  *xds.State
	removals []removal
	kick     chan struct{}
	// spent is the last state the publisher is done with (pushed,
	// refused, or replaced before its push), for the registry to build
	// the next one in (takeSpent); push must not keep a state it was given.
	spent *xds.State

	version atomic.Pointer[string]
}

func newPublisher(push pushFunc, clock clockwork.Clock, log *slog.Logger, m *metrics) *publisher {
	return &publisher{push: push, clock: clock, log: log, metrics: m, kick: make(chan struct{}, 1)}
}

func (p *publisher) offer(st xds.State, removals []removal) {
	p.mu.Lock()
	if p.pending != nil {
		p.spent = p.pending // coalesced: never pushed
	}
	p.pending = &st
	p.removals = append(p.removals, removals...)
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// spend records st as done with: nothing holds it any more.
func (p *publisher) spend(st *xds.State) {
	p.mu.Lock()
	p.spent = st
	p.mu.Unlock()
}

// takeSpent returns the state the publisher last finished with, whose
// buffers the caller now owns (zero: none), and forgets it.
func (p *publisher) takeSpent() xds.State {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.spent
	p.spent = nil
	if st == nil {
		return xds.State{}
	}
	return *st
}

// Version returns the last version pushed successfully ("" before any).
func (p *publisher) Version() string {
	if v := p.version.Load(); v != nil {
		return *v
	}
	return ""
}

func (p *publisher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		p.mu.Lock()
		st, removals := p.pending, p.removals
		p.pending, p.removals = nil, nil
		p.mu.Unlock()
		if st == nil {
			continue
		}
		v, err := p.push(*st)
		if err != nil {
			// The xDS server has logged and counted the refusal once
			// (isobar_regional_xds_push_errors_total).
			p.spend(st)
			continue
		}
		p.version.Store(&v)
		now := p.clock.Now()
		if p.saved != nil {
			p.saved(*st, now)
		}
		p.spend(st)
		for _, r := range removals {
			p.metrics.failover.Observe(now.Sub(r.since).Seconds())
		}
		p.log.Debug("xDS state pushed", "version", v, "models", len(st.Models))
	}
}
