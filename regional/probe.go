package regional

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"
	"golang.org/x/sync/errgroup"

	"github.com/isobar-mesh/isobar/regional/score"
)

// prober measures RTT and jitter from the controller (co-located with the
// region's Envoy) to every live cell with a TCP connect probe — one round
// trip, timed by the kernel where it can (kernelRTT), else by the clock
// around the connect — and hands the smoothed estimates to the registry. A round probes
// at most max cells, those probed longest ago (never probed first), so a
// round's cost is bounded whatever the region's size.
//
// One goroutine owns the per-cell estimates; each round fans out the dials
// with a bounded errgroup, paced over spread, and waits for all of them.
type prober struct {
	interval, timeout time.Duration
	max               int // cells probed per round; 0: every live cell
	// steady is how many rounds apart a cell with a steady estimate is
	// probed (cadence); 0 or 1: every round.
	steady uint64
	// spread paces a round's dials: dial i of n starts i/n of spread
	// after the first (in steps of at least probePaceStep); 0: all at
	// once. A burst of 1,000 connects a second took tens of milliseconds
	// of CPU at once from the cycle and the xDS push beside it (the tail
	// of a death's removal at 1,000 cells), and its dials timed each
	// other's completions.
	spread  time.Duration
	view    func() *View
	submit  func(context.Context, []probeResult) error
	dial    func(network, addr string, timeout time.Duration) (net.Conn, error)
	clock   clockwork.Clock
	log     *slog.Logger
	metrics *metrics

	est    map[string]*probeEstimate
	rounds uint64 // counts rounds; an estimate's last is the round it was probed in
}

func (p *prober) run(ctx context.Context) {
	p.est = make(map[string]*probeEstimate)
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

// probeTarget is a live cell to probe: its id and endpoint, and its
// estimate (set by due).
type probeTarget struct {
	id, ep string
	est    *probeEstimate
}

func (p *prober) round(ctx context.Context) {
	v := p.view()
	p.rounds++
	var all []probeTarget
	for _, c := range v.Cells {
		if c.State.Live() && c.Endpoint != "" {
			all = append(all, probeTarget{id: c.ID, ep: c.Endpoint})
		}
	}
	// Dial in a new order each round: the dials of one round share the
	// process, and a fixed order would time the last cells' connects
	// systematically slower (their completions are handled last).
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	targets := p.due(all)
	samples := make([]time.Duration, len(targets))
	oks := make([]bool, len(targets))
	var g errgroup.Group
	g.SetLimit(32)
	start := p.clock.Now()
	for i, tg := range targets {
		if !p.pace(ctx, start, i, len(targets)) {
			targets = targets[:i] // the rest were not dialled
			break
		}
		g.Go(func() error {
			start := p.clock.Now()
			conn, err := p.dial("tcp", tg.ep, p.timeout)
			if err != nil {
				return nil
			}
			samples[i], oks[i] = p.clock.Since(start), true
			if rtt, ok := kernelRTT(conn); ok {
				samples[i] = rtt
			}
			_ = conn.Close()
			return nil
		})
	}
	_ = g.Wait()
	res := make([]probeResult, 0, len(targets))
	for i, tg := range targets {
		e := tg.est
		e.last = p.rounds
		if oks[i] {
			p.metrics.probes.WithLabelValues("ok").Inc()
			e.every = p.cadence(e.RTTEstimate, samples[i])
			e.Add(samples[i])
		} else {
			p.metrics.probes.WithLabelValues("error").Inc()
			e.every = 1
		}
		res = append(res, probeResult{id: tg.id, rtt: e.RTT, jitter: e.Jitter, ok: e.N > 0})
	}
	if len(res) > 0 {
		if err := p.submit(ctx, res); err != nil && ctx.Err() == nil {
			p.log.Debug("probe results not delivered", "err", err)
		}
	}
}

// probePaceStep is the least wait between two paced dials: the dials due
// within it start together.
const probePaceStep = 5 * time.Millisecond

// pace waits until dial i of n, in a round started at start, is due (see
// prober.spread). false: ctx ended first.
func (p *prober) pace(ctx context.Context, start time.Time, i, n int) bool {
	if p.spread <= 0 || i == 0 {
		return ctx.Err() == nil
	}
	wait := start.Add(p.spread * time.Duration(i) / time.Duration(n)).Sub(p.clock.Now())
	if wait < probePaceStep {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-p.clock.After(wait):
		return true
	}
}

// probeEstimate is one cell's smoothed RTT, the round it was last probed
// in (0: never) and the rounds until it is due again (0 or 1: the next).
type probeEstimate struct {
	score.RTTEstimate
	last, every uint64
}

// A cell's estimate is steady once it holds probeSettleSamples samples (the
// EWMA, gain score.RTTGain, follows a step within about four) and a new
// sample falls within max(probeSteadyBand, probeSteadyK × jitter) of it.
// K is TCP's: RFC 6298 §2.3 takes SRTT + 4 × RTTVAR as the most a round
// trip can take before it is news (the retransmission timeout). A connect
// on loopback or a LAN takes well under probeSteadyBand, so a busy host's
// scheduling noise alone does not keep a cell on the fast cadence.
const (
	probeSettleSamples = 4
	probeSteadyK       = 4
	probeSteadyBand    = time.Millisecond
)

// cadence is how many rounds after this one the cell with estimate e and
// the new sample is due: the steady cadence when e is steady and sample
// agrees with it, else the next round.
func (p *prober) cadence(e score.RTTEstimate, sample time.Duration) uint64 {
	if p.steady <= 1 || e.N+1 < probeSettleSamples {
		return 1
	}
	d := sample - e.RTT
	if d < 0 {
		d = -d
	}
	if d > max(probeSteadyBand, probeSteadyK*e.Jitter) {
		return 1
	}
	return p.steady
}

// due returns the cells of all (live, shuffled) this round probes: those
// whose cadence has come (never probed, or every rounds since the last),
// at most p.max of them, the ones probed longest ago first (never-probed
// first; ties in all's random order). It keeps an estimate for each live
// cell and drops those of cells no longer live. Each target carries its
// estimate: at 10,000 cells, looking it up by id in each of the sort's
// comparisons was most of a round's bookkeeping.
func (p *prober) due(all []probeTarget) []probeTarget {
	for i := range all {
		e := p.est[all[i].id]
		if e == nil {
			e = &probeEstimate{}
			p.est[all[i].id] = e
		}
		all[i].est = e
	}
	// Every live cell (all's ids are distinct) has an estimate now: any
	// more are of cells no longer live.
	if len(p.est) > len(all) {
		live := make(map[string]struct{}, len(all))
		for _, tg := range all {
			live[tg.id] = struct{}{}
		}
		for id := range p.est {
			if _, ok := live[id]; !ok {
				delete(p.est, id)
			}
		}
	}
	all = slices.DeleteFunc(all, func(tg probeTarget) bool {
		return tg.est.last != 0 && p.rounds-tg.est.last < max(tg.est.every, 1)
	})
	if p.max <= 0 || len(all) <= p.max {
		return all
	}
	slices.SortStableFunc(all, func(a, b probeTarget) int { return cmp.Compare(a.est.last, b.est.last) })
	return all[:p.max]
}
