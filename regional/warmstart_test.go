package regional

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

func modelHB(id, ep, model string) *isobarpb.CellHeartbeat {
	hb := heartbeat(id, ep, isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0)
	hb.Capability.Model = model
	return hb
}

// models lists a state's model names.
func models(st xds.State) []string {
	var out []string
	for _, m := range st.Models {
		out = append(out, m.Name)
	}
	return out
}

// restartCells are the cells of the warm-start tests: two of model m, one
// of model m2.
var restartCells = []struct{ id, ep, model string }{
	{"a", "127.0.0.1:1001", "m"}, {"b", "127.0.0.1:1002", "m"}, {"c", "127.0.0.1:1003", "m2"},
}

// servedBefore runs a first controller incarnation on dir until it has
// pushed every restart cell and written them to its warm-state file, then
// stops it.
func servedBefore(t *testing.T, dir string) {
	t.Helper()
	f := newLimitedFixture(t, func(c *Config) { c.WarmStart.StateDir, c.WarmStart.Hold = dir, -1 })
	for _, c := range restartCells {
		f.send(modelHB(c.id, c.ep, c.model))
	}
	var st *warmState
	var err error
	if !eventually.Wait(10*time.Second, func() bool {
		st, err = loadWarmState(dir, "r1", 100)
		return err != nil || (st != nil && len(st.Cells) == len(restartCells))
	}) {
		t.Fatalf("warm-state file never listed the %d cells: %+v", len(restartCells), st)
	}
	if err != nil {
		t.Fatal(err)
	}
	f.reg.Stop()
}

// noPush fails if the registry pushed anything.
func (f *regFixture) noPush(when string) {
	f.t.Helper()
	select {
	case st := <-f.push.pushed:
		f.t.Fatalf("%s: pushed %v (models %v) before the cells were back", when, weights(st), models(st))
	default:
	}
}

// TestWarmRestartHoldsFirstPushUntilQuorum: a restarted controller whose
// first cell reconnects pushes nothing (old code: it pushed a state with
// only that cell, model m2 gone: "no route" for m2) until every cell of
// the last pushed state is back, and then waits for a route table when it
// routes across regions.
func TestWarmRestartHoldsFirstPushUntilQuorum(t *testing.T) {
	dir := t.TempDir()
	servedBefore(t, dir)

	f := newFixtureWith(t, func(c *Config) { c.WarmStart.StateDir = dir },
		func(r *Registry) { r.warm.needRoutes = true })
	if f.reg.Settled() {
		t.Fatal("settled before any cell reconnected")
	}
	f.send(modelHB("a", "127.0.0.1:1001", "m"))
	for range 3 {
		f.tick()
	}
	f.noPush("one of three cells back")
	f.send(modelHB("b", "127.0.0.1:1002", "m"))
	f.tick()
	f.noPush("two of three cells back")
	f.send(modelHB("c", "127.0.0.1:1003", "m2"))
	f.tick()
	if !f.reg.Settled() {
		t.Fatal("every known cell is back but the registry is not settled")
	}
	// Cells are back; the region routes across regions, so the push waits
	// for the first route table.
	f.noPush("cells back, no route table yet")
	if err := f.reg.SetRoutes(context.Background(), &RouteTable{Source: RoutesLocal, Models: map[string]ModelRoutes{}}); err != nil {
		t.Fatal(err)
	}
	if w := f.nextPush(); len(w) != 3 {
		t.Fatalf("first push after the hold = %v, want the three cells", w)
	}
	if got := testutil.ToFloat64(f.reg.warmM.releases.WithLabelValues("quorum")); got != 1 {
		t.Errorf("releases{quorum} = %v, want 1", got)
	}
}

