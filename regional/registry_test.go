package regional

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// recordingPusher keeps every state pushed and signals each push.
type recordingPusher struct {
	mu     sync.Mutex
	states []xds.State
	pushed chan xds.State
}

func newRecordingPusher() *recordingPusher {
	return &recordingPusher{pushed: make(chan xds.State, 256)}
}

func (p *recordingPusher) push(st xds.State) (string, error) {
	st = cloneState(st) // a pushFunc must not keep the registry's buffers
	p.mu.Lock()
	p.states = append(p.states, st)
	n := len(p.states)
	p.mu.Unlock()
	p.pushed <- st
	return string(rune('0' + n)), nil
}

// cloneState is a deep copy of st's models, localities and endpoints.
func cloneState(st xds.State) xds.State {
	st.Models = slices.Clone(st.Models)
	for i := range st.Models {
		m := &st.Models[i]
		m.Localities = cloneLocalities(m.Localities)
		m.Pinned = slices.Clone(m.Pinned)
		for j := range m.Pinned {
			m.Pinned[j].Localities = cloneLocalities(m.Pinned[j].Localities)
		}
	}
	return st
}

func cloneLocalities(ls []xds.Locality) []xds.Locality {
	ls = slices.Clone(ls)
	for i := range ls {
		ls[i].Endpoints = slices.Clone(ls[i].Endpoints)
	}
	return ls
}

// weights flattens a state to cell → weight.
func weights(st xds.State) map[string]uint32 {
	out := map[string]uint32{}
	for _, m := range st.Models {
		for _, l := range m.Localities {
			for _, e := range l.Endpoints {
				out[e.CellID] = e.Weight
			}
		}
	}
	return out
}

type regFixture struct {
	t     *testing.T
	clock *clockwork.FakeClock
	reg   *Registry
	push  *recordingPusher
	prom  *prometheus.Registry
	m     *metrics
	seq   map[string]uint64
}

func newRegFixture(t *testing.T) *regFixture {
	t.Helper()
	return newLimitedFixture(t, func(*Config) {})
}

func f64(v float64) *float64 { return &v }

func heartbeat(id, ep string, state isobarpb.LifecycleState, seq uint64) *isobarpb.CellHeartbeat {
	return &isobarpb.CellHeartbeat{
		CellId: id, Region: "r1", Endpoint: ep, State: state, Sequence: seq, Incarnation: "i1",
		Capability: &isobarpb.Capability{Model: "m", MaxModelLen: 8192},
		Vllm:       &isobarpb.SourceHealth{Ok: true},
		Dcgm:       &isobarpb.SourceHealth{Ok: true},
		Signals: &isobarpb.Signals{
			QueueDepth: f64(0), Running: f64(0), KvCacheUsage: f64(0),
			GpuUtil: f64(0), VramUsed: f64(0), SmActive: f64(0), DramActive: f64(0),
		},
	}
}

// send submits a heartbeat and waits until the registry's view reflects it.
func (f *regFixture) send(hb *isobarpb.CellHeartbeat) {
	f.t.Helper()
	if hb.Sequence == 0 {
		f.seq[hb.CellId]++
		hb.Sequence = f.seq[hb.CellId]
	}
	id, seq := hb.CellId, hb.Sequence // the registry owns hb once it took it
	if err := f.reg.SubmitOrBlock(context.Background(), hb); err != nil {
		f.t.Fatal(err)
	}
	f.waitView(func(v *View) bool {
		c, ok := v.Cell(id)
		return ok && c.Sequence == seq
	})
}

// waitView advances the fake clock one cycle at a time until cond holds.
func (f *regFixture) waitView(cond func(*View) bool) *View {
	f.t.Helper()
	for range 200 {
		if v := f.reg.View(); cond(v) {
			return v
		}
		f.tick()
	}
	f.t.Fatalf("view never satisfied the condition; last: %+v", f.reg.View().Cells)
	return nil
}

// tick advances the fake clock by one cycle interval and waits for the
// registry to run that cycle.
func (f *regFixture) tick() {
	f.t.Helper()
	before := f.reg.View().Cycle
	if err := f.clock.BlockUntilContext(context.Background(), 1); err != nil {
		f.t.Fatal(err)
	}
	f.clock.Advance(f.reg.cfg.CycleInterval)
	eventually.True(f.t, 5*time.Second, "the registry to run a cycle", func() bool { return f.reg.View().Cycle != before })
}

