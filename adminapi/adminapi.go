package adminapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Admin API paths. A fleet that can be drilled serves them over HTTPS with
// mTLS and answers only clients presenting an operator identity
// (spiffe://isobar/operator/NAME); the lab serves them with --admin-listen.
const (
	// PathState answers GET with a FleetState.
	PathState = "/admin/v1/state"
	// PathInject applies the Fault in the POST body.
	PathInject = "/admin/v1/inject"
	// PathHeal undoes the Fault in the POST body.
	PathHeal = "/admin/v1/heal"
)

// FaultKind names an injection an admin API may support.
type FaultKind string

// Fault kinds. Each has an exact inverse applied by PathHeal.
const (
	// FaultKillEngine SIGKILLs the engines of Cells in Region (heal:
	// restart them on the same address).
	FaultKillEngine FaultKind = "kill-engine"
	// FaultSilenceAgent stops the heartbeats of Cells' agents while their
	// engines keep serving (heal: heartbeats resume).
	FaultSilenceAgent FaultKind = "silence-agent"
	// FaultKillRegion takes every cell, the regional controller, the
	// gateway and the gossip member of Region down at once (heal: the site
	// comes back on the same addresses).
	FaultKillRegion FaultKind = "kill-region"
	// FaultPartition cuts Region off the WAN: from the global pair, from
	// gossip and from the other regions' gateways, both ways.
	FaultPartition FaultKind = "partition"
	// FaultWANDelay adds DelayMS of one-way delay and JitterMS of jitter to
	// every WAN path into and out of Region.
	FaultWANDelay FaultKind = "wan-delay"
	// FaultThrottle makes the GPUs of Cells in Region throttle thermally
	// (Severity 0..1): hardware metrics move first, latency follows.
	FaultThrottle FaultKind = "throttle"
	// FaultDCGMDown kills the dcgm-exporters of Regions (every region when
	// empty).
	FaultDCGMDown FaultKind = "dcgm-down"
	// FaultMaxModelLen restarts the engines of Cells with a context length
	// of MaxModelLen, advertised in /v1/models unless Silent.
	FaultMaxModelLen FaultKind = "max-model-len"
	// FaultKillLeader kills the global leader: its etcd session is lost
	// without a resignation and the process stops (heal: the member comes
	// back as a standby).
	FaultKillLeader FaultKind = "kill-leader"
	// FaultEtcdDown stops the etcd cluster (heal: it restarts on the same
	// data and addresses).
	FaultEtcdDown FaultKind = "etcd-down"
	// FaultStopController stops Region's regional controller only, as a
	// rescheduled process is: its cells, agents and gateway keep running
	// (heal: a new controller starts on the same addresses and state
	// directory, and the agents and the gateway reconnect with their own
	// backoff).
	FaultStopController FaultKind = "stop-controller"
)

// Fault is one injection. Which fields apply depends on Kind.
type Fault struct {
	Kind        FaultKind `json:"kind"`
	Region      string    `json:"region,omitempty"`
	Regions     []string  `json:"regions,omitempty"`
	Cells       []int     `json:"cells,omitempty"`
	DelayMS     float64   `json:"delay_ms,omitempty"`
	JitterMS    float64   `json:"jitter_ms,omitempty"`
	Severity    float64   `json:"severity,omitempty"`
	MaxModelLen int       `json:"max_model_len,omitempty"`
	Silent      bool      `json:"silent,omitempty"`
	// Member names the global member a kill-leader fault killed; the
	// admin API fills it in its answer and heal needs it back.
	Member string `json:"member,omitempty"`
	// StaggerMS (stop-controller): the region's agents after the first
	// reconnect one at a time over this long once the new controller
	// listens, as a fleet's agents come back at scattered points of their
	// backoff (0: each on its own backoff alone).
	StaggerMS float64 `json:"stagger_ms,omitempty"`
}

