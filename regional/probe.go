package regional

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"time"

	"github.com/jonboulle/clockwork"
	"golang.org/x/sync/errgroup"

	"github.com/isobar-mesh/isobar/regional/score"
)

// prober measures RTT and jitter from the controller (co-located with the
// region's Envoy) to every live cell with a TCP connect probe — one round
// trip — and hands the smoothed estimates to the registry.
//
// One goroutine owns the per-cell estimates; each round fans out the dials
// with a bounded errgroup and waits for all of them.
type prober struct {
	interval, timeout time.Duration
	view              func() *View
	submit            func(context.Context, []probeResult) error
	dial              func(network, addr string, timeout time.Duration) (net.Conn, error)
	clock             clockwork.Clock
	log               *slog.Logger
	metrics           *metrics

	est map[string]*score.RTTEstimate
}

func (p *prober) run(ctx context.Context) {
	p.est = make(map[string]*score.RTTEstimate)
	t := p.clock.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
			p.round(ctx)
		}
	}
}

func (p *prober) round(ctx context.Context) {
	v := p.view()
	type target struct{ id, ep string }
	var targets []target
	for _, c := range v.Cells {
		if c.State.Live() && c.Endpoint != "" {
			targets = append(targets, target{c.ID, c.Endpoint})
		}
	}
	// Dial in a new order each round: the dials of one round share the
	// process, and a fixed order would time the last cells' connects
	// systematically slower (their completions are handled last).
	rand.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	samples := make([]time.Duration, len(targets))
	oks := make([]bool, len(targets))
	var g errgroup.Group
	g.SetLimit(32)
	for i, tg := range targets {
		g.Go(func() error {
			start := p.clock.Now()
			conn, err := p.dial("tcp", tg.ep, p.timeout)
			if err != nil {
				return nil
			}
			samples[i], oks[i] = p.clock.Since(start), true
			_ = conn.Close()
			return nil
		})
	}
	_ = g.Wait()
	live := make(map[string]struct{}, len(targets))
	res := make([]probeResult, 0, len(targets))
	for i, tg := range targets {
		live[tg.id] = struct{}{}
		e := p.est[tg.id]
		if e == nil {
			e = &score.RTTEstimate{}
			p.est[tg.id] = e
		}
		if oks[i] {
			p.metrics.probes.WithLabelValues("ok").Inc()
			e.Add(samples[i])
		} else {
			p.metrics.probes.WithLabelValues("error").Inc()
		}
		res = append(res, probeResult{id: tg.id, rtt: e.RTT, jitter: e.Jitter, ok: e.N > 0})
	}
	for id := range p.est {
		if _, ok := live[id]; !ok {
			delete(p.est, id)
		}
	}
	if len(res) > 0 {
		if err := p.submit(ctx, res); err != nil && ctx.Err() == nil {
			p.log.Debug("probe results not delivered", "err", err)
		}
	}
}