func (f *regFixture) nextPush() map[string]uint32 {
	f.t.Helper()
	select {
	case st := <-f.push.pushed:
		return weights(st)
	case <-time.After(5 * time.Second):
		f.t.Fatal("no xDS push")
		return nil
	}
}

func TestRegistryLifecycleAndTTL(t *testing.T) {
	f := newRegFixture(t)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING, 0))
	f.send(heartbeat("b", "127.0.0.1:1002", ready, 0))
	if w := f.nextPush(); len(w) != 1 || w["b"] != 100 {
		t.Fatalf("first push = %v, want only b at 100", w)
	}
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	if w := f.nextPush(); len(w) != 2 {
		t.Fatalf("after a is ready: %v", w)
	}

	// a keeps heartbeating, b goes silent: after the TTL b is Failed and
	// pushed out, a stays.
	ttl := f.reg.cfg.TTL()
	silentSince := f.clock.Now()
	for f.clock.Since(silentSince) < ttl+f.reg.cfg.CycleInterval {
		f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
		f.tick()
	}
	v := f.reg.View()
	b, _ := v.Cell("b")
	if b.State != lifecycle.Failed {
		t.Fatalf("b state = %s after %v of silence, want failed", b.State, f.clock.Since(silentSince))
	}
	if w := f.nextPush(); len(w) != 1 || w["a"] == 0 {
		t.Fatalf("after b failed: %v", w)
	}
	if got := testutil.ToFloat64(f.m.transitions.WithLabelValues("ready", "failed")); got != 1 {
		t.Errorf("ready→failed transitions = %v", got)
	}
	if testutil.CollectAndCount(f.m.failover) != 1 {
		t.Errorf("failover histogram not observed")
	}

	// b comes back.
	f.send(heartbeat("b", "127.0.0.1:1002", ready, 0))
	if w := f.nextPush(); len(w) != 2 {
		t.Fatalf("after b recovered: %v", w)
	}
}

func TestRegistryEngineDeathIsUrgent(t *testing.T) {
	f := newRegFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	f.nextPush()
	hb := heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED, 0)
	hb.Reason = "engine connection closed"
	f.seq["a"]++
	hb.Sequence = f.seq["a"]
	if err := f.reg.SubmitOrBlock(context.Background(), hb); err != nil {
		t.Fatal(err)
	}
	// No clock advance: the state change alone triggers the push.
	if w := f.nextPush(); len(w) != 0 {
		t.Fatalf("after engine death: %v", w)
	}
	c, _ := f.reg.View().Cell("a")
	if c.Reason != "engine connection closed" {
		t.Errorf("reason = %q", c.Reason)
	}
}

func TestRegistryDrain(t *testing.T) {
	f := newRegFixture(t)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	f.nextPush()
	if err := f.reg.SetDrain(context.Background(), "nope", true); !errors.Is(err, ErrUnknownCell) {
		t.Fatalf("drain unknown = %v", err)
	}
	if got := testutil.ToFloat64(f.m.unknownCells); got != 1 {
		t.Errorf("unknown cell counter = %v", got)
	}
	if err := f.reg.SetDrain(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	// The agent still says Ready; the operator's drain wins.
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	c, _ := f.reg.View().Cell("a")
	if c.State != lifecycle.Draining || !c.OperatorDrain {
		t.Fatalf("after drain: %s drain=%v", c.State, c.OperatorDrain)
	}
	// The weight ramps to zero over DrainRamp (the agent keeps heartbeating)
	// and the endpoint is removed. The ramp runs from the drain's
	// transition, whose cycle ran at once; the heartbeat above may have
	// waited a tick for its own.
	drainStart := c.StateSince
	var last uint32 = 100
	for step := 0; ; step++ {
		if step > 200 {
			t.Fatal("drain never completed")
		}
		f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
		f.tick()
		c, _ = f.reg.View().Cell("a")
		if c.Weight.Published > last {
			t.Fatalf("weight rose during the drain: %d after %d", c.Weight.Published, last)
		}
		last = c.Weight.Published
		if last == 0 {
			break
		}
	}
	if c.State != lifecycle.Draining {
		t.Errorf("state after the ramp = %s", c.State)
	}
	if took := f.clock.Since(drainStart); took < f.reg.cfg.Projection.DrainRamp {
		t.Errorf("removed after %v, before the ramp of %v", took, f.reg.cfg.Projection.DrainRamp)
	}
}

// An operator's drain of a cell its agent is draining already changes no
// state, only the flag; the next cycle shows the flag all the same.
func TestRegistryDrainOfADrainingCell(t *testing.T) {
	f := newRegFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING, 0))
	if c, _ := f.reg.View().Cell("a"); c.State != lifecycle.Draining || c.OperatorDrain {
		t.Fatalf("before the drain: %s drain=%v, want draining by its agent", c.State, c.OperatorDrain)
	}
	for _, drain := range []bool{true, false} {
		if err := f.reg.SetDrain(context.Background(), "a", drain); err != nil {
			t.Fatal(err)
		}
		f.tick()
		if c, _ := f.reg.View().Cell("a"); c.OperatorDrain != drain {
			t.Errorf("a cycle after SetDrain(%v): the view shows the operator's drain %v", drain, c.OperatorDrain)
		}
	}
}