// String describes the fault for progress lines and errors.
func (f Fault) String() string {
	s := string(f.Kind)
	if f.Region != "" {
		s += " region=" + f.Region
	}
	if len(f.Regions) > 0 {
		s += fmt.Sprintf(" regions=%v", f.Regions)
	}
	if len(f.Cells) > 0 {
		s += fmt.Sprintf(" cells=%v", f.Cells)
	}
	if f.DelayMS > 0 || f.JitterMS > 0 {
		s += fmt.Sprintf(" delay=%gms jitter=%gms", f.DelayMS, f.JitterMS)
	}
	if f.Severity > 0 {
		s += fmt.Sprintf(" severity=%g", f.Severity)
	}
	if f.MaxModelLen > 0 {
		s += fmt.Sprintf(" max_model_len=%d", f.MaxModelLen)
	}
	if f.Member != "" {
		s += " member=" + f.Member
	}
	if f.StaggerMS > 0 {
		s += fmt.Sprintf(" stagger=%gms", f.StaggerMS)
	}
	return s
}

// InjectResult answers PathInject and PathHeal.
type InjectResult struct {
	// At is when the fault took effect, by the fleet's clock.
	At time.Time `json:"at"`
	// Fault is the fault as applied (with Member filled in).
	Fault Fault `json:"fault"`
}

// FleetState is what a drill observes: the controllers' and data planes'
// view of the fleet at one instant.
type FleetState struct {
	At time.Time `json:"at"`
	// Model is the model the drill's load asks for.
	Model string `json:"model"`
	// Faults are the fault kinds this fleet's admin API can inject.
	Faults  []FaultKind   `json:"faults"`
	Regions []RegionState `json:"regions"`
	// Globals are the members of the global pair (empty without one).
	Globals []GlobalState `json:"globals,omitempty"`
	// Etcd is "up", "down" or "" without one.
	Etcd string `json:"etcd,omitempty"`
	// Pinned lists the tenants the fleet's residency config pins, each
	// with the regions its requests may be served in (sorted); empty
	// without a residency config.
	Pinned map[string][]string `json:"pinned,omitempty"`
}

// PinnedTenants returns the pinned tenants, sorted.
func (s *FleetState) PinnedTenants() []string {
	names := make([]string, 0, len(s.Pinned))
	for t := range s.Pinned {
		names = append(names, t)
	}
	slices.Sort(names)
	return names
}

// RegionState is one region.
type RegionState struct {
	Name string `json:"name"`
	// Ingress is the host:port clients of the region send requests to.
	Ingress string `json:"ingress"`
	// Up is false while the region is down (kill-region).
	Up bool `json:"up"`
	// ControllerDown: the regional controller is stopped (stop-controller)
	// while the site serves; Cells are the stopped controller's last view.
	ControllerDown bool `json:"controller_down,omitempty"`
	// Cells as the regional controller sees them.
	Cells []CellState `json:"cells"`
	// RouteSource is how the region routes: plan, fallback (gossip) or local.
	RouteSource string `json:"route_source,omitempty"`
	PlanEpoch   uint64 `json:"plan_epoch,omitempty"`
	// Shares is the plan's split of this region's demand for Model by
	// destination region.
	Shares map[string]float64 `json:"shares,omitempty"`
	// Endpoints are the data plane's endpoints for Model.
	Endpoints []EndpointState `json:"endpoints"`
	// RTTms is the gossip-measured round trip to each peer region.
	RTTms map[string]float64 `json:"rtt_ms,omitempty"`
	// TenantRequests counts, by tenant (the request's tenant header,
	// bounded as package reqclass bounds it), the generate requests that
	// reached the region's engines, as the engines count them: since each
	// engine started, restarts included, whatever the answer. A drill
	// compares two readings; a region that is down reports none.
	TenantRequests map[string]int64 `json:"tenant_requests,omitempty"`
	// PinnedEndpoints counts, by residency set, the endpoints of the
	// set's pinned cluster in the region's data plane (the lab's model);
	// a set with none while every region is up has not been routed yet
	// (no plan in force since its regions came back).
	PinnedEndpoints map[string]int `json:"pinned_endpoints,omitempty"`
	// PinnedRegions lists, by residency set, the regions of the endpoints
	// of the set's pinned cluster in the region's data plane, sorted
	// (where the data plane would send the set's requests).
	PinnedRegions map[string][]string `json:"pinned_regions,omitempty"`
}

