package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isobar-mesh/isobar/adminapi"
)

// The residency drill (issue 25): a tenant pinned to a set of regions
// (the fleet's residency config, FleetState.Pinned) keeps every request
// inside the set through an overload of the set, its loss, and its loss
// under a stale plan while the global pair and etcd are down. What the
// drill counts is where the pinned tenant's requests reached an engine,
// from the engines' own per-tenant counters (RegionState.TenantRequests),
// read before and after: a gateway's answer could hide a request it
// forwarded.

// Stage names of the residency drill, in order.
const (
	StageOverload   = "overload"
	StageRegionLoss = "region-loss"
	StageStalePlan  = "stale-plan"
)

// residencyTenantShare and residencyOverload are the drill's default
// load: the share of each region's requests that name the pinned tenant,
// and the pinned regions' clients' rate as a multiple of the others'.
const (
	residencyTenantShare = 0.3
	residencyOverload    = 5
)

// pin is the tenant a residency drill follows and the regions it may be
// served in.
type pin struct {
	tenant  string
	allowed []string
}

// stage is one step of a staged drill: faults injected together, held
// until detected and rerouted (when the stage says how to see it) and
// for Options.During, then healed, the fleet healthy again before the
// next.
type stage struct {
	name     string
	faults   []adminapi.Fault
	detected func(t *target, s *adminapi.FleetState) bool
	rerouted func(t *target, s *adminapi.FleetState) bool
	// wait, when set, bounds the wait for detected and rerouted instead
	// of Options.MaxWait (what the stage waits for may not come).
	wait time.Duration
	// detects says what detected sees ("" : the drill's Detects).
	detects string
	// hold: once detected, the stage stays in for Options.During more
	// (the requests that follow meet what was detected).
	hold bool
}

// overloadWait bounds the overload stage's wait for a plan that spills:
// in the fast lab the plan spills some 8 s after the cells die (the
// demand's smoothing and the plan's hysteresis).
const overloadWait = 20 * time.Second

// spills: a plan sends part of a pinned region's demand to a region
// outside the pinned set (the overload was seen by the global plan).
func spills(t *target, s *adminapi.FleetState) bool {
	for _, name := range t.regions {
		r, ok := s.Region(name)
		if !ok {
			continue
		}
		for dst, f := range r.Shares {
			if f > 0 && !slices.Contains(t.regions, dst) {
				return true
			}
		}
	}
	return false
}

// ResidencyReport is the residency drill's figures.
type ResidencyReport struct {
	Tenant  string   `json:"tenant"`
	Allowed []string `json:"allowed_regions"`
	// PinnedOutside counts the tenant's requests that reached an engine
	// outside Allowed from the start of the load to its end, from the
	// engines' counters. The drill fails unless it is 0.
	PinnedOutside int64 `json:"pinned_outside"`
	// PinnedServedOutsideSeen counts the tenant's successful requests
	// whose answer named a serving region outside Allowed: the clients'
	// view of the same, which must be 0 too.
	PinnedServedOutsideSeen int              `json:"pinned_served_outside_seen"`
	Stages                  []ResidencyStage `json:"stages"`
}

// ResidencyStage is one stage: its faults, the pinned tenant's requests
// that reached engines outside the allowed regions during it (counters
// read at its injection and once the fleet was healthy again), and the
// requests started in it (from the injection to the fleet healthy again).
type ResidencyStage struct {
	Name          string           `json:"name"`
	Faults        []adminapi.Fault `json:"faults"`
	PinnedOutside int64            `json:"pinned_outside"`
	// Pinned requests: served, refused with a 503 naming residency (no
	// capacity left in the allowed regions, not spilled), failed
	// otherwise; Misanswered are those started once the stage's reroute
	// was seen (the leader knew the allowed regions were gone) and before
	// its heal that failed other than with a 503 naming residency.
	Pinned        int `json:"pinned"`
	PinnedOK      int `json:"pinned_ok"`
	PinnedRefused int `json:"pinned_refused"`
	PinnedFailed  int `json:"pinned_failed_otherwise"`
	Misanswered   int `json:"pinned_misanswered"`
	// Unpinned requests and their success; Spilled are the unpinned
	// requests of the allowed regions' clients served outside them.
	Unpinned        int      `json:"unpinned"`
	UnpinnedOK      int      `json:"unpinned_ok"`
	UnpinnedSuccess *float64 `json:"unpinned_success"`
	Spilled         int      `json:"unpinned_spilled"`
}

