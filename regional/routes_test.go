package regional

import (
	"errors"
	"log/slog"
	"maps"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
	"github.com/isobar-mesh/isobar/regional/gossip"
)

func testPlan(epoch, seq uint64, now time.Time) *isobarpb.RoutingPlan {
	return &isobarpb.RoutingPlan{
		LeaderId: "g1@127.0.0.1:1", Epoch: epoch, Sequence: seq,
		IssuedAt: timestamppb.New(now), ValidUntil: timestamppb.New(now.Add(30 * time.Second)), SentAt: timestamppb.New(now),
		Plans: []*isobarpb.ModelPlan{{
			Model: "m", IngressRegion: "b",
			Routes: []*isobarpb.Route{{Destination: "b", Fraction: 0.8}, {Destination: "c", Fraction: 0.15}},
			Shed:   0.05,
		}},
		Ingress: []*isobarpb.RegionIngress{{Region: "c", Address: "127.0.0.1:7000"}},
	}
}

func TestPlanTable(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	good, err := planTable(testPlan(5, 3, now), "b", nil, false, now, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if mr := good.Models["m"]; mr.Routes["c"] != 0.15 || mr.Shed != 0.05 || good.Ingress["c"] != "127.0.0.1:7000" {
		t.Fatalf("table = %+v", good)
	}
	cases := []struct {
		name string
		mut  func(*isobarpb.RoutingPlan)
		cur  *RouteTable
		want error
	}{
		{"lower epoch", func(p *isobarpb.RoutingPlan) { p.Epoch = 4; p.Sequence = 9 }, good, ErrStalePlan},
		{"same epoch, old sequence", func(p *isobarpb.RoutingPlan) { p.Sequence = 3 }, good, ErrStalePlan},
		{"expired", func(p *isobarpb.RoutingPlan) { p.ValidUntil = timestamppb.New(now.Add(-time.Second)) }, nil, ErrExpiredPlan},
		{"epoch 0", func(p *isobarpb.RoutingPlan) { p.Epoch = 0 }, nil, ErrInvalidPlan},
		{"fractions sum to 0.9", func(p *isobarpb.RoutingPlan) { p.Plans[0].Routes[0].Fraction = 0.7 }, nil, ErrInvalidPlan},
		{"negative fraction", func(p *isobarpb.RoutingPlan) {
			p.Plans[0].Routes[0].Fraction, p.Plans[0].Routes[1].Fraction = 1.1, -0.15
		}, nil, ErrInvalidPlan},
		{"NaN fraction", func(p *isobarpb.RoutingPlan) { p.Plans[0].Routes[1].Fraction = math.NaN() }, nil, ErrInvalidPlan},
		{"unknown destination", func(p *isobarpb.RoutingPlan) { p.Plans[0].Routes[1].Destination = "zz" }, nil, ErrInvalidPlan},
		{"another region's plan", func(p *isobarpb.RoutingPlan) { p.Plans[0].IngressRegion = "a" }, nil, ErrInvalidPlan},
		{"ingress not an IP", func(p *isobarpb.RoutingPlan) { p.Ingress[0].Address = "gw.c:7000" }, nil, ErrInvalidPlan},
		{"duplicate destination", func(p *isobarpb.RoutingPlan) {
			p.Plans[0].Routes = append(p.Plans[0].Routes, &isobarpb.Route{Destination: "c", Fraction: 0})
		}, nil, ErrInvalidPlan},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan(5, 4, now)
			tc.mut(p)
			_, err := planTable(p, "b", tc.cur, tc.cur != nil, now, 5*time.Second)
			if !errors.Is(err, tc.want) {
				t.Fatalf("planTable = %v, want %v", err, tc.want)
			}
			if planResult(err) == "applied" {
				t.Fatal("refusal reported as applied")
			}
		})
	}
	// A newer epoch wins even with a lower sequence.
	if _, err := planTable(testPlan(6, 1, now), "b", good, true, now, 5*time.Second); err != nil {
		t.Fatalf("new epoch refused: %v", err)
	}
}

