package regional

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/residency"
)

// The residency tests' fleet: this region r1, peers r2, r3 and r4. Set
// "home" allows r1 and r3, "away" r2 and r3; r4, the nearest peer, is
// allowed by neither.
const residencyTestConfig = `{"sets": {"home": ["r1", "r3"], "away": ["r2", "r3"]}, "tenants": {"t-home": "home", "t-away": "away"}}`

func residencyTestFixture(t *testing.T) (*regFixture, *syncer) {
	t.Helper()
	rc, err := residency.Parse([]byte(residencyTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, func(c *Config) {
		c.Residency, c.FleetRegions = rc, []string{"r2", "r3", "r4"}
	}, func(r *Registry) { r.regionRTT = peerGossip{}.RTT })
	s := newTestSyncer(f.reg.cfg.Global, "r1", f.reg, syncDeps{Gossip: peerGossip{clock: f.clock.Now}, Clock: f.clock, Metrics: f.m})
	return f, s
}

// peerGossip reports r2, r3 and r4 alive and fresh (at clock()), each
// with an ingress address and model m; r4 is the nearest.
type peerGossip struct{ clock func() time.Time }

func (peerGossip) SetLocalSummary(*isobarpb.RegionSummary) error { return nil }

func (g peerGossip) Summaries() map[string]gossip.PeerSummary {
	out := map[string]gossip.PeerSummary{}
	for i, r := range []string{"r2", "r3", "r4"} {
		out[r] = gossip.PeerSummary{Alive: true, ReceivedAt: g.clock(), Summary: &isobarpb.RegionSummary{
			Region: r, IngressAddress: "127.0.0." + string(rune('2'+i)) + ":9000",
			Models: []*isobarpb.ModelSummary{{Model: "m", CapacityRps: 100, CellsReady: 4}},
		}}
	}
	return out
}

func (peerGossip) RTT() map[string]time.Duration {
	return map[string]time.Duration{"r2": 30 * time.Millisecond, "r3": 20 * time.Millisecond, "r4": time.Millisecond}
}

// residencyPlan routes unpinned demand half to r4, the "away" slice to
// r2 and the "home" slice half home, half to r3; with breakAway, the
// "away" slice sends a share to r4.
func residencyPlan(epoch uint64, now time.Time, breakAway bool) *isobarpb.RoutingPlan {
	p := testPlan(epoch, 1, now)
	p.Ingress = []*isobarpb.RegionIngress{
		{Region: "r2", Address: "127.0.0.2:9000"}, {Region: "r3", Address: "127.0.0.3:9000"}, {Region: "r4", Address: "127.0.0.4:9000"}}
	away := []*isobarpb.Route{{Destination: "r2", Fraction: 1}}
	if breakAway {
		away = []*isobarpb.Route{{Destination: "r2", Fraction: 0.5}, {Destination: "r4", Fraction: 0.5}}
	}
	p.Plans = []*isobarpb.ModelPlan{{
		Model: "m", IngressRegion: "r1",
		Routes: []*isobarpb.Route{{Destination: "r1", Fraction: 0.5}, {Destination: "r4", Fraction: 0.5}},
		Slices: []*isobarpb.SlicePlan{
			{Criticality: isobarpb.Criticality_CRITICALITY_SHEDDABLE, Routes: []*isobarpb.Route{{Destination: "r1", Fraction: 0.6}}, Shed: 0.4},
			{Criticality: isobarpb.Criticality_CRITICALITY_STANDARD, AllowedRegions: []string{"r2", "r3"}, Routes: away},
			{Criticality: isobarpb.Criticality_CRITICALITY_STANDARD, AllowedRegions: []string{"r1", "r3"},
				Routes: []*isobarpb.Route{{Destination: "r1", Fraction: 0.5}, {Destination: "r3", Fraction: 0.5}}},
		},
	}}
	return p
}

// checkResidency fails the test when a pinned set of st has a locality
// outside its regions, and returns the regions of each set's localities.
func checkResidency(t *testing.T, st xds.State) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, m := range st.Models {
		for _, p := range m.Pinned {
			for _, l := range p.Localities {
				if !slices.Contains(p.Regions, l.Region) {
					t.Errorf("model %s set %s (%v): locality in %s", m.Name, p.Set, p.Regions, l.Region)
				}
				out[p.Set] = append(out[p.Set], l.Region)
			}
		}
	}
	return out
}

// awaitState reads pushes until one satisfies cond.
func (f *regFixture) awaitState(what string, cond func(xds.State) bool) xds.State {
	f.t.Helper()
	for {
		select {
		case st := <-f.push.pushed:
			if cond(st) {
				return st
			}
		case <-time.After(5 * time.Second):
			f.t.Fatalf("no xDS push with %s", what)
			return xds.State{}
		}
	}
}

func pinnedIn(set string, regions ...string) func(xds.State) bool {
	return func(st xds.State) bool {
		for _, m := range st.Models {
			for _, p := range m.Pinned {
				if p.Set == set {
					var got []string
					for _, l := range p.Localities {
						got = append(got, l.Region)
					}
					return slices.Equal(got, regions)
				}
			}
		}
		return false
	}
}