func TestRegistryEndpointConflict(t *testing.T) {
	f := newRegFixture(t)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	f.nextPush()
	f.send(heartbeat("b", "127.0.0.1:1001", ready, 0))
	c, _ := f.reg.View().Cell("b")
	if !c.EndpointConflict || c.Weight.Published != 0 {
		t.Fatalf("b = %+v, want a conflict with no weight", c)
	}
	if got := testutil.ToFloat64(f.m.rejected.WithLabelValues("endpoint_conflict")); got != 1 {
		t.Errorf("endpoint_conflict counter = %v", got)
	}
}

func TestRegistryFallbackWhenDCGMDown(t *testing.T) {
	f := newRegFixture(t)
	hb := heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)
	f.send(hb)
	c, _ := f.reg.View().Cell("a")
	if c.Fallback {
		t.Fatal("fallback set with every source healthy")
	}
	down := proto.Clone(hb).(*isobarpb.CellHeartbeat)
	down.Sequence = 0
	down.Dcgm = &isobarpb.SourceHealth{Ok: false, Error: "connection refused"}
	f.send(down)
	c, _ = f.reg.View().Cell("a")
	if !c.Fallback || c.State != lifecycle.Ready || c.Weight.Published == 0 {
		t.Fatalf("dcgm down: %+v", c)
	}
	for s, present := range c.Score.Present {
		if present && s >= 4 && s <= 7 {
			t.Errorf("hardware signal %d scored while DCGM is down", s)
		}
	}
}

