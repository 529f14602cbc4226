package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/bench"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// maxVictimsPerRound bounds the cells killed in one round.
const maxVictimsPerRound = 10

// timeDeaths kills region 0's cells in rounds and times each death: from
// the kill (the cell's TCP connection closed under its stream, no
// Terminated heartbeat) to the first assignment the xDS client received
// without the cell. A round kills up to half the region's cells (at most
// maxVictimsPerRound), each at its own random offset within one heartbeat
// interval of the round's start, so a death falls at a uniform phase of
// the cell's heartbeats (revived cells share the phase of their revival;
// killing them at once would always kill just after a heartbeat). Between
// rounds the victims come back and the next round waits until the xDS
// client has them again.
//
// A removal is timed at the assignment's receipt (Assignment.At); when two
// assignments arrive closer together than the harness wakes, the later
// one's time is taken, which can only overstate.
func (p *point) timeDeaths(ctx context.Context) ([]float64, error) {
	cells := p.regions[0].cells
	per := min(maxVictimsPerRound, max(1, len(cells)/2))
	rng := rand.New(rand.NewPCG(p.cfg.Seed, uint64(p.spec.cells)<<16|uint64(p.spec.regions)))
	var out []float64
	next := 0
	for len(out) < p.cfg.Deaths {
		k := min(per, p.cfg.Deaths-len(out))
		victims := make([]*bench.Cell, 0, k)
		for range k {
			victims = append(victims, cells[next%len(cells)])
			next++
		}
		offsets := make([]time.Duration, k)
		for i := range offsets {
			offsets[i] = time.Duration(rng.Int64N(int64(p.cfg.HeartbeatInterval)))
		}
		slices.Sort(offsets)
		killedAt := make(map[string]time.Time, k)
		round := p.clock.Now()
		for i, v := range victims {
			if err := sleepCtx(ctx, p.clock, round.Add(offsets[i]).Sub(p.clock.Now())); err != nil {
				return out, err
			}
			at := p.clock.Now()
			if !v.Kill() {
				return out, fmt.Errorf("scale: cell %s was not up to be killed", v.ID())
			}
			killedAt[v.ID()] = at
		}
		removedAt := make(map[string]time.Time, k)
		wctx, cancel := context.WithTimeout(ctx, p.cfg.DeathTimeout)
		_, err := p.watcher.WaitFor(wctx, func(a xdsclient.Assignment) bool {
			ws := a.Weights()
			for id := range killedAt {
				if _, done := removedAt[id]; !done && ws[id] == 0 {
					removedAt[id] = a.At
				}
			}
			return len(removedAt) == len(killedAt)
		})
		cancel()
		if err != nil {
			return out, fmt.Errorf("scale: %d of %d killed cells still at the xDS client after %v: %w",
				len(killedAt)-len(removedAt), len(killedAt), p.cfg.DeathTimeout, err)
		}
		for id, at := range killedAt {
			out = append(out, ms(removedAt[id].Sub(at)))
		}
		for _, v := range victims {
			v.Revive()
		}
		if err := p.waitBack(ctx, victims); err != nil {
			return out, err
		}
	}
	return out, nil
}

// waitBack waits until every victim is up again and has a weight at the xDS
// client.
func (p *point) waitBack(ctx context.Context, victims []*bench.Cell) error {
	wctx, cancel := context.WithTimeout(ctx, p.cfg.DeathTimeout)
	defer cancel()
	if _, err := p.watcher.WaitFor(wctx, func(a xdsclient.Assignment) bool {
		ws := a.Weights()
		for _, v := range victims {
			if ws[v.ID()] == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("scale: revived cells not back at the xDS client within %v: %w", p.cfg.DeathTimeout, err)
	}
	return waitUntil(ctx, p.clock, p.cfg.DeathTimeout, "revived cells' streams acked", func() bool {
		for _, v := range victims {
			if !v.Up() {
				return false
			}
		}
		return true
	})
}