// TestWarmRestartDeadlineKeepsModels: when a known cell does not come back
// within the hold, the first push goes out at the deadline and keeps the
// missing cell's model (an empty cluster, 503, not 404); the model leaves
// the state only when ForgetAfter has passed, counted as "forgotten".
func TestWarmRestartDeadlineKeepsModels(t *testing.T) {
	dir := t.TempDir()
	servedBefore(t, dir)

	const forget = 6 * time.Second
	f := newLimitedFixture(t, func(c *Config) { c.WarmStart.StateDir, c.ForgetAfter = dir, forget })
	start := f.clock.Now()
	hold := f.reg.cfg.WarmStart.hold(f.reg.cfg.TTL())
	if hold != f.reg.cfg.TTL()+2*DefaultAgentBackoffMax {
		t.Fatalf("default hold %v, want TTL + twice the agent backoff max", hold)
	}
	var first xds.State
	for got := false; !got; {
		f.send(modelHB("a", "127.0.0.1:1001", "m"))
		f.send(modelHB("b", "127.0.0.1:1002", "m"))
		f.tick()
		select {
		case first = <-f.push.pushed:
			got = true
		default:
		}
		if !got && f.clock.Since(start) > hold+time.Second {
			t.Fatalf("no push %v after the start (hold %v)", f.clock.Since(start), hold)
		}
	}
	if el := f.clock.Since(start); el < hold {
		t.Fatalf("first push %v after the start, before the hold %v ran out with c missing", el, hold)
	}
	if w := weights(first); len(w) != 2 || w["c"] != 0 {
		t.Fatalf("first push = %v, want a and b", w)
	}
	if ms := models(first); !slices.Equal(ms, []string{"m", "m2"}) {
		t.Fatalf("first push models = %v, want m2 kept (its cell has not reconnected)", ms)
	}
	if got := testutil.ToFloat64(f.reg.warmM.releases.WithLabelValues("deadline")); got != 1 {
		t.Errorf("releases{deadline} = %v, want 1", got)
	}
	// m2 goes when ForgetAfter has passed, with its reason.
	for f.clock.Since(start) < forget+time.Second {
		f.send(modelHB("a", "127.0.0.1:1001", "m"))
		f.send(modelHB("b", "127.0.0.1:1002", "m"))
		f.tick()
	}
	if got := testutil.ToFloat64(f.reg.warmM.dropped.WithLabelValues("forgotten")); got != 1 {
		t.Errorf("models dropped{forgotten} = %v, want 1", got)
	}
	last := f.lastState()
	if ms := models(last); !slices.Equal(ms, []string{"m"}) {
		t.Errorf("models after ForgetAfter = %v, want [m]", ms)
	}
}

// lastState drains the pushes and returns the latest.
func (f *regFixture) lastState() xds.State {
	f.t.Helper()
	f.push.mu.Lock()
	defer f.push.mu.Unlock()
	if len(f.push.states) == 0 {
		f.t.Fatal("nothing pushed")
	}
	return f.push.states[len(f.push.states)-1]
}

// TestWarmStartTerminatedModelDropCounted: a model whose only cell reports
// Terminated leaves the state, counted as "terminated".
func TestWarmStartTerminatedModelDropCounted(t *testing.T) {
	f := newRegFixture(t)
	f.send(modelHB("a", "127.0.0.1:1001", "m"))
	f.send(modelHB("c", "127.0.0.1:1003", "m2"))
	f.nextPush()
	hb := modelHB("c", "127.0.0.1:1003", "m2")
	hb.State = isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED
	f.send(hb)
	f.waitView(func(*View) bool {
		return testutil.ToFloat64(f.reg.warmM.dropped.WithLabelValues("terminated")) == 1
	})
}

func TestWarmStartNoHoldWithoutStateDir(t *testing.T) {
	f := newRegFixture(t)
	if !f.reg.Settled() {
		t.Fatal("a controller without a state dir or hold must not hold")
	}
	f.send(modelHB("a", "127.0.0.1:1001", "m"))
	if w := f.nextPush(); len(w) != 1 {
		t.Fatalf("push = %v", w)
	}
}

// TestWarmStateFileRefused: a corrupt file is refused with a reason and a
// counter; the hold then runs to its deadline.
func TestWarmStateFileRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, warmStateFile), []byte(`{"version":1,"region":"r1","cells":[{"id":"a"`), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newLimitedFixture(t, func(c *Config) { c.WarmStart.StateDir = dir })
	if got := testutil.ToFloat64(f.reg.warmM.errors.WithLabelValues("load")); got != 1 {
		t.Errorf("errors{load} = %v, want 1", got)
	}
	if f.reg.Settled() {
		t.Error("settled at once with a refused file: want the full hold")
	}
}

func TestDecodeWarmState(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"ok", `{"version":1,"region":"r1","saved_at":"2026-01-01T00:00:00Z","cells":[{"id":"a","model":"m"}],"models":["m"]}`, ""},
		{"other region", `{"version":1,"region":"r2","cells":[],"models":[]}`, "written by region"},
		{"version", `{"version":2,"region":"r1"}`, "version 2"},
		{"unknown field", `{"version":1,"region":"r1","x":1}`, "unknown field"},
		{"duplicate cell", `{"version":1,"region":"r1","cells":[{"id":"a","model":"m"},{"id":"a","model":"m"}]}`, "twice"},
		{"empty model", `{"version":1,"region":"r1","cells":[{"id":"a","model":""}]}`, "model name"},
		{"trailing", `{"version":1,"region":"r1"} {}`, "trailing"},
		{"too many cells", `{"version":1,"region":"r1","cells":[{"id":"a","model":"m"},{"id":"b","model":"m"},{"id":"c","model":"m"}]}`, "at most 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeWarmState([]byte(tc.body), "r1", 2)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.Is(err, errWarmState) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want errWarmState containing %q", err, tc.want)
			}
		})
	}
}

func TestWarmStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := xds.State{Models: []xds.Model{
		{Name: "m", Localities: []xds.Locality{
			{Region: "r1", Endpoints: []xds.Endpoint{{CellID: "b"}, {CellID: "a"}}},
			{Region: "r2", Endpoints: []xds.Endpoint{{CellID: "region/r2"}}},
		}},
		{Name: "remote-only", Localities: []xds.Locality{{Region: "r2", Endpoints: []xds.Endpoint{{CellID: "region/r2"}}}}},
	}}
	ws := warmStateOf("r1", st, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	if err := writeWarmState(dir, ws); err != nil {
		t.Fatal(err)
	}
	got, err := loadWarmState(dir, "r1", 10)
	if err != nil {
		t.Fatal(err)
	}
	if !got.sameContent(ws) || len(got.Cells) != 2 || got.Cells[0].ID != "a" || len(got.Models) != 2 {
		t.Fatalf("round trip: %+v, want %+v", got, ws)
	}
	// No temporary file is left behind.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("state dir holds %d entries, want only %s", len(ents), warmStateFile)
	}
}

func FuzzDecodeWarmState(f *testing.F) {
	f.Add([]byte(`{"version":1,"region":"r1","saved_at":"2026-01-01T00:00:00Z","cells":[{"id":"a","model":"m"}],"models":["m"]}`))
	f.Add([]byte(`{"version":1,"region":"r1","cells":[],"models":[]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		st, err := decodeWarmState(b, "r1", 64)
		if err != nil {
			if !errors.Is(err, errWarmState) {
				t.Fatalf("error %v does not wrap errWarmState", err)
			}
			return
		}
		if len(st.Cells) > 64 || st.Region != "r1" {
			t.Fatalf("accepted out of bounds: %+v", st)
		}
	})
}

// TestWarmRestartSyncerWaitsForCells: while a restarted controller's cells
// are not back, the syncer publishes no summary and installs no fallback
// (old code: its first tick built a summary of zero cells and installed a
// fallback table, which the registry pushed at once as urgent).
func TestWarmRestartSyncerWaitsForCells(t *testing.T) {
	dir := t.TempDir()
	servedBefore(t, dir)
	f := newFixtureWith(t, func(c *Config) { c.WarmStart.StateDir = dir },
		func(r *Registry) { r.warm.needRoutes = true })
	s := newTestSyncer(f.reg.cfg.Global, "r1", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.summaries(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	f.send(modelHB("a", "127.0.0.1:1001", "m"))
	// Two summary intervals pass with one cell of three back (the hold,
	// TTL + 2 s, runs longer).
	if hold := f.reg.cfg.WarmStart.hold(f.reg.cfg.TTL()); hold <= 2*f.reg.cfg.Global.SummaryInterval {
		t.Fatalf("hold %v: the test needs it longer than two summary intervals", hold)
	}
	for end := f.clock.Now().Add(2 * f.reg.cfg.Global.SummaryInterval); f.clock.Now().Before(end); {
		f.send(modelHB("a", "127.0.0.1:1001", "m"))
		f.tick()
	}
	if sm := s.summary.Latest(); sm != nil {
		t.Fatalf("summary published with %d cells before the cells were back", len(sm.GetModels()))
	}
	if rt := s.Routes(); rt != nil {
		t.Fatalf("route table %q installed before the cells were back", rt.Source)
	}
	f.noPush("one of three cells back, syncer running")

	// The rest come back: the next tick summarises all three, installs the
	// fallback, and the held push goes out with every cell.
	f.send(modelHB("b", "127.0.0.1:1002", "m"))
	f.send(modelHB("c", "127.0.0.1:1003", "m2"))
	var first xds.State
	for got := false; !got; {
		f.send(modelHB("a", "127.0.0.1:1001", "m"))
		f.send(modelHB("b", "127.0.0.1:1002", "m"))
		f.send(modelHB("c", "127.0.0.1:1003", "m2"))
		f.tick()
		select {
		case first = <-f.push.pushed:
			got = true
		default:
		}
		if f.clock.Since(f.reg.warm.startedAt) > time.Minute {
			t.Fatal("no push a minute after every cell was back")
		}
	}
	if w := weights(first); len(w) != 3 {
		t.Fatalf("first push = %v, want the three cells", w)
	}
	if s.summary.Latest() == nil || s.Routes() == nil {
		t.Fatal("no summary or route table once the cells were back")
	}
}