// Routes become locality weights: the local cells one locality, each
// remote region's ingress another, weighted by its share.
func TestBuildStateLocalities(t *testing.T) {
	f := newRegFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	f.nextPush()
	table := &RouteTable{Source: RoutesPlan, Epoch: 1, Sequence: 1,
		Models:  map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 0.75, "r2": 0.25}}},
		Ingress: map[string]string{"r2": "127.0.0.2:9000"}}
	if err := f.reg.SetRoutes(t.Context(), table); err != nil {
		t.Fatal(err)
	}
	var st = <-f.push.pushed
	if len(st.Models) != 1 || len(st.Models[0].Localities) != 2 {
		t.Fatalf("state = %+v", st)
	}
	loc := st.Models[0].Localities
	if loc[0].Region != "r1" || loc[0].Weight != 750 || loc[1].Region != "r2" || loc[1].Weight != 250 ||
		loc[1].Endpoints[0].Host != "127.0.0.2" || loc[1].Endpoints[0].Port != 9000 {
		t.Fatalf("localities = %+v", loc)
	}
	// Everything local again: the remote locality goes.
	table2 := &RouteTable{Source: RoutesFallback, Models: map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 1}}}}
	if err := f.reg.SetRoutes(t.Context(), table2); err != nil {
		t.Fatal(err)
	}
	st = <-f.push.pushed
	if len(st.Models[0].Localities) != 1 || st.Models[0].Localities[0].Weight != 1000 {
		t.Fatalf("after local routes: %+v", st.Models[0].Localities)
	}
}

