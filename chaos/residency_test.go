package chaos

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/adminapi"
)

// fleetWith is a fleet of regions a, b and eu (cells per region), the
// tenant counts given per region (a region absent from counts is down).
func fleetWith(counts map[string]map[string]int64) *adminapi.FleetState {
	s := &adminapi.FleetState{Pinned: map[string][]string{"acme-eu": {"eu"}}}
	for _, name := range []string{"a", "b", "eu"} {
		rs := adminapi.RegionState{Name: name, Up: true}
		for i := range 3 {
			rs.Cells = append(rs.Cells, adminapi.CellState{ID: name + "-cell-" + string(rune('0'+i)), State: "ready"})
		}
		c, ok := counts[name]
		if !ok {
			rs = adminapi.RegionState{Name: name}
		}
		rs.TenantRequests = c
		s.Regions = append(s.Regions, rs)
	}
	s.Globals = []adminapi.GlobalState{{Name: "g0", Up: true, Leader: true}}
	return s
}

// TestPinnedOutside: the engines' counters outside the allowed regions,
// differenced between two readings; the allowed regions' own counts, other
// tenants and a region down at the second reading do not count, and a
// region down at the first counts from 0.
func TestPinnedOutside(t *testing.T) {
	before := fleetWith(map[string]map[string]int64{"a": {"acme-eu": 4, "other": 9}, "eu": {"acme-eu": 100}})
	after := fleetWith(map[string]map[string]int64{"a": {"acme-eu": 4, "other": 20}, "b": {"acme-eu": 2}, "eu": {"acme-eu": 300}})
	if n := pinnedOutside(before, after, "acme-eu", []string{"eu"}); n != 2 {
		t.Errorf("pinned outside %d, want 2 (b's, counted from 0 as it was down)", n)
	}
	if n := pinnedOutside(before, before, "acme-eu", []string{"eu"}); n != 0 {
		t.Errorf("no change: %d, want 0", n)
	}
	leak := fleetWith(map[string]map[string]int64{"a": {"acme-eu": 7, "other": 20}, "eu": {"acme-eu": 300}})
	if n := pinnedOutside(before, leak, "acme-eu", []string{"eu"}); n != 3 {
		t.Errorf("a leak of 3 in a: %d, want 3", n)
	}
	if n := pinnedOutside(before, nil, "acme-eu", []string{"eu"}); n != 0 {
		t.Errorf("no reading: %d, want 0", n)
	}
	if n := pinnedOutside(before, leak, "acme-eu", []string{"a", "eu"}); n != 0 {
		t.Errorf("a allowed: %d, want 0", n)
	}
}

// TestMeasureResidency: requests are counted in the stage they started
// in; a pinned request refused 503 naming residency is refused, one that
// failed otherwise after the stage's reroute is misanswered; unpinned
// requests of the pinned regions' clients served elsewhere spilled; a
// pinned request answered from outside is seen.
func TestMeasureResidency(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	windows := []stageWindow{
		{start: at(0), healAt: at(5), end: at(6)},
		{start: at(6), rerouteAt: at(8), healAt: at(12), end: at(15)},
	}
	res := &ResidencyReport{Tenant: "acme-eu", Allowed: []string{"eu"}, Stages: []ResidencyStage{{Name: StageOverload}, {Name: StageRegionLoss}}}
	pinned := func(s float64, ok bool, status int, msg, region string) Outcome {
		return Outcome{Start: at(s), End: at(s + 0.1), OK: ok, Status: status, Error: msg, Tenant: "acme-eu", Home: "eu", Region: region}
	}
	os := []Outcome{
		pinned(-1, true, 200, "", "eu"), // before the stages
		pinned(1, true, 200, "", "eu"),
		{Start: at(2), OK: true, Status: 200, Home: "eu", Region: "a"}, // spilled
		{Start: at(2.5), OK: true, Status: 200, Home: "a", Region: "a"},
		pinned(7, false, 503, "upstream connect error", ""),                                // before the reroute: failed, not misanswered
		pinned(9, false, 503, "no capacity left in residency set eu (tenant acme-eu)", ""), // refused
		pinned(10, false, 429, "saturated", ""),                                            // misanswered
		pinned(12.5, false, 502, "bad gateway", ""),                                        // after the heal: failed, not misanswered
		{Start: at(9), OK: true, Status: 200, Home: "eu", Ingress: "a", Region: "a"},
		{Start: at(9.5), Status: 503, Home: "a"},
		pinned(13, true, 200, "", "b"), // answered from outside
	}
	measureResidency(res, windows, os)
	ov, loss := res.Stages[0], res.Stages[1]
	if ov.Pinned != 1 || ov.PinnedOK != 1 || ov.Unpinned != 2 || ov.UnpinnedOK != 2 || ov.Spilled != 1 {
		t.Errorf("overload %+v: want 1 pinned served, 2 unpinned served, 1 spilled", ov)
	}
	if loss.Pinned != 5 || loss.PinnedOK != 1 || loss.PinnedRefused != 1 || loss.PinnedFailed != 3 || loss.Misanswered != 1 {
		t.Errorf("region loss %+v: want 5 pinned: 1 served, 1 refused, 3 failed otherwise, 1 misanswered", loss)
	}
	if loss.Unpinned != 2 || loss.UnpinnedOK != 1 || loss.UnpinnedSuccess == nil || *loss.UnpinnedSuccess != 0.5 || loss.Spilled != 1 {
		t.Errorf("region loss unpinned %+v: want 1 of 2 served, spilled", loss)
	}
	if res.PinnedServedOutsideSeen != 1 {
		t.Errorf("answered from outside %d, want 1", res.PinnedServedOutsideSeen)
	}
	rep := &Report{}
	residencyChecks(rep, res)
	if len(rep.Failures) != 2 || !strings.Contains(rep.Failures[0], "answered from a region outside") || !strings.Contains(rep.Failures[1], "503 naming residency") {
		t.Errorf("failures %q: want the answer from outside and the misanswered one", rep.Failures)
	}
	res.PinnedOutside, res.Stages[1].UnpinnedOK = 3, 0
	rep = &Report{}
	residencyChecks(rep, res)
	if !slices.ContainsFunc(rep.Failures, func(f string) bool {
		return strings.HasPrefix(f, "3 requests of tenant acme-eu reached engines outside")
	}) ||
		!slices.ContainsFunc(rep.Failures, func(f string) bool { return strings.Contains(f, "no unpinned request succeeded") }) {
		t.Errorf("failures %q: want the counters' leak and no unpinned success", rep.Failures)
	}
}