// A heartbeat stream that breaks without a Terminated report makes the
// cell suspect: weight 0 at once (no clock advance, so no TTL can be the
// cause), restored by the next heartbeat within the TTL, and Failed at the
// TTL when none comes. A loss reported for an older heartbeat than the
// latest (the agent already reconnected) changes nothing.
func TestRegistryStreamLossSuspect(t *testing.T) {
	f := newRegFixture(t)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	f.send(heartbeat("b", "127.0.0.1:1002", ready, 0))
	f.waitView(func(v *View) bool {
		return len(v.Cells) == 2 && v.Cells[0].Weight.Published > 0 && v.Cells[1].Weight.Published > 0
	})
	lose := func(id string) {
		t.Helper()
		cv, _ := f.reg.View().Cell(id)
		if err := f.reg.StreamLost(context.Background(), id, cv.Incarnation, cv.Sequence); err != nil {
			t.Fatal(err)
		}
	}

	// The loss alone (the clock stands still) takes a out.
	start := f.clock.Now()
	lose("a")
	f.awaitPush("a out, b in", func(w map[string]uint32) bool { return len(w) == 1 && w["b"] > 0 })
	cv, _ := f.reg.View().Cell("a")
	if !cv.Suspect || cv.State != lifecycle.Ready || cv.Weight.Published != 0 || f.clock.Since(start) != 0 {
		t.Fatalf("a = suspect %v state %s weight %d after %v, want suspect, ready, 0, at once",
			cv.Suspect, cv.State, cv.Weight.Published, f.clock.Since(start))
	}
	if got := testutil.ToFloat64(f.m.suspects); got != 1 {
		t.Errorf("suspect_cells_total = %v, want 1", got)
	}

	// It reconnects within the TTL: restored.
	f.tick()
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	f.awaitPush("a back", func(w map[string]uint32) bool { return len(w) == 2 && w["a"] > 0 })
	if cv, _ := f.reg.View().Cell("a"); cv.Suspect {
		t.Fatal("a still suspect after a heartbeat")
	}

	// A stale loss (for a heartbeat older than the latest) is ignored.
	if err := f.reg.StreamLost(context.Background(), "a", "i1", 1); err != nil {
		t.Fatal(err)
	}
	f.tick()
	if cv, _ := f.reg.View().Cell("a"); cv.Suspect {
		t.Fatal("a loss reported for an old heartbeat made a suspect")
	}

	// Broken again, and no reconnect: Failed at the TTL, not before.
	lose("a")
	f.awaitPush("a out again", func(w map[string]uint32) bool { _, ok := w["a"]; return !ok })
	lastSeen := func() time.Time { cv, _ := f.reg.View().Cell("a"); return cv.LastSeen }()
	ttl := f.reg.cfg.TTL()
	for f.clock.Since(lastSeen) < ttl-f.reg.cfg.CycleInterval {
		f.send(heartbeat("b", "127.0.0.1:1002", ready, 0))
		f.tick()
		if f.clock.Since(lastSeen) >= ttl {
			break // at the TTL a may be Failed
		}
		if cv, _ := f.reg.View().Cell("a"); cv.State != lifecycle.Ready || !cv.Suspect {
			t.Fatalf("a is %s (suspect %v) %v after its last heartbeat, before the TTL %v", cv.State, cv.Suspect, f.clock.Since(lastSeen), ttl)
		}
	}
	f.waitView(func(v *View) bool { c, _ := v.Cell("a"); return c.State == lifecycle.Failed })
	if cv, _ := f.reg.View().Cell("a"); cv.Suspect {
		t.Error("a Failed cell is still flagged suspect")
	}
	if got := testutil.ToFloat64(f.m.suspects); got != 2 {
		t.Errorf("suspect_cells_total = %v, want 2", got)
	}

	// A cell that said goodbye (Terminated) is not made suspect.
	f.send(heartbeat("b", "127.0.0.1:1002", isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED, 0))
	lose("b")
	f.tick()
	if cv, _ := f.reg.View().Cell("b"); cv.Suspect || cv.State != lifecycle.Terminated {
		t.Errorf("terminated b = %s suspect %v", cv.State, cv.Suspect)
	}
}

// awaitPush reads pushes until one's weights satisfy cond. Earlier pushes
// (states offered before the event under test) are skipped.
func (f *regFixture) awaitPush(what string, cond func(map[string]uint32) bool) {
	f.t.Helper()
	for {
		select {
		case st := <-f.push.pushed:
			if cond(weights(st)) {
				return
			}
		case <-time.After(10 * time.Second):
			f.t.Fatalf("no push with %s", what)
		}
	}
}

// A model whose every cell is briefly out (here: suspect) keeps its place
// in the xDS state, with no locality, so the data plane answers 503 (no
// healthy upstream, retryable) and not 404 (no route) until a cell is back.
func TestRegistryModelStaysRoutableWithNoEndpoint(t *testing.T) {
	f := newRegFixture(t)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	f.send(heartbeat("a", "127.0.0.1:1001", ready, 0))
	f.awaitPush("a in", func(w map[string]uint32) bool { return w["a"] > 0 })
	cv, _ := f.reg.View().Cell("a")
	if err := f.reg.StreamLost(context.Background(), "a", cv.Incarnation, cv.Sequence); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case st := <-f.push.pushed:
			if len(weights(st)) != 0 {
				continue
			}
			if len(st.Models) != 1 || st.Models[0].Name != "m" || len(st.Models[0].Localities) != 0 {
				t.Fatalf("with every cell out, state = %+v; want model m with no locality", st.Models)
			}
			return
		case <-time.After(10 * time.Second):
			t.Fatal("no push with a out")
		}
	}
}