// stageWindow is when a stage ran: injected at start, rerouted at
// rerouteAt (zero: not seen or not measured), healed at healAt, the
// fleet healthy again at end.
type stageWindow struct {
	start, rerouteAt, healAt, end time.Time
}

// findPin picks the pinned tenant of a fleet: want when given, else the
// first (sorted) pinned to a non-empty strict subset of the regions. It
// says why none fits ("" when one does).
func findPin(want string, s *adminapi.FleetState) (pin, string) {
	for _, t := range s.PinnedTenants() {
		allowed := s.Pinned[t]
		if want != "" && t != want {
			continue
		}
		outside := slices.ContainsFunc(s.Regions, func(r adminapi.RegionState) bool { return !slices.Contains(allowed, r.Name) })
		if len(allowed) > 0 && outside {
			return pin{tenant: t, allowed: slices.Clone(allowed)}, ""
		}
	}
	if want != "" {
		return pin{}, fmt.Sprintf("tenant %q is not pinned to a part of the fleet's regions (pinned: %v)", want, s.Pinned)
	}
	return pin{}, "the fleet pins no tenant to a part of its regions: start it with a residency config (isobar lab --residency FILE; chaos run residency --lab does)"
}

// pinnedAvailable is the residency drill's requirement of the fleet.
func pinnedAvailable(p Params, s *adminapi.FleetState) string {
	_, why := findPin(p.Tenant, s)
	return why
}

// planResidency plans the three stages against the pinned regions.
func planResidency(p Params, s *adminapi.FleetState, t *target) error {
	pn, why := findPin(p.Tenant, s)
	if why != "" {
		return fmt.Errorf("%w: %s", ErrUnavailable, why)
	}
	if _, ok := s.Leader(); !ok {
		return fmt.Errorf("%w: the fleet has no global leader to take down", ErrUnavailable)
	}
	t.pin, t.regions = &pn, pn.allowed
	var overload, loss []adminapi.Fault
	for _, name := range pn.allowed {
		r, _ := s.Region(name)
		if n := len(r.Cells); n > 1 {
			// All but one cell: the region's capacity falls under its
			// clients' (raised) demand.
			cells := make([]int, n-1)
			for i := range cells {
				cells[i] = i
			}
			overload = append(overload, adminapi.Fault{Kind: adminapi.FaultKillEngine, Region: name, Cells: cells})
		}
		loss = append(loss, adminapi.Fault{Kind: adminapi.FaultKillRegion, Region: name})
	}
	// The regions go first, the leader and etcd within milliseconds: the
	// pair is down before any member can see the regions' loss (region
	// TTL), so every region keeps routing on a plan that still lists
	// them. The heal runs in reverse: etcd and the leader come back
	// before the regions, whose restart needs etcd.
	blackout := append(slices.Clone(loss), adminapi.Fault{Kind: adminapi.FaultKillLeader}, adminapi.Fault{Kind: adminapi.FaultEtcdDown})
	t.stages = []stage{
		{name: StageOverload, faults: overload, detected: spills, wait: overloadWait, hold: true,
			detects: "a plan sends part of the pinned regions' demand elsewhere"},
		{name: StageRegionLoss, faults: loss, detected: regionsDown, rerouted: regionsAvoided},
		{name: StageStalePlan, faults: blackout, detected: noLeader, detects: "no member of the global pair leads"},
	}
	for _, sg := range t.stages {
		t.faults = append(t.faults, sg.faults...)
	}
	return nil
}

