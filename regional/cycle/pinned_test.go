package cycle

import (
	"slices"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// pinTestSets: "home" allows the local region r1 and r3; "away" allows
// r2 and r3, not r1; "none" allows nothing (a combined set with no region
// in common).
func pinTestSets(string) []Set {
	return []Set{
		{Name: "away", Regions: []string{"r2", "r3"}},
		{Name: "home", Regions: []string{"r1", "r3"}},
		{Name: "none"},
	}
}

func pinTestViews() []*CellView {
	return ptrs([]CellView{{ID: "a", Endpoint: "10.0.0.1:8000", Model: "m", State: lifecycle.Ready,
		Weight: projection.Weight{Published: 100}}})
}

// every region has an ingress; r4 is the nearest and allowed by no set.
var pinTestIngress = map[string]string{"r2": "10.2.0.1:443", "r3": "10.3.0.1:443", "r4": "10.4.0.1:443"}

var pinTestRTTs = map[string]time.Duration{"r2": 30 * time.Millisecond, "r3": 20 * time.Millisecond, "r4": time.Millisecond}

func pinnedOf(t *testing.T, st xds.State, set string) xds.Pinned {
	t.Helper()
	for _, p := range st.Models[0].Pinned {
		if p.Set == set {
			return p
		}
	}
	t.Fatalf("set %s missing from %+v", set, st.Models[0].Pinned)
	return xds.Pinned{}
}

func regionsOf(p xds.Pinned) []string {
	var out []string
	for _, l := range p.Localities {
		out = append(out, l.Region)
	}
	return out
}

// Under every route source a pinned set's localities are in its regions
// only: a plan's slice (even one naming a disallowed region, filtered
// again), a plan without a slice for the set, the gossip fallback (routes
// with ingress addresses but no slices) and no routes at all. Unpinned
// traffic still goes wherever the routes say.
func TestPinnedLocalitiesStayInTheirRegions(t *testing.T) {
	planned := &Routes{Ingress: pinTestIngress, Models: map[string]ModelRoutes{"m": {
		Routes: map[string]float64{"r1": 0.5, "r4": 0.5}, Shed: 0.1, ShedCritical: 0, ShedSheddable: 0.4,
		Pinned: map[string]SetRoutes{
			"r1,r3": {Routes: map[string]float64{"r1": 0.25, "r3": 0.75}, ShedSheddable: 0.3},
			// A plan that slipped through breaking residency: r4 is
			// dropped here too.
			"r2,r3": {Routes: map[string]float64{"r2": 0.5, "r4": 0.5}},
		},
	}}}
	noR2 := &Routes{Ingress: map[string]string{"r3": "10.3.0.1:443", "r4": "10.4.0.1:443"}, Models: map[string]ModelRoutes{"m": {
		Routes: map[string]float64{"r1": 1}, Pinned: map[string]SetRoutes{"r2,r3": {Routes: map[string]float64{"r2": 1}}},
	}}}
	fallback := &Routes{Ingress: pinTestIngress, Models: map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 0.6, "r4": 0.4}}}}
	cases := []struct {
		name             string
		routes           *Routes
		views            []*CellView
		home, away, none []string
		gossip           map[string]string
	}{
		{"plan with slices", planned, pinTestViews(), []string{"r1", "r3"}, []string{"r2"}, nil, nil},
		{"plan slice to a region with no ingress: the nearest allowed", noR2, pinTestViews(), []string{"r1"}, []string{"r3"}, nil, nil},
		{"gossip fallback: local if allowed, else the nearest allowed", fallback, pinTestViews(), []string{"r1"}, []string{"r3"}, nil, nil},
		{"no routes: local if allowed, nothing else known", nil, pinTestViews(), []string{"r1"}, nil, nil, nil},
		{"no local cell: the nearest allowed", fallback, nil, []string{"r3"}, []string{"r3"}, nil, nil},
		// No plan yet, but gossip names the other regions' ingresses: a
		// set that does not allow the local region goes to the nearest
		// allowed one (r3), never to r4, nearer but not allowed.
		{"no routes, gossip ingresses: the nearest allowed", nil, pinTestViews(), []string{"r1"}, []string{"r3"}, nil, pinTestIngress},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Params{Region: "r1", Zone: "z", Routes: tc.routes, RTTs: pinTestRTTs, Sets: pinTestSets,
				Kept: map[string]bool{"m": true}, Ingress: tc.gossip}
			st := BuildState(p, tc.views).State
			if len(st.Models) != 1 || len(st.Models[0].Pinned) != 3 {
				t.Fatalf("state %+v", st.Models)
			}
			for _, pin := range st.Models[0].Pinned {
				for _, l := range pin.Localities {
					if !slices.Contains(pin.Regions, l.Region) {
						t.Errorf("set %s (%v) has a locality in %s", pin.Set, pin.Regions, l.Region)
					}
				}
			}
			for set, want := range map[string][]string{"home": tc.home, "away": tc.away, "none": tc.none} {
				if got := regionsOf(pinnedOf(t, st, set)); !slices.Equal(got, want) {
					t.Errorf("set %s localities in %v, want %v", set, got, want)
				}
			}
		})
	}
}

