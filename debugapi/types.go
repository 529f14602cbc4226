package debugapi

import "time"

// CellDebug is the JSON shape of GET /debug/cells/{id}: everything that
// went into a cell's weight.
type CellDebug struct {
	ID          string    `json:"id"`
	Endpoint    string    `json:"endpoint"`
	Model       string    `json:"model"`
	MaxModelLen uint32    `json:"max_model_len"`
	State       string    `json:"state"`
	StateSince  time.Time `json:"state_since"`
	Reason      string    `json:"reason"`
	LastSeen    time.Time `json:"last_seen"`
	Sequence    uint64    `json:"sequence"`
	// Suspect: the heartbeat stream broke without a Terminated report.
	Suspect bool `json:"suspect,omitempty"`
	// Raw signals as reported, plus the controller's own RTT/jitter.
	Raw map[string]float64 `json:"raw"`
	// Normalised score, configured weight and contribution per present
	// signal.
	Signals  map[string]SignalDebug `json:"signals"`
	Pressure float64                `json:"pressure"`
	Fallback bool                   `json:"fallback"`
	Sources  map[string]SourceDebug `json:"sources"`
	// Weight published to the data plane (0 = not in the load balancer)
	// and the target the cell's state and slow signals alone would give.
	Weight       uint32 `json:"weight"`
	TargetWeight uint32 `json:"target_weight"`
	// ClassWeight is the weight in the context-class clusters the cell
	// fits when its max_model_len is below its model's longest (Weight is
	// then 1, for the main cluster); absent otherwise.
	ClassWeight uint32 `json:"class_weight,omitempty"`
	// Band is the weight band behind the target ("full", "1/2", ...,
	// "probe", "out") and BandReason why; Degraded: published with EDS
	// health DEGRADED (a hardware derate). Load signals never move a band.
	Band             string  `json:"band"`
	BandReason       string  `json:"band_reason"`
	Degraded         bool    `json:"degraded"`
	Penalty          float64 `json:"penalty"`
	Probation        bool    `json:"probation"`
	PenaltyTrips     int     `json:"penalty_trips"`
	OperatorDrain    bool    `json:"operator_drain"`
	EndpointConflict bool    `json:"endpoint_conflict"`
	// ClockSkewSeconds is the cell's sent_at minus the receive time of its
	// last heartbeat (absent when it carried none); ClockSkewed: beyond
	// the bound. Skew never affects liveness.
	ClockSkewSeconds *float64 `json:"clock_skew_seconds,omitempty"`
	ClockSkewed      bool     `json:"clock_skewed"`
}

// SignalDebug explains one signal's part in the pressure.
type SignalDebug struct {
	Normalized   float64 `json:"normalized"`
	Weight       float64 `json:"weight"`
	Contribution float64 `json:"contribution"`
}

// SourceDebug is a telemetry source's health.
type SourceDebug struct {
	OK          bool       `json:"ok"`
	Error       string     `json:"error,omitempty"`
	LastSuccess *time.Time `json:"last_success,omitempty"`
}

// Route sources, in the order a region prefers them.
const (
	// RoutesPlan: the global leader's plan, valid and unexpired.
	RoutesPlan = "plan"
	// RoutesFallback: the plan expired (global unreachable); local-first
	// with spill-over computed from the gossiped summaries.
	RoutesFallback = "fallback"
	// RoutesLocal: no cross-region information at all; everything local.
	RoutesLocal = "local"
)

// RouteTable is the JSON shape of GET /debug/routes: the cross-region
// routing in force for a region's ingress: per model, the share served by
// each destination region (that region included) and the share shed.
// Fields carry no tags; the wire names are the Go names. regional uses it
// as its route table (regional.RouteTable is an alias).
type RouteTable struct {
	Source     string
	Epoch      uint64
	Sequence   uint64
	LeaderID   string
	IssuedAt   time.Time
	ValidUntil time.Time
	Models     map[string]ModelRoutes
	// Ingress addresses of destination regions.
	Ingress map[string]string
}

// ModelRoutes is one model's split. Routes and Shed are the unpinned
// standard requests'; the fields after them (issue 25) are left out of
// the JSON when empty.
type ModelRoutes struct {
	Routes map[string]float64
	Shed   float64
	// ShedCritical and ShedSheddable: the shares of the unpinned critical
	// and sheddable requests shed.
	ShedCritical  float64 `json:",omitempty"`
	ShedSheddable float64 `json:",omitempty"`
	// Pinned: the routing of each residency slice the plan carries, by
	// its allowed regions joined with ",".
	Pinned map[string]PinnedRoutes `json:",omitempty"`
	// Sliced: the plan carried slices for the model (a criticality-aware
	// leader). Otherwise its shed is one share of the whole demand and
	// the region orders it by its own demand mix (sheddable first).
	Sliced bool `json:",omitempty"`
}

// PinnedRoutes routes the requests pinned to one set of regions: only
// those regions appear in Routes.
type PinnedRoutes struct {
	Routes                            map[string]float64
	Shed, ShedCritical, ShedSheddable float64
}

// RegionStatus is one region as the leader sees it (GET /debug/regions).
type RegionStatus struct {
	Region     string  `json:"region"`
	AgeSeconds float64 `json:"age_seconds"`
	Live       bool    `json:"live"`
	Sequence   uint64  `json:"sequence"`
	Models     int     `json:"models"`
	Ingress    string  `json:"ingress_address"`
	// ClockSkewSeconds is the latest summary's own time minus its receive
	// time; ClockSkewed: beyond the member's Limits.MaxClockSkew. Age
	// and liveness always use the receive time.
	ClockSkewSeconds float64 `json:"clock_skew_seconds"`
	ClockSkewed      bool    `json:"clock_skewed"`
}