// residencyLoad completes the drill's load: unless the caller set them,
// residencyTenantShare of every region's requests name the pinned tenant
// and the pinned regions' clients send residencyOverload times the rate.
func residencyLoad(lc *LoadConfig, t *target) {
	if len(lc.Tenants) == 0 {
		lc.Tenants = map[string]float64{t.pin.tenant: residencyTenantShare}
	}
	if len(lc.RegionRPS) == 0 {
		base := lc.RPS
		if base == 0 {
			base = 5
		}
		lc.RegionRPS = map[string]float64{}
		for _, r := range t.pin.allowed {
			lc.RegionRPS[r] = residencyOverload * base
		}
	}
}

// tenantCount is the tenant's requests counted by region name's engines
// in s (ok false when s does not show the region up).
func tenantCount(s *adminapi.FleetState, name, tenant string) (int64, bool) {
	if s == nil {
		return 0, false
	}
	r, ok := s.Region(name)
	if !ok || !r.Up {
		return 0, false
	}
	return r.TenantRequests[tenant], true
}

// pinnedOutside counts the tenant's requests that reached engines outside
// allowed between two readings of the fleet: per region outside, the rise
// of its engines' counter (a region down at the first reading counts
// from 0; one down at the second is not read).
func pinnedOutside(before, after *adminapi.FleetState, tenant string, allowed []string) int64 {
	if after == nil {
		return 0
	}
	var n int64
	for _, r := range after.Regions {
		if slices.Contains(allowed, r.Name) {
			continue
		}
		a, ok := tenantCount(after, r.Name, tenant)
		if !ok {
			continue
		}
		b, _ := tenantCount(before, r.Name, tenant)
		n += max(0, a-b)
	}
	return n
}

// namesResidency reports whether a failed request was refused for
// residency: a 503 whose answer names the constraint.
func namesResidency(o Outcome) bool {
	return o.Status == http.StatusServiceUnavailable && strings.Contains(strings.ToLower(o.Error), "residency")
}

// measureResidency fills each stage's request figures from the outcomes
// (by start time within the stage's window) and the clients' view of
// pinned requests served outside.
func measureResidency(res *ResidencyReport, windows []stageWindow, os []Outcome) {
	for _, o := range os {
		if o.Tenant == res.Tenant && o.OK && o.Region != "" && !slices.Contains(res.Allowed, o.Region) {
			res.PinnedServedOutsideSeen++
		}
		for i, w := range windows {
			if i >= len(res.Stages) || o.Start.Before(w.start) || !o.Start.Before(w.end) {
				continue
			}
			noteStage(&res.Stages[i], w, o, res.Tenant, res.Allowed)
		}
	}
	for i := range res.Stages {
		if sg := &res.Stages[i]; sg.Unpinned > 0 {
			sg.UnpinnedSuccess = fptr(float64(sg.UnpinnedOK) / float64(sg.Unpinned))
		}
	}
}

// noteStage counts one request started in stage window w.
func noteStage(sg *ResidencyStage, w stageWindow, o Outcome, tenant string, allowed []string) {
	if o.Tenant != tenant {
		sg.Unpinned++
		if o.OK {
			sg.UnpinnedOK++
			if slices.Contains(allowed, o.Home) && o.Region != "" && !slices.Contains(allowed, o.Region) {
				sg.Spilled++
			}
		}
		return
	}
	sg.Pinned++
	switch {
	case o.OK:
		sg.PinnedOK++
	case namesResidency(o):
		sg.PinnedRefused++
	default:
		sg.PinnedFailed++
		if !w.rerouteAt.IsZero() && !o.Start.Before(w.rerouteAt) && o.Start.Before(w.healAt) {
			sg.Misanswered++
		}
	}
}