// CellState is one cell as its regional controller sees it; State is the
// lifecycle state in lower case (loading, ready, draining, failed,
// terminated).
type CellState struct {
	ID          string  `json:"id"`
	State       string  `json:"state"`
	Weight      uint32  `json:"weight"`
	Pressure    float64 `json:"pressure"`
	Fallback    bool    `json:"fallback"`
	MaxModelLen uint32  `json:"max_model_len"`
}

// EndpointState is one endpoint of the data plane's table.
type EndpointState struct {
	// Cell is the cell id, or "region/NAME" for a remote region's ingress.
	Cell        string `json:"cell"`
	Region      string `json:"region"`
	Weight      uint32 `json:"weight"`
	Priority    uint32 `json:"priority"`
	MaxModelLen uint32 `json:"max_model_len,omitempty"`
	// Degraded: the endpoint is published with EDS health DEGRADED (a
	// hardware derate): Envoy keeps it as a standby tier.
	Degraded bool `json:"degraded,omitempty"`
}

// GlobalState is one member of the global pair.
type GlobalState struct {
	Name   string `json:"name"`
	Up     bool   `json:"up"`
	Leader bool   `json:"leader"`
	// Live says, per region, whether this member holds a fresh summary.
	Live map[string]bool `json:"live,omitempty"`
}

// Region returns the named region.
func (s *FleetState) Region(name string) (*RegionState, bool) {
	for i := range s.Regions {
		if s.Regions[i].Name == name {
			return &s.Regions[i], true
		}
	}
	return nil, false
}

// Leader returns the member that leads, if one does.
func (s *FleetState) Leader() (*GlobalState, bool) {
	for i := range s.Globals {
		if s.Globals[i].Up && s.Globals[i].Leader {
			return &s.Globals[i], true
		}
	}
	return nil, false
}

// Supports reports whether the fleet can inject k.
func (s *FleetState) Supports(k FaultKind) bool {
	for _, f := range s.Faults {
		if f == k {
			return true
		}
	}
	return false
}

// Cell returns the named cell of region r.
func (r *RegionState) Cell(id string) (*CellState, bool) {
	for i := range r.Cells {
		if r.Cells[i].ID == id {
			return &r.Cells[i], true
		}
	}
	return nil, false
}

// Endpoint returns the data plane's endpoint for cell id.
func (r *RegionState) Endpoint(id string) (*EndpointState, bool) {
	for i := range r.Endpoints {
		if r.Endpoints[i].Cell == id {
			return &r.Endpoints[i], true
		}
	}
	return nil, false
}

// RoutesTo reports whether the region's data plane holds an endpoint in
// region dst, for the model or for one of its residency sets.
func (r *RegionState) RoutesTo(dst string) bool {
	for _, e := range r.Endpoints {
		if e.Region == dst {
			return true
		}
	}
	for _, regions := range r.PinnedRegions {
		if slices.Contains(regions, dst) {
			return true
		}
	}
	return false
}