// Residency holds on every route source: no plan yet, a plan, a plan that
// breaks residency (refused, counted, the last good one kept), the plan
// expired with the region on its gossip fallback, and a controller that
// never had a plan and routes on gossip alone. The pushed state never has
// a pinned locality outside its set, though r4 is the nearest peer and
// takes unpinned traffic.
func TestResidencyUnderEveryRouteSource(t *testing.T) {
	f, s := residencyTestFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	// No plan, no fallback yet: home is local, away has nowhere to go.
	st := f.awaitState("pinned sets", func(st xds.State) bool { return len(st.Models) == 1 && len(st.Models[0].Pinned) == 2 })
	if got := checkResidency(t, st); !slices.Equal(got["home"], []string{"r1"}) || len(got["away"]) != 0 {
		t.Fatalf("no routes: pinned %v", got)
	}

	now := f.clock.Now()
	s.routes.applyPlan(t.Context(), residencyPlan(5, now, false))
	st = f.awaitState("the plan's pinned routes", pinnedIn("away", "r2"))
	checkResidency(t, st)
	if m := st.Models[0]; m.ShedSheddable != 0.4 || len(m.Localities) != 2 || m.Localities[1].Region != "r4" {
		t.Fatalf("unpinned: %+v", m)
	}

	s.routes.applyPlan(t.Context(), residencyPlan(6, now, true))
	if n := testutil.ToFloat64(f.m.plans.WithLabelValues("residency")); n != 1 {
		t.Fatalf("plans refused for residency: %v, want 1", n)
	}
	if got := s.Routes(); got.Epoch != 5 || !slices.Equal(mapKeys(got.Models["m"].Pinned["r2,r3"].Routes), []string{"r2"}) {
		t.Fatalf("the refused plan replaced the last good one: %+v", got)
	}

	// The global goes away: the plan expires (30 s; the cell keeps
	// heartbeating) and the gossip fallback takes over; away goes to the
	// nearest region it allows (r3), not to r4.
	for range 62 {
		f.clock.Advance(500 * time.Millisecond)
		f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	}
	now = f.clock.Now()
	if s.routes.planInForce(now) {
		t.Fatal("the plan is still in force")
	}
	s.routes.install(t.Context(), s.planner.plan(now, s.summary.build(now)))
	st = f.awaitState("the fallback's pinned routes", pinnedIn("away", "r3"))
	if got := checkResidency(t, st); !slices.Equal(got["home"], []string{"r1"}) {
		t.Fatalf("fallback: pinned %v", got)
	}
	if s.Routes().Source != RoutesFallback {
		t.Fatalf("source %s, want fallback", s.Routes().Source)
	}
}