// residencyChecks appends the drill's failures: any pinned request
// outside the allowed regions (engines' counters or answers), no unpinned
// request served while the pinned regions were lost, a pinned request
// answered other than 503 naming residency once the loss was known.
func residencyChecks(rep *Report, res *ResidencyReport) {
	if res.PinnedOutside > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d requests of tenant %s reached engines outside %v (the engines' counters), want 0",
			res.PinnedOutside, res.Tenant, res.Allowed))
	}
	if res.PinnedServedOutsideSeen > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d requests of tenant %s were answered from a region outside %v, want 0",
			res.PinnedServedOutsideSeen, res.Tenant, res.Allowed))
	}
	for _, sg := range res.Stages {
		if sg.PinnedOutside > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: %d pinned requests reached engines outside %v", sg.Name, sg.PinnedOutside, res.Allowed))
		}
		if sg.Name == StageRegionLoss && sg.UnpinnedOK == 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: no unpinned request succeeded (of %d) while %v were down", sg.Name, sg.Unpinned, res.Allowed))
		}
		if sg.Misanswered > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: %d pinned requests failed other than with a 503 naming residency once the loss was known",
				sg.Name, sg.Misanswered))
		}
	}
}

// runStaged runs a staged drill from the injection on: each stage in
// turn (inject, hold, heal, healthy again), then After, then the
// measures. start is the fleet read before the load began.
func (r *Runner) runStaged(ctx context.Context, d *Drill, t *target, o Options, load *Load, rep *Report, start *adminapi.FleetState) (*Report, error) {
	clock := r.clock()
	res := &ResidencyReport{Tenant: t.pin.tenant, Allowed: t.pin.allowed}
	var windows []stageWindow
	healthy := true
	for _, sg := range t.stages {
		w, ok, err := r.runStage(ctx, d, t, sg, o, load, rep, res)
		if err != nil {
			return nil, err
		}
		windows = append(windows, w)
		if !ok {
			healthy = false
			break
		}
	}
	last := windows[len(windows)-1]
	var recovered time.Time
	if healthy {
		recovered = last.end
		rep.HealedMS = durMS(last.end.Sub(last.healAt))
		if !r.wait(ctx, o, load, o.After, "after") {
			return nil, ctx.Err()
		}
	}
	end := clock.Now()
	outcomes, shed := load.Stop()
	final, err := r.Fleet.State(ctx)
	if err != nil {
		rep.Failures = append(rep.Failures, "reading the engines' counters at the end: "+err.Error())
	}
	res.PinnedOutside = pinnedOutside(start, final, res.Tenant, res.Allowed)
	r.measure(rep, d, t, outcomes, marks{t0: rep.InjectedAt, t1: last.healAt, recovered: recovered, end: end,
		windowEnd: rep.InjectedAt.Add(minRerouteWindow)})
	rep.Requests.ClientShed = shed
	measureResidency(res, windows, outcomes)
	rep.Residency = res
	residencyChecks(rep, res)
	r.finish(o, d, rep, nil)
	return rep, nil
}

