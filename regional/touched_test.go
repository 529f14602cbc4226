package regional

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// twinRegistry is a registry driven by hand (no loop, no publisher): the
// test applies messages and runs the sweep and the cycle itself.
func twinRegistry(t *testing.T, cfg Config, clk clockwork.Clock) *Registry {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRegistry(cfg, clk, slog.New(slog.DiscardHandler), m, newRecordingPusher().push)
	if err != nil {
		t.Fatal(err)
	}
	r.auditAll = true
	return r
}

// A cycle that reads only the touched cells (and those whose data-plane
// window moved) decides exactly what a cycle that reads every cell
// decides. Two registries take the same random events (heartbeats with
// moving loads, states and incarnations, probes, drains, stream losses,
// data-plane reports whose samples age out of the window, cells that come
// and are forgotten, TTL expiries); before each of its cycles one of them
// touches every cell, and each cycle's views and offered state must be
// equal.
func TestReadingTheTouchedCellsChangesNothing(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			cfg := DefaultConfig("r1")
			cfg.DataPlaneWindow = 2 * time.Second
			cfg.ForgetAfter = 3 * time.Second
			clk := clockwork.NewFakeClockAt(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
			tracked, full := twinRegistry(t, cfg, clk), twinRegistry(t, cfg, clk)
			twins := []*Registry{tracked, full}
			rng := rand.New(rand.NewPCG(seed, 26))
			const n = 48
			seq := map[string]uint64{}
			inc := map[string]string{}
			states := []isobarpb.LifecycleState{
				isobarpb.LifecycleState_LIFECYCLE_STATE_READY, isobarpb.LifecycleState_LIFECYCLE_STATE_READY,
				isobarpb.LifecycleState_LIFECYCLE_STATE_READY, isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING,
				isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING, isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED,
				isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED,
			}
			beat := func(i int, state isobarpb.LifecycleState) {
				id := fmt.Sprintf("cell-%02d", i)
				seq[id]++
				if inc[id] == "" || rng.IntN(40) == 0 {
					inc[id] = fmt.Sprint("i", rng.IntN(1000))
				}
				load := float64(rng.IntN(4) * 10)
				for _, r := range twins { // each registry owns its heartbeat
					hb := heartbeat(id, fmt.Sprintf("10.0.%d.%d:8000", i/200, i%200), state, seq[id])
					hb.Incarnation = inc[id]
					hb.Signals.QueueDepth = f64(load)
					r.applyHeartbeat(clk.Now(), hb)
				}
			}
			for i := range n - 8 {
				beat(i, isobarpb.LifecycleState_LIFECYCLE_STATE_READY)
			}
			for step := range 300 {
				now := clk.Now()
				for range rng.IntN(12) {
					i := rng.IntN(n)
					state := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
					if rng.IntN(6) == 0 {
						state = states[rng.IntN(len(states))]
					}
					beat(i, state)
				}
				var probes []probeResult
				for range rng.IntN(6) {
					probes = append(probes, probeResult{id: fmt.Sprintf("cell-%02d", rng.IntN(n)), ok: rng.IntN(8) != 0,
						rtt: time.Duration(200+rng.IntN(3)*100) * time.Microsecond, jitter: 20 * time.Microsecond})
				}
				var rep *isobarpb.DataPlaneReport
				if rng.IntN(5) == 0 {
					rep = &isobarpb.DataPlaneReport{Node: "gw", Region: "r1", IntervalSeconds: 1}
					for range 1 + rng.IntN(6) {
						req := uint64(rng.IntN(50))
						rep.Endpoints = append(rep.Endpoints, &isobarpb.EndpointStats{
							CellId: fmt.Sprintf("cell-%02d", rng.IntN(n)), Requests: req, Errors: uint64(rng.IntN(int(req) + 1))})
					}
				}
				victim := fmt.Sprintf("cell-%02d", rng.IntN(n))
				drain, lose := rng.IntN(15) == 0, rng.IntN(10) == 0
				for _, r := range twins {
					r.apply(message{probes: probes})
					if rep != nil {
						r.apply(message{report: rep})
					}
					if c := r.cells[victim]; c != nil && lose {
						r.apply(message{lost: &streamLoss{id: victim, incarnation: c.hb.GetIncarnation(), sequence: c.hb.GetSequence(), reported: now}})
					}
					if drain {
						req := &drainRequest{id: victim, drain: step%2 == 0, reply: make(chan error, 1)}
						r.apply(message{drain: req})
					}
				}
				for _, c := range full.cells {
					full.touch(c)
				}
				for _, r := range twins {
					r.sweep(now)
					r.cycle(now)
				}
				a, b := tracked.View(), full.View()
				if len(a.Cells) != len(b.Cells) {
					t.Fatalf("step %d: %d cells against %d", step, len(a.Cells), len(b.Cells))
				}
				for i := range a.Cells {
					if !reflect.DeepEqual(*a.Cells[i], *b.Cells[i]) {
						t.Fatalf("step %d: cell %s reading the touched cells:\n%+v\nreading every cell:\n%+v", step, a.Cells[i].ID, *a.Cells[i], *b.Cells[i])
					}
				}
				if pa, pb := tracked.pub.pending, full.pub.pending; (pa == nil) != (pb == nil) || pa != nil && !reflect.DeepEqual(*pa, *pb) {
					t.Fatalf("step %d: the offered states differ", step)
				}
				// Mostly a cycle, at times a heartbeat's interval, and
				// now and then past the window and the TTL.
				switch k := rng.IntN(20); {
				case k == 0:
					clk.Advance(cfg.DataPlaneWindow + time.Duration(rng.IntN(2000))*time.Millisecond)
				case k < 4:
					clk.Advance(cfg.HeartbeatInterval)
				default:
					clk.Advance(cfg.CycleInterval)
				}
			}
		})
	}
}

// A write that forgets to touch its cell (a bug) is found by the rolling
// comparison within auditEvery cycles, and the cell's view shows it then;
// until its turn, the cycle does not read it.
func TestRollingComparisonFindsAnUntouchedWrite(t *testing.T) {
	const n = 120
	cb := newCycleBench(t, n)
	cb.r.auditAll = false
	cb.clock.Advance(cb.cfg.Projection.MinInterval)
	cb.r.cycle(cb.clock.Now()) // reads every cell: they are new
	victim := cb.r.cells[cb.hbs[37].CellId]
	victim.drain = true // and no touch
	found := -1
	for k := range auditEvery {
		cb.clock.Advance(cb.cfg.Projection.MinInterval)
		cb.r.cycle(cb.clock.Now())
		if v, _ := cb.r.View().Cell(victim.id); v.OperatorDrain {
			found = k
			break
		}
	}
	per := (n + auditEvery - 1) / auditEvery
	if want := victim.pos / per; found != want {
		t.Fatalf("the untouched write showed at cycle %d after it, want %d: the comparison's turn for position %d at %d cells a cycle",
			found, want, victim.pos, per)
	}
}
