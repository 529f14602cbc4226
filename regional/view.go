package regional

import (
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/cycle"
)

// View is an immutable picture of the registry after one cycle. Readers
// get it from Registry.View and must not modify it.
type View struct {
	// At is when the cycle ran; Cycle counts cycles.
	At    time.Time
	Cycle uint64
	// Cells sorted by ID. A cell whose view did not change since the
	// previous cycle is the same pointer as in the previous View: views
	// are shared between Views and never modified once published.
	Cells []*CellView
	// Demand is the ingress demand per model (requests/s) reported by the
	// region's data planes over the window; nil when none reports.
	Demand map[string]float64
	// DemandSlices splits Demand by criticality and residency set (the
	// standard unpinned remainder included); nil when no data plane
	// reports anything but standard unpinned demand.
	DemandSlices map[string]map[SliceKey]float64
	index        map[string]int // shared between views; read only
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
	return *v.Cells[i], true
}

// CellView is one cell as the controller sees it (regional/cycle).
type CellView = cycle.CellView

// SourceView is one telemetry source's health as last reported.
type SourceView = cycle.SourceView

// newView wraps cells, which must be sorted by ID. index maps ID → position
// and may be shared between views with the same cells; nil builds one.
func newView(at time.Time, n uint64, cells []*CellView, index map[string]int) *View {
	if index == nil {
		index = make(map[string]int, len(cells))
		for i, c := range cells {
			index[c.ID] = i
		}
	}
	return &View{At: at, Cycle: n, Cells: cells, index: index}
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