// TestPlanResidency: the drill needs a tenant pinned to part of the
// fleet; its stages overload (all but one cell of each pinned region),
// lose and lose under a blackout the pinned regions; its load names the
// tenant and overloads the pinned regions' clients unless told otherwise.
func TestPlanResidency(t *testing.T) {
	d, err := Lookup("residency")
	if err != nil {
		t.Fatal(err)
	}
	s := fleetWith(map[string]map[string]int64{"a": nil, "b": nil, "eu": nil})
	s.Faults = adminapi.FaultKinds()
	if why := d.Available(s); why != "" {
		t.Fatalf("available: %s", why)
	}
	none := *s
	none.Pinned = nil
	if why := d.Available(&none); !strings.Contains(why, "residency config") {
		t.Errorf("no pin: %q, want it to ask for a residency config", why)
	}
	everywhere := *s
	everywhere.Pinned = map[string][]string{"acme-eu": {"a", "b", "eu"}}
	if why := d.Available(&everywhere); why == "" {
		t.Errorf("a tenant pinned to every region: available, want refused")
	}
	if why := pinnedAvailable(Params{Tenant: "zeta"}, s); !strings.Contains(why, "zeta") {
		t.Errorf("unknown tenant: %q", why)
	}
	tg := &target{epochs: map[string]uint64{}}
	if err := d.plan(Params{}, s, tg); err != nil {
		t.Fatal(err)
	}
	if tg.pin.tenant != "acme-eu" || !slices.Equal(tg.regions, []string{"eu"}) || len(tg.stages) != 3 {
		t.Fatalf("target %+v", tg)
	}
	want := [][]adminapi.Fault{
		{{Kind: adminapi.FaultKillEngine, Region: "eu", Cells: []int{0, 1}}},
		{{Kind: adminapi.FaultKillRegion, Region: "eu"}},
		{{Kind: adminapi.FaultKillRegion, Region: "eu"}, {Kind: adminapi.FaultKillLeader}, {Kind: adminapi.FaultEtcdDown}},
	}
	for i, sg := range tg.stages {
		if sg.name != []string{StageOverload, StageRegionLoss, StageStalePlan}[i] || len(sg.faults) != len(want[i]) {
			t.Fatalf("stage %d %s: faults %v, want %v", i, sg.name, sg.faults, want[i])
		}
		for j, f := range sg.faults {
			if f.String() != want[i][j].String() {
				t.Errorf("stage %s fault %d: %s, want %s", sg.name, j, f, want[i][j])
			}
		}
	}
	if spills(tg, s) {
		t.Errorf("a plan with no shares spills")
	}
	eu, _ := s.Region("eu")
	eu.Shares = map[string]float64{"eu": 1}
	if spills(tg, s) {
		t.Errorf("a plan keeping eu's demand home spills")
	}
	eu.Shares = map[string]float64{"eu": 0.8, "a": 0.2}
	if !spills(tg, s) {
		t.Errorf("a plan sending 0.2 of eu's demand to a does not spill")
	}
	lc := LoadConfig{RPS: 8}
	residencyLoad(&lc, tg)
	if lc.Tenants["acme-eu"] != residencyTenantShare || lc.RegionRPS["eu"] != 40 || len(lc.RegionRPS) != 1 {
		t.Errorf("load %+v: want a share naming acme-eu and eu at 5x", lc)
	}
	lc = LoadConfig{Tenants: map[string]float64{"acme-eu": 1}, RegionRPS: map[string]float64{"a": 3}}
	residencyLoad(&lc, tg)
	if lc.Tenants["acme-eu"] != 1 || lc.RegionRPS["a"] != 3 || len(lc.RegionRPS) != 1 {
		t.Errorf("load %+v: the caller's tenants and rates must stand", lc)
	}
}

// The region-loss stage is rerouted only when no other region's data plane
// sends anything to the lost regions: its main cluster, and each
// residency set's pinned cluster (a set with no plan slice falls back to
// the nearest allowed ingress, the lost one, until the plan says
// otherwise).
func TestRegionsAvoidedCountsPinnedClusters(t *testing.T) {
	s := fleetWith(map[string]map[string]int64{"a": {}, "b": {}})
	tg := &target{regions: []string{"eu"}}
	if !regionsAvoided(tg, s) {
		t.Fatal("nothing routes to eu, yet not avoided")
	}
	s.Regions[0].PinnedRegions = map[string][]string{"eu": {"eu"}}
	if regionsAvoided(tg, s) {
		t.Fatal("a's pinned cluster still sends set eu to the lost region, yet avoided")
	}
	s.Regions[0].PinnedRegions = map[string][]string{"eu": nil}
	s.Regions[1].Endpoints = []adminapi.EndpointState{{Cell: "eu-ingress", Region: "eu"}}
	if regionsAvoided(tg, s) {
		t.Fatal("b's main cluster still holds the lost region, yet avoided")
	}
}
