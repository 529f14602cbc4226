package chaos

import (
	"github.com/isobar-mesh/isobar/adminapi"

	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Params choose a drill's target and size. Zero fields take the drill's
// defaults: the last region (the lab's first hosts the global pair), cell
// 0, one region plus the leader for correlated, 20 ms delay and 5 ms
// jitter, severity 0.8, max_model_len 1024.
type Params struct {
	Region      string   `json:"region,omitempty"`
	Regions     []string `json:"regions,omitempty"`
	Cells       []int    `json:"cells,omitempty"`
	Count       int      `json:"count,omitempty"`
	NoLeader    bool     `json:"no_leader,omitempty"`
	DelayMS     float64  `json:"delay_ms,omitempty"`
	JitterMS    float64  `json:"jitter_ms,omitempty"`
	Severity    float64  `json:"severity,omitempty"`
	MaxModelLen int      `json:"max_model_len,omitempty"`
	Silent      bool     `json:"silent,omitempty"`
	// StaggerMS spreads a restarted controller's agents' reconnects
	// (controller-* drills; default 2000, the agents' largest backoff;
	// negative: none).
	StaggerMS float64 `json:"stagger_ms,omitempty"`
	// Tenant is the pinned tenant the residency drill follows (default:
	// the first the fleet pins to a part of its regions).
	Tenant string `json:"tenant,omitempty"`
}

// target is a drill bound to a fleet: the faults to inject and what they
// hit, with the healthy state before.
type target struct {
	params  Params
	faults  []adminapi.Fault
	regions []string // regions the faults hit
	cells   []string // cell ids the faults hit
	before  *adminapi.FleetState
	leader  string // the leader before the drill
	epochs  map[string]uint64
	// pin and stages: a staged drill's pinned tenant and its stages.
	pin    *pin
	stages []stage
	// from is when the baseline window began: the load's start, or the
	// end of the drill's warm-up.
	from time.Time
}

// Drill is one kind of failure rehearsal.
type Drill struct {
	Name    string
	Summary string
	// Needs are the fault kinds the target's admin API must support.
	Needs []adminapi.FaultKind
	// Detects and Reroutes say what detect_ms and reroute_at_ms measure
	// ("" when the figure does not apply to this drill).
	Detects, Reroutes string
	plan              func(p Params, s *adminapi.FleetState, t *target) error
	detected          func(t *target, s *adminapi.FleetState) bool
	rerouted          func(t *target, s *adminapi.FleetState) bool
	leak              bool
	// during is how long the fault stays in when Options.During is not
	// set (a controller's few seconds away).
	during time.Duration
	// rolling: the faults go in one at a time, each healed and the fleet
	// healthy again before the next (a rolling restart).
	rolling bool
	// static: the drill checks static stability (restartChecks): no
	// request answered "no route", no region's data plane on fewer of its
	// cells than before, success during the drill at least
	// staticMinSuccess.
	static bool
	// baseline, when set, says what the drill still lacks to measure its
	// detection ("" when nothing): the runner waits for it, bounded by
	// Options.Settle, before it starts the load (a rise needs a baseline).
	baseline func(t *target, s *adminapi.FleetState) string
	// requires says what else the drill needs of the fleet beyond Needs
	// ("" when nothing is missing): the residency drill, a pinned tenant.
	requires func(p Params, s *adminapi.FleetState) string
	// staged: the drill runs t.stages in turn (runStaged) rather than one
	// injection; load completes the load config for the target.
	staged bool
	load   func(lc *LoadConfig, t *target)
	// warmup is how long the load runs before the baseline window opens,
	// for a drill whose load is not the fleet's usual one (the residency
	// drill sends its pinned regions 5 times the rate): the control plane
	// sees it (summaries, a plan) before the baseline is taken. Requests
	// started in it count in no phase.
	warmup time.Duration
}

// residencyWarmup is the residency drill's warm-up: a few summary and plan
// rounds (summaries every second by default).
const residencyWarmup = 3 * time.Second

// ErrUnavailable: the target cannot inject what the drill needs; nothing
// was run.
var ErrUnavailable = errors.New("chaos: drill not available on this target")

// ErrBadParams: the drill's parameters do not fit the fleet.
var ErrBadParams = errors.New("chaos: bad drill parameters")

// Available says why the drill cannot run against s ("" when it can).
func (d *Drill) Available(s *adminapi.FleetState) string {
	var missing []string
	for _, k := range d.Needs {
		if !s.Supports(k) {
			missing = append(missing, string(k))
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("%s needs fault injection %s, which this target's admin API does not offer (it offers %v)",
			d.Name, strings.Join(missing, ", "), s.Faults)
	}
	if d.requires != nil {
		if why := d.requires(Params{}, s); why != "" {
			return d.Name + ": " + why
		}
	}
	return ""
}

// Drills is the registry, in the order chaos list shows them.
func Drills() []*Drill {
	return []*Drill{
		{Name: "kill-cell", Summary: "SIGKILL one engine under load",
			Needs: []adminapi.FaultKind{adminapi.FaultKillEngine}, Detects: "controller marks the cell failed", Reroutes: "the cell leaves its region's data plane",
			plan: planCells(adminapi.FaultKillEngine), detected: cellsNot("ready"), rerouted: cellsGone},
		{Name: "silent-cell", Summary: "an agent stops heartbeating while its engine keeps serving",
			Needs: []adminapi.FaultKind{adminapi.FaultSilenceAgent}, Detects: "controller marks the cell failed (heartbeat TTL)", Reroutes: "the cell leaves its region's data plane",
			plan: planCells(adminapi.FaultSilenceAgent), detected: cellsNot("ready"), rerouted: cellsGone},
		{Name: "kill-region", Summary: "every cell, the regional controller and the ingress of one site at once",
			Needs: []adminapi.FaultKind{adminapi.FaultKillRegion}, Detects: "the global leader marks the region down (region TTL)", Reroutes: "the leader knows and no other region routes to it",
			plan: planRegions(false), detected: regionsDown, rerouted: regionsAvoided},
		{Name: "correlated", Summary: "N regions at once, with the global leader unless --no-leader",
			Needs: []adminapi.FaultKind{adminapi.FaultKillRegion}, Detects: "a leader marks every killed region down", Reroutes: "the leader knows and no surviving region routes to them",
			plan: planRegions(true), detected: regionsDown, rerouted: regionsAvoided},
		{Name: "partition", Summary: "a region cut off from the global pair, gossip and the other regions, still serving its own clients",
			Needs: []adminapi.FaultKind{adminapi.FaultPartition}, Detects: "the global leader marks the region down", Reroutes: "the leader knows and no other region routes to it",
			plan: planPartition, detected: regionsDown, rerouted: regionsAvoided},
		{Name: "brownout", Summary: "a fraction of a region's GPUs throttle thermally",
			Needs: []adminapi.FaultKind{adminapi.FaultThrottle}, Detects: "the throttled cells' pressure exceeds every healthy cell's", Reroutes: "the data plane holds them as DEGRADED (or weighted below every healthy cell)",
			plan: planCells(adminapi.FaultThrottle), detected: throttledPressure, rerouted: throttledWeight},
		{Name: "jitter", Summary: "added delay and jitter on every WAN path of one site",
			Needs: []adminapi.FaultKind{adminapi.FaultWANDelay}, Detects: "gossip RTT from the site rises by at least half the injected delay",
			plan: planDelay, detected: rttRaised, baseline: rttKnown},
		{Name: "telemetry-loss", Summary: "dcgm-exporters killed; scoring must fall back, no cell dropped",
			Needs: []adminapi.FaultKind{adminapi.FaultDCGMDown}, Detects: "every affected cell is scored on fallback telemetry",
			plan: planDCGM, detected: allFallback},
		{Name: "capability-mismatch", Summary: "a cell restarted with a small max_model_len",
			Needs: []adminapi.FaultKind{adminapi.FaultMaxModelLen}, Detects: "controller sees the new max_model_len", Reroutes: "the data plane's endpoint carries it",
			plan: planCells(adminapi.FaultMaxModelLen), detected: maxLenSeen(false), rerouted: maxLenSeen(true), leak: true},
		{Name: "leader-kill", Summary: "the global leader crashes (its etcd session ends without resigning)",
			Needs: []adminapi.FaultKind{adminapi.FaultKillLeader}, Detects: "another member leads", Reroutes: "every region routes on the new leader's plan",
			plan: planLeader, detected: newLeader, rerouted: newEpoch},
		{Name: "etcd-loss", Summary: "the etcd cluster stops; regions keep serving on the last plan",
			Needs: []adminapi.FaultKind{adminapi.FaultEtcdDown}, Detects: "the leader gives up leadership",
			plan: planEtcd, detected: noLeader},
		{Name: "controller-restart", Summary: "a regional controller restarts under load (down a few seconds); its cells reconnect with their own backoff",
			Needs: []adminapi.FaultKind{adminapi.FaultStopController}, Detects: "the region's controller is down",
			plan: planControllers(false, false), detected: controllersDown, during: restartDowntime, static: true},
		{Name: "controller-restart-blackout", Summary: "a regional controller restarts while the global pair and etcd are down",
			Needs:   []adminapi.FaultKind{adminapi.FaultStopController, adminapi.FaultKillLeader, adminapi.FaultEtcdDown},
			Detects: "the region's controller is down", plan: planControllers(false, true), detected: controllersDown,
			during: restartDowntime, static: true},
		{Name: "controller-rolling", Summary: "every regional controller restarted in turn, each back and healthy before the next",
			Needs: []adminapi.FaultKind{adminapi.FaultStopController}, Detects: "the first region's controller is down",
			plan: planControllers(true, false), detected: controllersDown, during: restartDowntime, rolling: true, static: true},
		{Name: "residency", Summary: "a tenant pinned to a region set: the set overloaded, then lost, then lost under a stale plan with the global leader and etcd down; none of its requests may reach an engine outside the set",
			Needs:   []adminapi.FaultKind{adminapi.FaultKillEngine, adminapi.FaultKillRegion, adminapi.FaultKillLeader, adminapi.FaultEtcdDown},
			Detects: "the global leader marks the pinned regions down (region-loss stage)", Reroutes: "the leader knows and no other region routes to them (region-loss stage)",
			plan: planResidency, requires: pinnedAvailable, staged: true, load: residencyLoad, warmup: residencyWarmup},
	}
}

// restartDowntime is how long a restart drill keeps a controller down by
// default: a rescheduled process's few seconds.
const restartDowntime = 4 * time.Second

// defaultStaggerMS spreads the restarted controller's agents over the
// agents' largest backoff (cellagent.DefaultBackoffMax): at fleet size
// they come back at scattered points of it, and the first back must not
// be pushed alone.
const defaultStaggerMS = 2000

// staticMinSuccess is the least success during a static-stability drill.
const staticMinSuccess = 0.999

// planControllers stops the regional controller of the region (default
// the last), or, rolling, of every region in turn. blackout first takes
// the global leader and etcd down, so the controller starts without
// them; they are healed after it (the heal runs in reverse order).
func planControllers(rolling, blackout bool) func(Params, *adminapi.FleetState, *target) error {
	return func(p Params, s *adminapi.FleetState, t *target) error {
		names := p.Regions
		if rolling && len(names) == 0 {
			for _, r := range s.Regions {
				names = append(names, r.Name)
			}
		}
		if len(names) == 0 {
			r, err := defaultRegion(p, s)
			if err != nil {
				return err
			}
			names = []string{r.Name}
		}
		if blackout {
			if _, ok := s.Leader(); !ok {
				return fmt.Errorf("%w: the fleet has no global leader to take down", ErrUnavailable)
			}
			t.faults = append(t.faults, adminapi.Fault{Kind: adminapi.FaultKillLeader}, adminapi.Fault{Kind: adminapi.FaultEtcdDown})
		}
		stagger := p.StaggerMS
		switch {
		case stagger == 0:
			stagger = defaultStaggerMS
		case stagger < 0:
			stagger = 0
		}
		for _, n := range names {
			if _, ok := s.Region(n); !ok {
				return fmt.Errorf("%w: no region %q", ErrBadParams, n)
			}
			t.faults = append(t.faults, adminapi.Fault{Kind: adminapi.FaultStopController, Region: n, StaggerMS: stagger})
		}
		t.regions = names
		return nil
	}
}

// controllersDown: the first target region's controller is down (a
// rolling drill's first step).
func controllersDown(t *target, s *adminapi.FleetState) bool {
	r, ok := s.Region(t.regions[0])
	return ok && r.ControllerDown
}

// Lookup returns the named drill.
func Lookup(name string) (*Drill, error) {
	var names []string
	for _, d := range Drills() {
		if d.Name == name {
			return d, nil
		}
		names = append(names, d.Name)
	}
	return nil, fmt.Errorf("chaos: no drill %q: want one of %s", name, strings.Join(names, ", "))
}

func defaultRegion(p Params, s *adminapi.FleetState) (*adminapi.RegionState, error) {
	name := p.Region
	if name == "" {
		if len(s.Regions) == 0 {
			return nil, fmt.Errorf("%w: the fleet has no regions", ErrBadParams)
		}
		name = s.Regions[len(s.Regions)-1].Name
	}
	r, ok := s.Region(name)
	if !ok {
		var have []string
		for _, r := range s.Regions {
			have = append(have, r.Name)
		}
		return nil, fmt.Errorf("%w: --region %q: the fleet has %s", ErrBadParams, name, strings.Join(have, ", "))
	}
	return r, nil
}

func planCells(kind adminapi.FaultKind) func(Params, *adminapi.FleetState, *target) error {
	return func(p Params, s *adminapi.FleetState, t *target) error {
		r, err := defaultRegion(p, s)
		if err != nil {
			return err
		}
		cells := p.Cells
		if len(cells) == 0 {
			cells = []int{0}
		}
		if len(cells) >= len(r.Cells) && kind != adminapi.FaultThrottle {
			return fmt.Errorf("%w: --cells %v would take every cell of %s: use kill-region", ErrBadParams, cells, r.Name)
		}
		for _, c := range cells {
			if c < 0 || c >= len(r.Cells) {
				return fmt.Errorf("%w: --cells: region %s has cells 0..%d", ErrBadParams, r.Name, len(r.Cells)-1)
			}
			t.cells = append(t.cells, r.Cells[c].ID)
		}
		f := adminapi.Fault{Kind: kind, Region: r.Name, Cells: cells}
		switch kind {
		case adminapi.FaultThrottle:
			f.Severity = p.Severity
			if f.Severity == 0 {
				f.Severity = 0.8
			}
		case adminapi.FaultMaxModelLen:
			f.MaxModelLen, f.Silent = p.MaxModelLen, p.Silent
			if f.MaxModelLen == 0 {
				f.MaxModelLen = 1024
			}
		}
		t.regions, t.faults = []string{r.Name}, []adminapi.Fault{f}
		return nil
	}
}

func planRegions(correlated bool) func(Params, *adminapi.FleetState, *target) error {
	return func(p Params, s *adminapi.FleetState, t *target) error {
		names := p.Regions
		if len(names) == 0 && p.Region != "" {
			names = []string{p.Region}
		}
		if len(names) == 0 {
			n := 1
			if correlated && p.Count > 0 {
				n = p.Count
			}
			for i := len(s.Regions) - n; i < len(s.Regions); i++ {
				if i >= 0 {
					names = append(names, s.Regions[i].Name)
				}
			}
		}
		if len(names) >= len(s.Regions) {
			return fmt.Errorf("%w: %d of %d regions down leaves nobody to reroute to", ErrBadParams, len(names), len(s.Regions))
		}
		for _, n := range names {
			if _, ok := s.Region(n); !ok {
				return fmt.Errorf("%w: no region %q", ErrBadParams, n)
			}
			t.faults = append(t.faults, adminapi.Fault{Kind: adminapi.FaultKillRegion, Region: n})
		}
		t.regions = names
		if correlated && !p.NoLeader {
			if !s.Supports(adminapi.FaultKillLeader) {
				return fmt.Errorf("%w: correlated with the leader needs kill-leader (or --no-leader)", ErrUnavailable)
			}
			t.faults = append(t.faults, adminapi.Fault{Kind: adminapi.FaultKillLeader})
		}
		return nil
	}
}

func planPartition(p Params, s *adminapi.FleetState, t *target) error {
	r, err := defaultRegion(p, s)
	if err != nil {
		return err
	}
	t.regions, t.faults = []string{r.Name}, []adminapi.Fault{{Kind: adminapi.FaultPartition, Region: r.Name}}
	return nil
}

func planDelay(p Params, s *adminapi.FleetState, t *target) error {
	r, err := defaultRegion(p, s)
	if err != nil {
		return err
	}
	f := adminapi.Fault{Kind: adminapi.FaultWANDelay, Region: r.Name, DelayMS: p.DelayMS, JitterMS: p.JitterMS}
	if f.DelayMS == 0 && f.JitterMS == 0 {
		f.DelayMS, f.JitterMS = 20, 5
	}
	t.regions, t.faults = []string{r.Name}, []adminapi.Fault{f}
	return nil
}

func planDCGM(p Params, s *adminapi.FleetState, t *target) error {
	names := p.Regions
	if len(names) == 0 && p.Region != "" {
		names = []string{p.Region}
	}
	if len(names) == 0 {
		for _, r := range s.Regions {
			names = append(names, r.Name)
		}
	}
	for _, n := range names {
		r, ok := s.Region(n)
		if !ok {
			return fmt.Errorf("%w: no region %q", ErrBadParams, n)
		}
		for _, c := range r.Cells {
			t.cells = append(t.cells, c.ID)
		}
	}
	t.regions, t.faults = names, []adminapi.Fault{{Kind: adminapi.FaultDCGMDown, Regions: names}}
	return nil
}

func planLeader(_ Params, s *adminapi.FleetState, t *target) error {
	if _, ok := s.Leader(); !ok {
		return fmt.Errorf("%w: the fleet has no global leader", ErrUnavailable)
	}
	t.faults = []adminapi.Fault{{Kind: adminapi.FaultKillLeader}}
	return nil
}

func planEtcd(_ Params, _ *adminapi.FleetState, t *target) error {
	t.faults = []adminapi.Fault{{Kind: adminapi.FaultEtcdDown}}
	return nil
}

// cellOf finds cell id in s.
func cellOf(s *adminapi.FleetState, id string) (*adminapi.RegionState, *adminapi.CellState, bool) {
	for i := range s.Regions {
		if c, ok := s.Regions[i].Cell(id); ok {
			return &s.Regions[i], c, true
		}
	}
	return nil, nil, false
}

func cellsNot(state string) func(*target, *adminapi.FleetState) bool {
	return func(t *target, s *adminapi.FleetState) bool {
		for _, id := range t.cells {
			if _, c, ok := cellOf(s, id); ok && c.State == state {
				return false
			}
		}
		return true
	}
}

func cellsGone(t *target, s *adminapi.FleetState) bool {
	for _, name := range t.regions {
		r, ok := s.Region(name)
		if !ok {
			continue
		}
		for _, id := range t.cells {
			if _, ok := r.Endpoint(id); ok {
				return false
			}
		}
	}
	return true
}

func regionsDown(t *target, s *adminapi.FleetState) bool {
	ld, ok := s.Leader()
	if !ok {
		return false
	}
	if t.leader != "" && slices.ContainsFunc(t.faults, func(f adminapi.Fault) bool { return f.Kind == adminapi.FaultKillLeader }) && ld.Name == t.leader {
		return false
	}
	for _, n := range t.regions {
		if ld.Live[n] {
			return false
		}
	}
	return true
}

// regionsAvoided: a leader knows the regions are down and no surviving
// region's data plane or plan sends them anything (before the leader
// knows, an idle plan may send them nothing anyway: that is not a
// reroute).
func regionsAvoided(t *target, s *adminapi.FleetState) bool {
	if !regionsDown(t, s) {
		return false
	}
	for _, r := range s.Regions {
		if !r.Up || slices.Contains(t.regions, r.Name) {
			continue
		}
		for _, n := range t.regions {
			if r.RoutesTo(n) || r.Shares[n] > 0 {
				return false
			}
		}
	}
	return true
}

// healthyExtremes returns, over the region's cells outside the target, the
// highest pressure and the lowest weight.
func healthyExtremes(t *target, r *adminapi.RegionState) (maxPressure float64, minWeight uint32, ok bool) {
	minWeight = ^uint32(0)
	for _, c := range r.Cells {
		if slices.Contains(t.cells, c.ID) {
			continue
		}
		ok = true
		maxPressure = max(maxPressure, c.Pressure)
		if e, found := r.Endpoint(c.ID); found {
			minWeight = min(minWeight, e.Weight)
		}
	}
	return maxPressure, minWeight, ok
}

// pressureMargin is how far above every healthy cell a throttled cell's
// pressure must be to count as detected.
const pressureMargin = 0.05

func throttledPressure(t *target, s *adminapi.FleetState) bool {
	r, ok := s.Region(t.regions[0])
	if !ok {
		return false
	}
	hi, _, any := healthyExtremes(t, r)
	for _, id := range t.cells {
		c, ok := r.Cell(id)
		if !ok || (any && c.Pressure < hi+pressureMargin) || (!any && c.Pressure < 0.5) {
			return false
		}
	}
	return true
}

func throttledWeight(t *target, s *adminapi.FleetState) bool {
	r, ok := s.Region(t.regions[0])
	if !ok {
		return false
	}
	_, lo, any := healthyExtremes(t, r)
	if !any {
		return false
	}
	for _, id := range t.cells {
		if e, ok := r.Endpoint(id); ok && !e.Degraded && e.Weight >= lo {
			return false
		}
	}
	return true
}

// rttKnown waits for the site's gossip RTT to every other region: with
// mTLS a peer's RTT counts only once its region proof is verified, which
// on a busy machine can come after the fleet is otherwise healthy, and
// rttRaised can see no rise from a baseline it never had.
func rttKnown(t *target, s *adminapi.FleetState) string {
	r, ok := s.Region(t.regions[0])
	if !ok {
		return fmt.Sprintf("region %s not in the fleet state", t.regions[0])
	}
	var missing []string
	for _, o := range s.Regions {
		if o.Name == r.Name {
			continue
		}
		if _, ok := r.RTTms[o.Name]; !ok {
			missing = append(missing, o.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("no gossip RTT from %s to %s yet", r.Name, strings.Join(missing, ", "))
	}
	return ""
}

func rttRaised(t *target, s *adminapi.FleetState) bool {
	r, ok := s.Region(t.regions[0])
	before, ok2 := t.before.Region(t.regions[0])
	if !ok || !ok2 {
		return false
	}
	// Half the injected delay: the baseline is one smoothed sample taken
	// before the injection, and on a loaded machine it can carry a few ms
	// of scheduling noise that the smoothed RTT after the injection no
	// longer has; half of it still stands far above loopback noise.
	for peer, base := range before.RTTms {
		if r.RTTms[peer] >= base+t.faults[0].DelayMS/2 {
			return true
		}
	}
	return false
}

func allFallback(t *target, s *adminapi.FleetState) bool {
	for _, id := range t.cells {
		if _, c, ok := cellOf(s, id); !ok || !c.Fallback {
			return false
		}
	}
	return true
}

func maxLenSeen(dataPlane bool) func(*target, *adminapi.FleetState) bool {
	return func(t *target, s *adminapi.FleetState) bool {
		want := uint32(t.faults[0].MaxModelLen)
		r, ok := s.Region(t.regions[0])
		if !ok {
			return false
		}
		if !dataPlane {
			for _, id := range t.cells {
				if c, ok := r.Cell(id); !ok || c.MaxModelLen != want {
					return false
				}
			}
			return true
		}
		// Every data plane that lists the cell (its own region's and any
		// that spills to it) must carry the new length.
		for _, rs := range s.Regions {
			for _, id := range t.cells {
				if e, ok := rs.Endpoint(id); ok && e.MaxModelLen != want {
					return false
				}
			}
		}
		return true
	}
}

func newLeader(t *target, s *adminapi.FleetState) bool {
	ld, ok := s.Leader()
	return ok && ld.Name != t.leader
}

func newEpoch(t *target, s *adminapi.FleetState) bool {
	if !newLeader(t, s) {
		return false
	}
	for _, r := range s.Regions {
		if r.RouteSource != "plan" || r.PlanEpoch <= t.epochs[r.Name] {
			return false
		}
	}
	return true
}

func noLeader(_ *target, s *adminapi.FleetState) bool {
	_, ok := s.Leader()
	return !ok
}