// The registry scores its cells with regional/cycle's mapping, the one
// the benches run: each cell's score in the view is what cycle.Map makes
// of cycle.FromView of that cell (no data plane reports here).
func TestRegistryScoresWithTheCycleMapping(t *testing.T) {
	f := newRegFixture(t)
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	a := heartbeat("a", "127.0.0.1:1001", ready, 0)
	a.Signals.QueueDepth, a.Signals.ErrorRate, a.Signals.WindowRequests = f64(12), f64(0.2), f64(40)
	b := heartbeat("b", "127.0.0.1:1002", ready, 0)
	b.Dcgm.Ok = false
	f.send(a)
	f.send(b)
	v := f.reg.View()
	cells := make([]cycle.Cell, len(v.Cells))
	for i, c := range v.Cells {
		cells[i] = cycle.FromView(*c, cycle.ErrorWindow{})
	}
	_, results := cycle.Map(f.reg.cfg.Score, cells)
	for i, c := range v.Cells {
		if !reflect.DeepEqual(c.Score, results[i]) {
			t.Errorf("%s: view score %+v, cycle.Map %+v", c.ID, c.Score, results[i])
		}
	}
}

// TestOnlyLeavingCapacityIsUrgent holds the registry's rule for a cycle at
// once: a change that takes capacity away (a cell stops serving, ends,
// breaks its stream, claims a held endpoint) is; one that brings capacity
// (a new cell, a cell Ready again, a suspect restored) waits for the
// cycle's tick, so that many arrivals share one cycle and one push.
func TestOnlyLeavingCapacityIsUrgent(t *testing.T) {
	r, clk := bareRegistry(t, slog.DiscardHandler)
	seq := map[string]uint64{}
	hb := func(id, ep string, st isobarpb.LifecycleState) bool {
		seq[id]++
		return r.applyHeartbeat(clk.Now(), heartbeat(id, ep, st, seq[id]))
	}
	const (
		loading    = isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING
		ready      = isobarpb.LifecycleState_LIFECYCLE_STATE_READY
		draining   = isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING
		failed     = isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED
		terminated = isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED
	)
	for _, step := range []struct {
		what   string
		apply  func() bool
		urgent bool
	}{
		{"a new cell, Ready", func() bool { return hb("a", "127.0.0.1:1001", ready) }, false},
		{"a new cell, Loading", func() bool { return hb("b", "127.0.0.1:1002", loading) }, false},
		{"Loading to Ready", func() bool { return hb("b", "127.0.0.1:1002", ready) }, false},
		{"a heartbeat that changes nothing", func() bool { return hb("a", "127.0.0.1:1001", ready) }, false},
		{"Ready to Draining", func() bool { return hb("a", "127.0.0.1:1001", draining) }, true},
		{"Draining to Ready", func() bool { return hb("a", "127.0.0.1:1001", ready) }, false},
		{"Ready to Failed", func() bool { return hb("a", "127.0.0.1:1001", failed) }, true},
		{"Failed to Ready", func() bool { return hb("a", "127.0.0.1:1001", ready) }, false},
		{"Ready to Loading (the engine restarted)", func() bool { return hb("a", "127.0.0.1:1001", loading) }, true},
		{"Loading to Ready again", func() bool { return hb("a", "127.0.0.1:1001", ready) }, false},
		{"a broken stream", func() bool {
			return r.applyStreamLoss(clk.Now(), &streamLoss{id: "a", incarnation: "i1", sequence: seq["a"]})
		}, true},
		{"the suspect restored", func() bool { return hb("a", "127.0.0.1:1001", ready) }, false},
		// A conflict that begins or clears is rare and moves an endpoint:
		// urgent either way, even for a cell that was never in.
		{"a new cell on a live cell's endpoint (a conflict)", func() bool { return hb("c", "127.0.0.1:1001", ready) }, true},
		{"a live cell moves onto a held endpoint", func() bool { return hb("b", "127.0.0.1:1001", ready) }, true},
		{"Terminated", func() bool { return hb("a", "127.0.0.1:1001", terminated) }, true},
	} {
		if got := step.apply(); got != step.urgent {
			t.Errorf("%s: urgent = %v, want %v", step.what, got, step.urgent)
		}
	}
}
