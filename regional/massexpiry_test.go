package regional

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// massRegistry is a registry of n Ready cells on a fake clock, driven by
// hand: heartbeats applied and sweeps run where the test says.
type massRegistry struct {
	t     *testing.T
	r     *Registry
	clock *clockwork.FakeClock
	seq   uint64
}

func newMassRegistry(t *testing.T, n int, mass MassExpiryConfig) *massRegistry {
	t.Helper()
	cfg := DefaultConfig("r1")
	cfg.MassExpiry = mass.withDefaults()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC))
	r, err := newRegistry(cfg, clock, slog.New(slog.DiscardHandler), m, func(xds.State) (string, error) { return "1", nil })
	if err != nil {
		t.Fatal(err)
	}
	r.auditAll = true
	mr := &massRegistry{t: t, r: r, clock: clock}
	mr.beat(mr.ids(0, n)...)
	return mr
}

func (mr *massRegistry) ids(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("cell-%02d", i))
	}
	return out
}

// beat applies one Ready heartbeat of each cell, now.
func (mr *massRegistry) beat(ids ...string) {
	mr.seq++
	for _, id := range ids {
		var i int
		_, _ = fmt.Sscanf(id, "cell-%d", &i)
		mr.r.applyHeartbeat(mr.clock.Now(), heartbeat(id, fmt.Sprintf("10.0.0.%d:8000", i+1), isobarpb.LifecycleState_LIFECYCLE_STATE_READY, mr.seq))
	}
}

// after moves the clock by d and sweeps.
func (mr *massRegistry) after(d time.Duration) {
	mr.clock.Advance(d)
	mr.r.sweep(mr.clock.Now())
}

// states counts the cells by state.
func (mr *massRegistry) states() map[lifecycle.State]int {
	out := map[lifecycle.State]int{}
	for _, c := range mr.r.cells {
		out[c.state]++
	}
	return out
}

func (mr *massRegistry) want(what string, ready, failed, held int) {
	mr.t.Helper()
	st := mr.states()
	if st[lifecycle.Ready] != ready || st[lifecycle.Failed] != failed {
		mr.t.Errorf("%s: %d ready, %d failed; want %d and %d", what, st[lifecycle.Ready], st[lifecycle.Failed], ready, failed)
	}
	if got := testutil.ToFloat64(mr.r.metrics.ttlHeld); got != float64(held) {
		mr.t.Errorf("%s: isobar_regional_ttl_held_cells %v, want %d", what, got, held)
	}
}

// TestMassExpiryHeld: a controller that stalls past the TTL (its clock
// moves, no heartbeat is read) holds its cells rather than failing them
// all; they are live again when heartbeats resume. Fewer than the
// fraction expiring fail as usual.
func TestMassExpiryHeld(t *testing.T) {
	mr := newMassRegistry(t, 10, MassExpiryConfig{})
	ttl := mr.r.cfg.TTL()
	mr.after(3 * ttl) // the stall: every cell past its TTL at once
	mr.want("after a stall of 3 TTLs", 10, 0, 10)
	if n := testutil.ToFloat64(mr.r.metrics.massExpiries); n != 1 {
		t.Errorf("isobar_regional_mass_ttl_expiries_total %v, want 1", n)
	}
	mr.beat(mr.ids(0, 10)...) // the backlog is read
	mr.after(ttl / 2)
	mr.want("heartbeats back", 10, 0, 0)

	// Three of ten silent: under half, each is failed by its TTL.
	mr.beat(mr.ids(3, 10)...)
	mr.after(ttl / 2)
	mr.beat(mr.ids(3, 10)...)
	mr.after(ttl / 2)
	mr.want("three of ten silent", 7, 3, 0)
	if n := testutil.ToFloat64(mr.r.metrics.massExpiries); n != 1 {
		t.Errorf("isobar_regional_mass_ttl_expiries_total %v, want still 1", n)
	}
}

// TestMassExpiryHoldIsBounded: cells that stay silent through the whole
// hold (a real correlated death) fail when it ends, and a negative hold
// never holds.
func TestMassExpiryHoldIsBounded(t *testing.T) {
	mr := newMassRegistry(t, 6, MassExpiryConfig{Hold: 5 * time.Second})
	ttl := mr.r.cfg.TTL()
	mr.after(ttl)
	mr.want("all silent for the TTL", 6, 0, 6)
	// The hold counts from the sweep that saw the mass expiry.
	mr.after(5*time.Second - time.Millisecond)
	mr.want("just before the hold ends", 6, 0, 6)
	mr.after(time.Millisecond)
	mr.want("the hold over", 0, 6, 0)
	mr.after(ttl)
	mr.want("a sweep later", 0, 6, 0)

	off := newMassRegistry(t, 6, MassExpiryConfig{Hold: -1})
	off.after(off.r.cfg.TTL())
	off.want("hold off", 0, 6, 0)

	// Two cells are too few to be a mass expiry, however small the region.
	two := newMassRegistry(t, 2, MassExpiryConfig{})
	two.after(two.r.cfg.TTL())
	two.want("two of two silent", 0, 2, 0)
}