// Unhealthy says what keeps the fleet from being healthy ("" when it is):
// every region up with every cell Ready and in its data plane, one leader,
// etcd up, every region routing on a plan when there is a global pair.
func (s *FleetState) Unhealthy() string {
	for _, r := range s.Regions {
		if !r.Up {
			return "region " + r.Name + " is down"
		}
		if r.ControllerDown {
			return "region " + r.Name + "'s controller is down"
		}
		for _, c := range r.Cells {
			if c.State != "ready" {
				return fmt.Sprintf("cell %s is %s", c.ID, c.State)
			}
			if c.Fallback {
				return fmt.Sprintf("cell %s is scored on partial telemetry", c.ID)
			}
			if _, ok := r.Endpoint(c.ID); !ok {
				return fmt.Sprintf("cell %s is not in region %s's data plane", c.ID, r.Name)
			}
		}
		for _, set := range sortedKeys(r.PinnedEndpoints) {
			if r.PinnedEndpoints[set] == 0 {
				return fmt.Sprintf("region %s's data plane has no endpoint for residency set %s", r.Name, set)
			}
		}
		if len(s.Globals) > 0 && r.RouteSource != "plan" {
			return fmt.Sprintf("region %s routes on %q, not on a plan", r.Name, r.RouteSource)
		}
	}
	if s.Etcd == "down" {
		return "etcd is down"
	}
	if len(s.Globals) > 0 {
		ld, ok := s.Leader()
		if !ok {
			return "the global pair has no leader"
		}
		for _, g := range s.Globals {
			if !g.Up {
				return "global member " + g.Name + " is down"
			}
		}
		for _, r := range s.Regions {
			if !ld.Live[r.Name] {
				return fmt.Sprintf("the leader %s holds no fresh summary of region %s", ld.Name, r.Name)
			}
		}
	}
	return ""
}

// Bounds of a decoded Fault (MaxFaultRegions also bounds a scenario's
// region count).
const (
	maxFaultCells   = 256
	MaxFaultRegions = 64
	maxNameLen      = 128
)

// FaultKinds lists every fault kind.
func FaultKinds() []FaultKind {
	return []FaultKind{FaultKillEngine, FaultSilenceAgent, FaultKillRegion, FaultPartition, FaultWANDelay,
		FaultThrottle, FaultDCGMDown, FaultMaxModelLen, FaultKillLeader, FaultEtcdDown, FaultStopController}
}

// DecodeFault parses and checks a Fault from JSON (an admin request body):
// unknown fields, unknown kinds and out-of-range values are errors that
// name the field.
func DecodeFault(b []byte) (Fault, error) {
	var f Fault
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Fault{}, fmt.Errorf("adminapi: fault: %w", err)
	}
	if dec.More() {
		return Fault{}, errors.New("adminapi: fault: trailing data after the JSON object")
	}
	return f, f.Validate()
}

// Validate checks the fault's fields.
func (f Fault) Validate() error {
	if !slices.Contains(FaultKinds(), f.Kind) {
		return fmt.Errorf("adminapi: fault: kind %q: want one of %v", f.Kind, FaultKinds())
	}
	if len(f.Region) > maxNameLen || len(f.Member) > maxNameLen {
		return fmt.Errorf("adminapi: fault: region or member name over %d bytes", maxNameLen)
	}
	if len(f.Cells) > maxFaultCells {
		return fmt.Errorf("adminapi: fault: cells: %d entries, at most %d", len(f.Cells), maxFaultCells)
	}
	for _, c := range f.Cells {
		if c < 0 || c >= 1<<16 {
			return fmt.Errorf("adminapi: fault: cells: index %d out of range", c)
		}
	}
	if len(f.Regions) > MaxFaultRegions {
		return fmt.Errorf("adminapi: fault: regions: %d entries, at most %d", len(f.Regions), MaxFaultRegions)
	}
	for _, r := range f.Regions {
		if r == "" || len(r) > maxNameLen {
			return fmt.Errorf("adminapi: fault: regions: name %q: want 1..%d bytes", r, maxNameLen)
		}
	}
	for name, v := range map[string]float64{"delay_ms": f.DelayMS, "jitter_ms": f.JitterMS, "severity": f.Severity, "stagger_ms": f.StaggerMS} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("adminapi: fault: %s %v: want a finite value >= 0", name, v)
		}
	}
	if f.Severity > 1 {
		return fmt.Errorf("adminapi: fault: severity %v: want 0..1", f.Severity)
	}
	if f.StaggerMS > 60_000 {
		return fmt.Errorf("adminapi: fault: stagger_ms %v: want 0..60000", f.StaggerMS)
	}
	if f.MaxModelLen < 0 || f.MaxModelLen > 1<<24 {
		return fmt.Errorf("adminapi: fault: max_model_len %d out of range", f.MaxModelLen)
	}
	return nil
}

// sortedKeys lists m's keys in order.
func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