// A controller that never had a plan routes pinned sets on gossip alone.
func TestResidencyOnGossipAlone(t *testing.T) {
	f, s := residencyTestFixture(t)
	f.send(heartbeat("a", "127.0.0.1:1001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 0))
	now := f.clock.Now()
	s.routes.install(t.Context(), s.planner.plan(now, s.summary.build(now)))
	st := f.awaitState("gossip pinned routes", pinnedIn("away", "r3"))
	if got := checkResidency(t, st); !slices.Equal(got["home"], []string{"r1"}) {
		t.Fatalf("gossip alone: pinned %v", got)
	}
}

func mapKeys(m map[string]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Plan slices are validated: criticality, allowed regions sorted and
// valid, each (criticality, regions) once, routes summing to 1, and a
// pinned slice routing outside its regions breaks residency.
func TestPlanSlices(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	good, err := planTable(residencyPlan(5, now, false), "r1", nil, false, now, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mr := good.Models["m"]
	if mr.Shed != 0 || mr.ShedSheddable != 0.4 || mr.Pinned["r2,r3"].Routes["r2"] != 1 || mr.Pinned["r1,r3"].Routes["r3"] != 0.5 {
		t.Fatalf("table %+v", mr)
	}
	slice := func(p *isobarpb.RoutingPlan) *isobarpb.SlicePlan { return p.Plans[0].Slices[1] }
	for _, tc := range []struct {
		name string
		mut  func(*isobarpb.RoutingPlan)
		want error
	}{
		{"routes outside", func(p *isobarpb.RoutingPlan) { slice(p).Routes[0].Destination = "r4" }, ErrResidencyPlan},
		{"routes home, not allowed", func(p *isobarpb.RoutingPlan) { slice(p).Routes[0].Destination = "r1" }, ErrResidencyPlan},
		{"unknown criticality", func(p *isobarpb.RoutingPlan) { slice(p).Criticality = 9 }, ErrInvalidPlan},
		{"unsorted regions", func(p *isobarpb.RoutingPlan) { slice(p).AllowedRegions = []string{"r3", "r2"} }, ErrInvalidPlan},
		{"bad region", func(p *isobarpb.RoutingPlan) { slice(p).AllowedRegions = []string{"r 2", "r3"} }, ErrInvalidPlan},
		{"twice", func(p *isobarpb.RoutingPlan) { p.Plans[0].Slices = append(p.Plans[0].Slices, slice(p)) }, ErrInvalidPlan},
		{"sum 0.5", func(p *isobarpb.RoutingPlan) { slice(p).Routes[0].Fraction = 0.5 }, ErrInvalidPlan},
		{"NaN shed", func(p *isobarpb.RoutingPlan) { slice(p).Shed = math.NaN() }, ErrInvalidPlan},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := residencyPlan(5, now, false)
			tc.mut(p)
			_, err := planTable(p, "r1", nil, false, now, 5*time.Second)
			if !errors.Is(err, tc.want) {
				t.Fatalf("planTable = %v, want %v", err, tc.want)
			}
			if wantRes := errors.Is(tc.want, ErrResidencyPlan); (planResult(err) == "residency") != wantRes {
				t.Fatalf("result %q for %v", planResult(err), err)
			}
		})
	}
}

// A residency config naming a region outside the fleet refuses to start.
func TestResidencyConfigValidated(t *testing.T) {
	rc, err := residency.Parse([]byte(residencyTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("r1")
	cfg.Residency, cfg.FleetRegions = rc, []string{"r2", "r3"}
	if err := cfg.validate(); err != nil {
		t.Fatalf("valid fleet refused: %v", err)
	}
	cfg.FleetRegions = []string{"r2", "r33"}
	if err := cfg.validate(); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, residency.ErrInvalid) {
		t.Fatalf("validate = %v, want ErrInvalidConfig and residency.ErrInvalid", err)
	}
	cfg.FleetRegions = []string{"bad region"}
	if err := cfg.validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("validate = %v, want ErrInvalidConfig", err)
	}
}

// Without --fleet-regions, the regions the config names that no gossip
// peer or plan has shown are counted; once seen they stay seen.
func TestResidencyUnseenRegions(t *testing.T) {
	rc, err := residency.Parse([]byte(residencyTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := newRegFixture(t)
	w := newResidencyWatch(rc, "r1", nil, f.m)
	gauge := func() float64 { return testutil.ToFloat64(f.m.residencyUnseen) }
	if w.observe(nil, nil); gauge() != 2 {
		t.Fatalf("unseen %v, want 2 (r2, r3)", gauge())
	}
	if w.observe([]string{"r2"}, nil); gauge() != 1 {
		t.Fatalf("unseen %v after gossip from r2, want 1", gauge())
	}
	if w.observe(nil, &RouteTable{Ingress: map[string]string{"r3": "127.0.0.3:9000"}}); gauge() != 0 {
		t.Fatalf("unseen %v after a plan naming r3, want 0", gauge())
	}
	w = newResidencyWatch(rc, "r1", []string{"r2", "r3"}, f.m)
	if w.observe(nil, nil); gauge() != 0 {
		t.Fatalf("unseen %v with the fleet listed, want 0", gauge())
	}
}

// A restarted controller's first push (warm start: model m2 kept with no
// cell back) carries the pinned sets of every model, kept ones included,
// and none outside their regions.
func TestWarmRestartKeepsPinnedSets(t *testing.T) {
	dir := t.TempDir()
	servedBefore(t, dir)
	rc, err := residency.Parse([]byte(residencyTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := newLimitedFixture(t, func(c *Config) { c.WarmStart.StateDir, c.Residency = dir, rc })
	start, hold := f.clock.Now(), f.reg.cfg.WarmStart.hold(f.reg.cfg.TTL())
	var first xds.State
	for got := false; !got; {
		f.send(modelHB("a", "127.0.0.1:1001", "m"))
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
	got := checkResidency(t, first)
	if len(first.Models) != 2 || len(first.Models[1].Pinned) != 2 || !slices.Equal(got["home"], []string{"r1"}) || len(got["away"]) != 0 {
		t.Fatalf("first push: models %v, pinned %v", models(first), got)
	}
}

// On the gossip fallback an overloaded region spills pinned demand only
// to the regions its set allows (home: r3), while unpinned demand may go
// to the nearest peer (r4); a set that does not allow this region is left
// to the cycle's nearest-allowed rule.
func TestFallbackSpillsPinnedOnlyWithinTheSet(t *testing.T) {
	f, s := residencyTestFixture(t)
	self := &isobarpb.RegionSummary{Region: "r1", Models: []*isobarpb.ModelSummary{{Model: "m", DemandRps: 100, CapacityRps: 10, CellsReady: 1}}}
	tbl := s.planner.plan(f.clock.Now(), self)
	mr := tbl.Models["m"]
	if tbl.Source != RoutesFallback || mr.Routes["r4"] == 0 {
		t.Fatalf("unpinned fallback %+v from %s: want a spill to r4", mr.Routes, tbl.Source)
	}
	home, ok := mr.Pinned["r1,r3"]
	if !ok || home.Routes["r3"] == 0 {
		t.Fatalf("home on fallback: %+v, want a spill to r3", mr.Pinned)
	}
	for d, fr := range home.Routes {
		if fr > 0 && d != "r1" && d != "r3" {
			t.Fatalf("home spills to %s", d)
		}
	}
	if _, ok := mr.Pinned["r2,r3"]; ok {
		t.Fatalf("away planned on r1's fallback: %+v", mr.Pinned)
	}
}