// TestMassExpiryConfig: the fraction is a share of the live cells.
func TestMassExpiryConfig(t *testing.T) {
	for _, f := range []float64{-0.1, 1.5} {
		cfg := DefaultConfig("r1")
		cfg.MassExpiry.Fraction = f
		if err := cfg.validate(); err == nil {
			t.Errorf("fraction %v accepted", f)
		}
	}
	if d := DefaultConfig("r1").MassExpiry; d.Fraction != 0.5 || d.Hold != 10*time.Second {
		t.Errorf("defaults %+v, want 0.5 and 10s", d)
	}
}

// TestControllerStallHoldsCells runs a controller on a fake clock behind
// real gRPC with five cells. The clock jumps three TTLs while no heartbeat
// is sent, as when the controller process is stopped or starved: every
// cell stays Ready with its weight, and the hold shows in its gauge. When
// heartbeats flow again the hold ends; cells that then stay silent past
// the hold fail.
func TestControllerStallHoldsCells(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC))
	c := startControllerClock(t, clk, func(cfg *Config) {
		cfg.HeartbeatInterval, cfg.TTLGrace, cfg.CycleInterval = 100*time.Millisecond, 100*time.Millisecond, 20*time.Millisecond
		cfg.MassExpiry.Hold = time.Second
	})
	cfg := c.cfg
	cl := dialController(t, c.Addr(), nil)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	ids := []string{"c0", "c1", "c2", "c3", "c4"}
	streams := map[string]isobarpb.CellRegistry_HeartbeatClient{}
	seq := uint64(0)
	beat := func() {
		t.Helper()
		seq++
		for i, id := range ids {
			if err := streams[id].Send(heartbeat(id, fmt.Sprintf("127.0.0.1:%d", 4000+i), ready, seq)); err != nil {
				t.Fatal(err)
			}
		}
		// A heartbeat that changes nothing waits for the next cycle to
		// reach the view: one tick.
		for _, id := range ids {
			for cv, _ := c.Registry().View().Cell(id); cv.Sequence != seq; cv, _ = c.Registry().View().Cell(id) {
				advanceCycle(t, c, clk, cfg.CycleInterval)
			}
		}
	}
	for _, id := range ids {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s, err := cl.Heartbeat(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams[id] = s
	}
	beat()
	for _, id := range ids {
		waitCell(t, c, id, func(cv CellView) bool { return cv.State == lifecycle.Ready && cv.Weight.Published > 0 })
	}
	held := func() float64 { return testutil.ToFloat64(c.metrics.ttlHeld) }
	notFailed := func(what string) {
		t.Helper()
		for _, id := range ids {
			if cv, _ := c.Registry().View().Cell(id); cv.State != lifecycle.Ready || cv.Weight.Published == 0 {
				t.Fatalf("%s: cell %s %s with weight %d, want Ready with its weight", what, id, cv.State, cv.Weight.Published)
			}
		}
	}

	advanceCycle(t, c, clk, 3*cfg.TTL()) // the stall
	advanceCycle(t, c, clk, cfg.CycleInterval)
	notFailed("after a stall of 3 TTLs")
	if h := held(); h != 5 {
		t.Fatalf("held cells %v after the stall, want 5", h)
	}
	beat() // the backlog is read
	advanceCycle(t, c, clk, cfg.CycleInterval)
	notFailed("heartbeats back")
	if h := held(); h != 0 {
		t.Fatalf("held cells %v with heartbeats back, want 0", h)
	}

	// Silent for good: held for the hold, then failed.
	for clk.Since(c.Registry().View().Cells[0].LastSeen) < cfg.TTL()+cfg.MassExpiry.Hold+cfg.TTL() {
		advanceCycle(t, c, clk, cfg.CycleInterval*5)
	}
	for _, id := range ids {
		waitCell(t, c, id, func(cv CellView) bool { return cv.State == lifecycle.Failed })
	}
}