// The syncer counts every plan by result and installs only valid, newer
// ones.
func TestSyncerCountsPlans(t *testing.T) {
	f := newRegFixture(t)
	s := newTestSyncer(DefaultConfig("b").Global, "b", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
	now := f.clock.Now()
	count := func(result string) float64 { return testutil.ToFloat64(f.m.plans.WithLabelValues(result)) }

	s.routes.applyPlan(t.Context(), testPlan(5, 3, now))
	if got := s.Routes(); got == nil || got.Epoch != 5 || got.Source != RoutesPlan {
		t.Fatalf("valid plan not installed: %+v", got)
	}
	bad := testPlan(5, 4, now)
	bad.Plans[0].Routes[0].Fraction = 0.5
	s.routes.applyPlan(t.Context(), bad)
	s.routes.applyPlan(t.Context(), testPlan(4, 9, now))
	expired := testPlan(6, 1, now)
	expired.ValidUntil = timestamppb.New(now.Add(-time.Second))
	s.routes.applyPlan(t.Context(), expired)
	if count("applied") != 1 || count("invalid") != 1 || count("stale") != 1 || count("expired") != 1 {
		t.Errorf("counters: applied %v invalid %v stale %v expired %v",
			count("applied"), count("invalid"), count("stale"), count("expired"))
	}
	if got := s.Routes(); got.Epoch != 5 || got.Sequence != 3 {
		t.Errorf("a refused plan replaced the table: %+v", got)
	}
}

// A plan that sends a model's whole demand elsewhere keeps the local cells
// as a lower priority, and the shed share reaches the xDS state.
func TestBuildStateAllRemoteAndShed(t *testing.T) {
	f := newRegFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	f.nextPush()
	table := &RouteTable{Source: RoutesPlan, Epoch: 1, Sequence: 1,
		Models:  map[string]ModelRoutes{"m": {Routes: map[string]float64{"r2": 0.8}, Shed: 0.2}},
		Ingress: map[string]string{"r2": "127.0.0.2:9000"}}
	if err := f.reg.SetRoutes(t.Context(), table); err != nil {
		t.Fatal(err)
	}
	st := <-f.push.pushed
	m := st.Models[0]
	if m.Shed != 0.2 || len(m.Localities) != 2 {
		t.Fatalf("model = %+v", m)
	}
	if l := m.Localities[0]; l.Region != "r1" || l.Priority != 1 || l.Weight != 1 {
		t.Errorf("local locality %+v, want priority 1 weight 1", l)
	}
	if l := m.Localities[1]; l.Region != "r2" || l.Priority != 0 || l.Weight != 800 {
		t.Errorf("remote locality %+v", l)
	}
}

// The fence holds through fallback: once the plan in force has expired and
// the region routes by itself, a plan of a lower epoch (an old leader come
// back) is still refused, and the plan the fence holds, replayed by the
// leader to the reconnecting region, is accepted again with the life it
// has left. A FileFence carries the fence into a restarted controller.
func TestPlanFenceSurvivesFallbackAndRestart(t *testing.T) {
	f := newRegFixture(t)
	path := t.TempDir() + "/fence.json"
	s := newTestSyncer(DefaultConfig("b").Global, "b", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
	if err := s.useFences(FileFence{Path: path}); err != nil {
		t.Fatal(err)
	}
	issued := f.clock.Now()
	s.routes.applyPlan(t.Context(), testPlan(5, 3, issued))
	if got := s.Routes(); got == nil || got.Epoch != 5 {
		t.Fatalf("plan not installed: %+v", got)
	}
	// The global goes away: the plan expires and the fallback takes over.
	f.clock.Advance(31 * time.Second)
	now := f.clock.Now()
	s.routes.install(t.Context(), s.planner.plan(now, &isobarpb.RegionSummary{Region: "b"}))
	if got := s.Routes(); got.Source == RoutesPlan {
		t.Fatalf("fallback not installed: %+v", got)
	}
	s.routes.applyPlan(t.Context(), testPlan(4, 9, now))
	if got := s.Routes(); got.Source == RoutesPlan {
		t.Fatalf("a lower epoch was accepted after fallback: %+v", got)
	}
	if n := testutil.ToFloat64(f.m.plans.WithLabelValues("stale")); n != 1 {
		t.Fatalf("stale plans counted %v, want 1", n)
	}

	// A restarted controller (a new syncer on the same fence file) refuses
	// it too, and accepts the leader's next plan.
	s2 := newTestSyncer(DefaultConfig("b").Global, "b", f.reg, syncDeps{Clock: f.clock, Metrics: f.m})
	if err := s2.useFences(FileFence{Path: path}); err != nil {
		t.Fatal(err)
	}
	s2.routes.applyPlan(t.Context(), testPlan(4, 10, now))
	if got := s2.Routes(); got != nil {
		t.Fatalf("a lower epoch was accepted after a restart: %+v", got)
	}
	// The fenced plan itself, replayed: accepted with its remaining life
	// (issued 20 s ago, sent now, 30 s maximum age: 10 s left), not a fresh
	// 30 s.
	replay := testPlan(5, 3, now.Add(-20*time.Second))
	replay.SentAt = timestamppb.New(now)
	s2.routes.applyPlan(t.Context(), replay)
	got := s2.Routes()
	if got == nil || got.Epoch != 5 || got.Sequence != 3 {
		t.Fatalf("the fenced plan's replay was refused: %+v", got)
	}
	if want := now.Add(10 * time.Second); !got.ValidUntil.Equal(want) {
		t.Fatalf("replayed plan valid until %v, want %v (its remaining life)", got.ValidUntil, want)
	}
	s2.routes.applyPlan(t.Context(), testPlan(6, 1, now))
	if got := s2.Routes(); got.Epoch != 6 {
		t.Fatalf("newer epoch refused: %+v", got)
	}
	if fe, err := (FileFence{Path: path}).LoadFence(); err != nil || fe != (Fence{Epoch: 6, Sequence: 1}) {
		t.Fatalf("saved fence = %+v, %v; want epoch 6 sequence 1", fe, err)
	}
}

// A plan replayed long after it was issued (the leader could not write a
// new one to etcd for minutes, and replays its last to a reconnecting
// region) gets only the life it has left on its issue time, never a fresh
// maximum age: measured on the leader's clock from its send stamp, so clock
// skew does not matter, or, from a leader that does not stamp sends, on
// the region's clock with the skew allowance.
func TestReplayedPlanGetsRemainingLife(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const skew = 5 * time.Second
	cases := []struct {
		name    string
		issued  time.Duration // leader's clock at issue, from now
		sent    *time.Duration
		want    time.Duration // from now; 0: expired
		wantErr error
	}{
		{"fresh", 0, dur(0), 30 * time.Second, nil},
		{"replayed 20 s later", -20 * time.Second, dur(0), 10 * time.Second, nil},
		{"replayed after 5 minutes", -5 * time.Minute, dur(0), 0, ErrExpiredPlan},
		{"leader an hour behind, replayed 20 s later", -time.Hour - 20*time.Second, dur(-time.Hour), 10 * time.Second, nil},
		{"leader an hour ahead, fresh", time.Hour, dur(time.Hour), 30 * time.Second, nil},
		{"sent before issued", 0, dur(-time.Second), 0, ErrInvalidPlan},
		{"no send stamp, fresh", 0, nil, 30 * time.Second, nil},
		{"no send stamp, replayed 20 s later", -20 * time.Second, nil, 10*time.Second + skew, nil},
		{"no send stamp, replayed after 5 minutes", -5 * time.Minute, nil, 0, ErrExpiredPlan},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan(5, 3, now.Add(tc.issued))
			p.SentAt = nil
			if tc.sent != nil {
				p.SentAt = timestamppb.New(now.Add(*tc.sent))
			}
			tbl, err := planTable(p, "b", nil, false, now, skew)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("planTable = %v, want %v", err, tc.wantErr)
			}
			if err == nil && !tbl.ValidUntil.Equal(now.Add(tc.want)) {
				t.Fatalf("valid until %v from now, want %v", tbl.ValidUntil.Sub(now), tc.want)
			}
		})
	}
}

func dur(d time.Duration) *time.Duration { return &d }

// stillGossip is a gossiper with no peers: enough for New to build a
// syncer.
type stillGossip struct{}

