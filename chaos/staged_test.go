package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/adminapi"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// stagedFleet is a hand-written fleet of regions a and eu (eu pinned for
// acme-eu) whose state follows the faults injected: kill-engine makes the
// plan spill eu's demand to a, kill-region takes eu down (the leader
// knows at once), kill-leader leaves no leader. Its engines' acme-eu
// counters rise in region a by leak[stage] while the stage's faults are
// in; it checks that each heal undoes a fault it injected, last first.
type stagedFleet struct {
	t       *testing.T
	ingress string
	leak    map[adminapi.FaultKind]int64

	mu       sync.Mutex
	injected []adminapi.Fault
	count    int64 // acme-eu requests at region a's engines
	// epoch is the plans' epoch: a leader's heal elects a new leader,
	// whose plans carry the next one (as the lab's election does).
	epoch uint64
}

func (f *stagedFleet) State(context.Context) (*adminapi.FleetState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	has := func(k adminapi.FaultKind) bool {
		return slices.ContainsFunc(f.injected, func(x adminapi.Fault) bool { return x.Kind == k })
	}
	for _, x := range f.injected {
		f.count += f.leak[x.Kind]
	}
	s := &adminapi.FleetState{Model: "m", Faults: adminapi.FaultKinds(), Etcd: "up", Pinned: map[string][]string{"acme-eu": {"eu"}}}
	g := adminapi.GlobalState{Name: "g0", Up: true, Leader: !has(adminapi.FaultKillLeader), Live: map[string]bool{"a": true, "eu": !has(adminapi.FaultKillRegion)}}
	s.Globals = []adminapi.GlobalState{g}
	for _, name := range []string{"a", "eu"} {
		rs := adminapi.RegionState{Name: name, Ingress: f.ingress, Up: true, RouteSource: "plan", PlanEpoch: f.epoch, Shares: map[string]float64{name: 1}}
		if name == "eu" && has(adminapi.FaultKillRegion) {
			s.Regions = append(s.Regions, adminapi.RegionState{Name: name, Ingress: f.ingress})
			continue
		}
		for i := range 3 {
			id := fmt.Sprintf("%s-cell-%d", name, i)
			rs.Cells = append(rs.Cells, adminapi.CellState{ID: id, State: "ready"})
			rs.Endpoints = append(rs.Endpoints, adminapi.EndpointState{Cell: id, Region: name})
		}
		if name == "eu" && has(adminapi.FaultKillEngine) {
			rs.Shares = map[string]float64{"eu": 0.7, "a": 0.3}
		}
		if name == "a" {
			rs.TenantRequests = map[string]int64{"acme-eu": f.count}
		}
		s.Regions = append(s.Regions, rs)
	}
	return s, nil
}

func (f *stagedFleet) Inject(_ context.Context, x adminapi.Fault) (adminapi.InjectResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.injected = append(f.injected, x)
	return adminapi.InjectResult{Fault: x}, nil
}

func (f *stagedFleet) Heal(_ context.Context, x adminapi.Fault) (adminapi.InjectResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.injected); n == 0 || f.injected[n-1].String() != x.String() {
		f.t.Errorf("heal %s: the last fault in is %v", x, f.injected)
		return adminapi.InjectResult{}, fmt.Errorf("not the last fault in")
	}
	f.injected = f.injected[:len(f.injected)-1]
	if x.Kind == adminapi.FaultKillLeader {
		f.epoch++
	}
	return adminapi.InjectResult{Fault: x}, nil
}

// TestRunStagedResidency runs the residency drill against stagedFleet:
// the three stages go in and are healed in turn, each stage's pinned
// counter rise is its own, the drill fails naming the leak, and requests
// of every stage are measured.
func TestRunStagedResidency(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(xdscontract.RegionHeader, "eu")
		fmt.Fprint(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	fleet := &stagedFleet{t: t, ingress: strings.TrimPrefix(srv.URL, "http://"), leak: map[adminapi.FaultKind]int64{adminapi.FaultEtcdDown: 1}}
	d, err := Lookup("residency")
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	o := Options{Before: 50 * ms, During: 50 * ms, After: 50 * ms, MaxWait: 5 * time.Second, Settle: 5 * time.Second, Poll: ms,
		Load: LoadConfig{RPS: 200, MaxTokens: 1}}
	rep, err := (&Runner{Fleet: fleet}).Run(context.Background(), d, Params{}, o)
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Residency
	if res == nil || len(res.Stages) != 3 {
		t.Fatalf("residency %+v: want 3 stages", res)
	}
	if len(fleet.injected) != 0 || len(rep.Faults) != 5 {
		t.Errorf("faults left in %v, injected %v: want all 5 injected and healed", fleet.injected, rep.Faults)
	}
	for i, sg := range res.Stages {
		if want := []string{StageOverload, StageRegionLoss, StageStalePlan}[i]; sg.Name != want || sg.Pinned+sg.Unpinned == 0 {
			t.Errorf("stage %d: %+v, want %s with requests", i, sg, want)
		}
		if (sg.PinnedOutside > 0) != (sg.Name == StageStalePlan) {
			t.Errorf("stage %s: pinned outside %d, want a rise in the stale-plan stage only", sg.Name, sg.PinnedOutside)
		}
	}
	if res.PinnedOutside != fleet.count || res.PinnedOutside == 0 || rep.Passed {
		t.Errorf("pinned outside %d (fleet counted %d), passed %v: want the whole rise and a failure", res.PinnedOutside, fleet.count, rep.Passed)
	}
	if !slices.ContainsFunc(rep.Failures, func(f string) bool { return strings.Contains(f, "reached engines outside [eu]") }) {
		t.Errorf("failures %q: want the leak named", rep.Failures)
	}
	if rep.DetectMS == nil || rep.RerouteAtMS == nil || rep.Success.After == nil {
		t.Errorf("detect %v reroute %v success after %v: want the region-loss figures and the after phase", rep.DetectMS, rep.RerouteAtMS, rep.Success.After)
	}
}

// TestNewLeadersPlans: after a stage that stopped the leader, a healthy
// fleet is not yet recovered while a region routes on the old leader's
// plan.
func TestNewLeadersPlans(t *testing.T) {
	state := func(epochs ...uint64) *adminapi.FleetState {
		s := &adminapi.FleetState{Etcd: "up"}
		for i, e := range epochs {
			s.Regions = append(s.Regions, adminapi.RegionState{Name: fmt.Sprintf("r%d", i), Up: true, RouteSource: "plan", PlanEpoch: e})
		}
		return s
	}
	why := newLeadersPlans(state(3, 3))
	if got := why(state(4, 3)); !strings.Contains(got, "region r1 routes on a plan of epoch 3") {
		t.Errorf("r1 still on epoch 3: %q", got)
	}
	if got := why(state(4, 5)); got != "" {
		t.Errorf("both on the new leader's plans: %q", got)
	}
	unhealthy := state(4, 5)
	unhealthy.Etcd = "down"
	if got := why(unhealthy); got != "etcd is down" {
		t.Errorf("etcd down: %q", got)
	}
}
