package regional

import (
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
)

// View is an immutable picture of the registry after one cycle. Readers
// get it from Registry.View and must not modify it.
type View struct {
	// At is when the cycle ran; Cycle counts cycles.
	At    time.Time
	Cycle uint64
	// Cells sorted by ID.
	Cells []CellView
	// Demand is the ingress demand per model (requests/s) reported by the
	// region's data planes over the window; nil when none reports.
	Demand map[string]float64
	index  map[string]int // shared between views; read only
}

// Cell returns the named cell.
func (v *View) Cell(id string) (CellView, bool) {
	if v == nil {
		return CellView{}, false
	}
	i, ok := v.index[id]
	if !ok {
		return CellView{}, false
	}
	return v.Cells[i], true
}

// CellView is one cell as the controller sees it.
type CellView struct {
	ID          string
	Endpoint    string
	Model       string
	MaxModelLen uint32
	State       lifecycle.State
	StateSince  time.Time
	Reason      string
	LastSeen    time.Time
	Incarnation string
	Sequence    uint64
	// Signals as last reported (shared with the registry; read only).
	Signals *isobarpb.Signals
	VLLM    SourceView
	DCGM    SourceView
	RTT     time.Duration
	Jitter  time.Duration
	RTTOK   bool
	Score   score.Result
	Weight  projection.Weight
	// OperatorDrain: an operator asked for this cell to be drained.
	OperatorDrain bool
	// Fallback: a telemetry source is missing and scoring runs on the rest.
	Fallback bool
	// EndpointConflict: another live cell advertises the same endpoint;
	// this one is kept out of the load balancer.
	EndpointConflict bool
	// Suspect: the cell's heartbeat stream broke without a Terminated
	// report; it has weight 0 until it heartbeats again or the TTL fails it.
	Suspect bool
	// ClockSkew is the last heartbeat's sent_at minus its receive time
	// (ClockSkewKnown when it carried one); ClockSkewed: beyond
	// Limits.MaxClockSkew.
	ClockSkew                   time.Duration
	ClockSkewKnown, ClockSkewed bool

	// PrefillTokensPerSecond and MaxNumSeqs are the engine's declared
	// capacity from its heartbeat's capability (0: unknown).
	PrefillTokensPerSecond float64
	MaxNumSeqs             uint32
}

// ScoreReading is the score.Reading of the cell as v shows it: its last
// heartbeat's signals and sources and the probe's RTT and jitter. The data
// plane's error rate, which the registry also scores, is not in the view.
func (v CellView) ScoreReading() score.Reading {
	return reading(v.Signals, v.VLLM.OK, v.DCGM.OK, v.RTT, v.Jitter, v.RTTOK)
}

// SourceView is one telemetry source's health as last reported.
type SourceView struct {
	OK          bool
	Error       string
	LastSuccess time.Time
}

// newView wraps cells, which must be sorted by ID. index maps ID → position
// and may be shared between views with the same cells; nil builds one.
func newView(at time.Time, cycle uint64, cells []CellView, index map[string]int) *View {
	if index == nil {
		index = make(map[string]int, len(cells))
		for i, c := range cells {
			index[c.ID] = i
		}
	}
	return &View{At: at, Cycle: cycle, Cells: cells, index: index}
}

func sourceView(h *isobarpb.SourceHealth) SourceView {
	if h == nil {
		return SourceView{Error: "not reported"}
	}
	sv := SourceView{OK: h.GetOk(), Error: h.GetError()}
	if h.GetLastSuccess() != nil {
		sv.LastSuccess = h.GetLastSuccess().AsTime()
	}
	return sv
}