func (stillGossip) SetLocalSummary(*isobarpb.RegionSummary) error { return nil }
func (stillGossip) Summaries() map[string]gossip.PeerSummary      { return nil }
func (stillGossip) RTT() map[string]time.Duration                 { return nil }

// A controller with a state directory keeps its plan fence there: one
// started on the directory of a predecessor that applied epoch 5 refuses
// epoch 4, with no PlanFence dependency given.
func TestStateDirKeepsPlanFence(t *testing.T) {
	dir := t.TempDir()
	if err := (FileFence{Path: filepath.Join(dir, planFenceFile)}).SaveFence(Fence{Epoch: 5, Sequence: 3}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("b")
	cfg.HTTPListen = "-"
	cfg.WarmStart.StateDir = dir
	c, err := New(cfg, Deps{Registerer: prometheus.NewRegistry(), Gossip: stillGossip{}})
	if err != nil {
		t.Fatal(err)
	}
	c.syncer.routes.applyPlan(t.Context(), testPlan(4, 9, c.syncer.clock.Now()))
	if got := c.syncer.Routes(); got != nil {
		t.Fatalf("a controller on its predecessor's state dir accepted a lower epoch: %+v", got)
	}
}

// TestSameRoutingPushesNothing: a plan arrives every summary interval
// with a new epoch, sequence and validity; only a table that changes the
// routing (routes, shed, pinned routes, ingress) is urgent and pushes,
// and a blind shed, which the push orders by the measured demand, pushes
// with every table as before.
func TestSameRoutingPushesNothing(t *testing.T) {
	r, clk := bareRegistry(t, slog.DiscardHandler)
	table := func(seq uint64, r2 float64, shed float64, sliced bool) *RouteTable {
		return &RouteTable{Source: RoutesPlan, Epoch: 1, Sequence: seq, IssuedAt: clk.Now(), ValidUntil: clk.Now().Add(time.Duration(seq) * time.Second),
			Models: map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 1 - r2 - shed, "r2": r2}, Shed: shed, Sliced: sliced,
				Pinned: map[string]PinnedRoutes{"r1": {Routes: map[string]float64{"r1": 1}}}}},
			Ingress: map[string]string{"r2": "127.0.0.2:9000"}}
	}
	install := func(tb *RouteTable) bool {
		urgent := r.apply(message{routes: tb})
		pushed := r.routesNew
		r.routesNew = false // as offerIfDue does when it pushes
		if urgent != pushed {
			t.Fatalf("urgent %v but routesNew %v: an urgent table must be pushed, and only an urgent one", urgent, pushed)
		}
		return urgent
	}
	moved := table(4, 0.25, 0, true)
	moved.Ingress = map[string]string{"r2": "127.0.0.3:9000"}
	pinned := table(5, 0.25, 0, true)
	pinned.Models["m"].Pinned["r1"] = PinnedRoutes{Routes: map[string]float64{"r1": 0.5}, Shed: 0.5}
	for _, step := range []struct {
		what  string
		table *RouteTable
		push  bool
	}{
		{"the first table", table(1, 0.25, 0, true), true},
		{"the same routing, a new sequence and validity", table(2, 0.25, 0, true), false},
		{"a route moves", table(3, 0.3, 0, true), true},
		{"the same again", table(4, 0.3, 0, true), false},
		{"an ingress moves", moved, true},
		{"a pinned slice's routes change", pinned, true},
		{"a sliced shed", table(6, 0.25, 0.1, true), true},
		{"the same sliced shed", table(7, 0.25, 0.1, true), false},
		{"a blind shed", table(8, 0.25, 0.1, false), true},
		{"the same blind shed: ordered by the demand at the push, so pushed", table(9, 0.25, 0.1, false), true},
	} {
		if got := install(step.table); got != step.push {
			t.Errorf("%s: pushed %v, want %v", step.what, got, step.push)
		}
		if r.routes != step.table {
			t.Errorf("%s: the table was not kept (validity and fence are the new table's)", step.what)
		}
	}
	// With residency sets, the remote regions' ingress comes from gossip,
	// not the table: one that moved is pushed with the next table.
	ingress := map[string]string{"r2": "127.0.0.2:9000"}
	r.sets = func(string) []cycle.Set { return nil }
	r.regionIngress = func() map[string]string { return maps.Clone(ingress) }
	r.sentIngress = maps.Clone(ingress) // as the last offer left it
	if install(table(10, 0.25, 0, true)); install(table(11, 0.25, 0, true)) {
		t.Error("the same routing and ingress pushed")
	}
	ingress["r3"] = "127.0.0.3:9000" // a region came back
	if !install(table(12, 0.25, 0, true)) {
		t.Error("an ingress that came back did not push")
	}
}