// runStage runs one stage and reads the pinned counters around it; ok is
// false when the fleet was not healthy again after its heal (a failure in
// rep).
func (r *Runner) runStage(ctx context.Context, d *Drill, t *target, sg stage, o Options, load *Load, rep *Report,
	res *ResidencyReport) (stageWindow, bool, error) {
	clock := r.clock()
	st := *t
	st.faults = sg.faults
	before, err := r.Fleet.State(ctx)
	if err != nil {
		return stageWindow{}, false, err
	}
	w := stageWindow{start: clock.Now()}
	r.say(o, "  stage %s", sg.name)
	applied, err := r.inject(ctx, d, &st, o, rep)
	if err != nil {
		return stageWindow{}, false, err
	}
	rep.Faults = append(rep.Faults, applied...)
	sd := &Drill{Name: sg.name, Detects: d.Detects, Reroutes: d.Reroutes, detected: sg.detected, rerouted: sg.rerouted}
	if sg.detects != "" {
		sd.Detects = sg.detects
	}
	so := o
	if sg.wait > 0 {
		so.MaxWait = sg.wait
	}
	ob, err := r.observe(ctx, sd, &st, so, load, w.start)
	if err != nil {
		r.heal(context.WithoutCancel(ctx), o, applied, rep)
		return stageWindow{}, false, err
	}
	if !ob.rerouteAt.IsZero() {
		// Hold the stage past the reroute: the requests that follow it
		// meet a fleet that knows.
		w.rerouteAt = ob.rerouteAt
		rep.DetectMS, rep.RerouteAtMS = durMS(ob.detectAt.Sub(w.start)), durMS(ob.rerouteAt.Sub(w.start))
		if !r.wait(ctx, o, load, o.During, sg.name) {
			return stageWindow{}, false, ctx.Err()
		}
	} else if sg.rerouted != nil {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%s: not rerouted within %v (%s)", sg.name, max(o.During, o.MaxWait), d.Reroutes))
	} else if sg.hold && !ob.detectAt.IsZero() && !r.wait(ctx, o, load, o.During, sg.name) {
		return stageWindow{}, false, ctx.Err()
	}
	w.healAt = clock.Now()
	r.heal(ctx, o, applied, rep)
	if killsLeader(applied) {
		_, err = r.waitUntil(ctx, o, newLeadersPlans(before))
	} else {
		_, err = r.waitHealthy(ctx, o)
	}
	w.end = clock.Now()
	if err != nil {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%s: not healthy after the heal: %v", sg.name, err))
	}
	after, _ := r.Fleet.State(ctx)
	res.Stages = append(res.Stages, ResidencyStage{Name: sg.name, Faults: applied,
		PinnedOutside: pinnedOutside(before, after, res.Tenant, res.Allowed)})
	return w, err == nil, nil
}

// killsLeader reports whether faults stop the global leader.
func killsLeader(faults []adminapi.Fault) bool {
	return slices.ContainsFunc(faults, func(f adminapi.Fault) bool { return f.Kind == adminapi.FaultKillLeader })
}

// newLeadersPlans is healthy after a stage that stopped the leader: the
// fleet is healthy and every region routes on a plan of a leader elected
// since before (a later epoch). A region still on the old leader's plan
// passes Unhealthy (it routes on "a plan") while that plan may predate
// the region's own return, and the next requests would meet it.
func newLeadersPlans(before *adminapi.FleetState) func(*adminapi.FleetState) string {
	return func(st *adminapi.FleetState) string {
		if why := st.Unhealthy(); why != "" {
			return why
		}
		for _, rs := range st.Regions {
			if old, ok := before.Region(rs.Name); ok && rs.PlanEpoch <= old.PlanEpoch {
				return fmt.Sprintf("region %s routes on a plan of epoch %d, not yet one of the new leader's", rs.Name, rs.PlanEpoch)
			}
		}
		return ""
	}
}

// writeResidency writes the residency drill's figures under the table:
// per stage, the pinned requests outside (counters), the pinned requests
// served, refused and failed otherwise, and the unpinned success and
// spill.
func writeResidency(w io.Writer, res *ResidencyReport) {
	fmt.Fprintf(w, "residency: tenant %s pinned to %v: pinned_outside %d (engines' counters), answered from outside %d\n",
		res.Tenant, res.Allowed, res.PinnedOutside, res.PinnedServedOutsideSeen)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  STAGE\tPINNED OUTSIDE\tPINNED ok/refused-503/failed\tMISANSWERED\tUNPINNED SUCCESS\tSPILLED")
	for _, sg := range res.Stages {
		fmt.Fprintf(tw, "  %s\t%d\t%d/%d/%d\t%d\t%s (%d)\t%d\n", sg.Name, sg.PinnedOutside, sg.PinnedOK, sg.PinnedRefused, sg.PinnedFailed,
			sg.Misanswered, fmtFrac(sg.UnpinnedSuccess), sg.Unpinned, sg.Spilled)
	}
	_ = tw.Flush()
}