// A plan's shed shares reach the model (per criticality) and each pinned
// set; the local share of a pinned slice weights the local locality; the
// retry budget is the model's.
func TestPinnedShedAndBudget(t *testing.T) {
	routes := &Routes{Ingress: pinTestIngress, Models: map[string]ModelRoutes{"m": {
		Routes: map[string]float64{"r1": 1}, Shed: 0.1, ShedCritical: 0.01, ShedSheddable: 0.5,
		Pinned: map[string]SetRoutes{"r1,r3": {Routes: map[string]float64{"r1": 0.25, "r3": 0.5}, Shed: 0.25, ShedSheddable: 0.9}},
	}}}
	p := Params{Region: "r1", Zone: "z", Routes: routes, RTTs: pinTestRTTs, Sets: pinTestSets,
		RetryBudget: map[string]float64{"m": 7}}
	m := BuildState(p, pinTestViews()).State.Models[0]
	if m.Shed != 0.1 || m.ShedCritical != 0.01 || m.ShedSheddable != 0.5 || m.RetryBudgetPercent != 7 {
		t.Fatalf("model shed %v/%v/%v budget %v", m.ShedCritical, m.Shed, m.ShedSheddable, m.RetryBudgetPercent)
	}
	home := pinnedOf(t, BuildState(p, pinTestViews()).State, "home")
	if home.Shed != 0.25 || home.ShedSheddable != 0.9 || home.ShedCritical != 0 {
		t.Errorf("home shed %+v", home)
	}
	if len(home.Localities) != 2 || home.Localities[0].Weight != 250 || home.Localities[1].Weight != 500 ||
		home.Localities[0].Priority != 0 || len(home.Localities[0].Endpoints) != 1 {
		t.Errorf("home localities %+v", home.Localities)
	}
	// The model's own local locality is untouched by the copy.
	if l := m.Localities[0]; l.Weight != LocalityScale || l.Region != "r1" {
		t.Errorf("model locality %+v", l)
	}
	// Without sets nothing is pinned.
	p.Sets = nil
	if m := BuildState(p, pinTestViews()).State.Models[0]; m.Pinned != nil {
		t.Errorf("pinned without sets: %+v", m.Pinned)
	}
}

// A model pinned as a whole (its own set) gets its set's localities in its
// main cluster too: a request reaching it without a residency header
// cannot leave the set, whatever the unpinned routes say.
func TestOwnSetPinsTheModel(t *testing.T) {
	routes := &Routes{Ingress: pinTestIngress, Models: map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 0.5, "r4": 0.5}}}}
	sets := func(string) []Set { return []Set{{Name: "away", Regions: []string{"r2", "r3"}, Own: true}} }
	p := Params{Region: "r1", Zone: "z", Routes: routes, RTTs: pinTestRTTs, Sets: sets}
	m := BuildState(p, pinTestViews()).State.Models[0]
	var got []string
	for _, l := range m.Localities {
		got = append(got, l.Region)
	}
	if !slices.Equal(got, []string{"r3"}) || !slices.Equal(regionsOf(m.Pinned[0]), []string{"r3"}) {
		t.Fatalf("main cluster in %v, pinned in %v; want r3 for both", got, regionsOf(m.Pinned[0]))
	}
}
