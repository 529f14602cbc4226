package statusview

import (
	"encoding/json"
	"time"

	"github.com/isobar-mesh/isobar/debugapi"
)

// Report is what one Collect read. Its JSON form is `isobar status
// --output json`.
type Report struct {
	Controllers []Controller `json:"controllers,omitempty"`
	Globals     []Global     `json:"globals,omitempty"`
}

// Controller is one regional controller: GET /debug/cells and GET
// /debug/routes. At is nil when the cells could not be read.
type Controller struct {
	Controller string               `json:"controller"`
	Errors     []string             `json:"errors,omitempty"`
	At         *time.Time           `json:"at,omitempty"`
	Cycle      uint64               `json:"cycle,omitempty"`
	Cells      []debugapi.CellDebug `json:"cells"`
	Routes     *debugapi.RouteTable `json:"routes,omitempty"`
}

// Global is one global member: GET /debug/regions and GET /debug/plan.
// Plan is the member's routing plan as the debug API gives it (protojson,
// compacted); PlanNote says why there is none when the member published
// none.
type Global struct {
	Global   string                  `json:"global"`
	Errors   []string                `json:"errors,omitempty"`
	Leader   bool                    `json:"leader"`
	Regions  []debugapi.RegionStatus `json:"regions"`
	Plan     json.RawMessage         `json:"plan,omitempty"`
	PlanNote string                  `json:"plan_note,omitempty"`
}

// Failed counts the sources that could not be read in full.
func (r Report) Failed() int {
	n := 0
	for _, c := range r.Controllers {
		if len(c.Errors) > 0 {
			n++
		}
	}
	for _, g := range r.Globals {
		if len(g.Errors) > 0 {
			n++
		}
	}
	return n
}

// cellsAnswer is the JSON shape of GET /debug/cells.
type cellsAnswer struct {
	At    time.Time            `json:"at"`
	Cycle uint64               `json:"cycle"`
	Cells []debugapi.CellDebug `json:"cells"`
}

// regionsAnswer is the JSON shape of GET /debug/regions.
type regionsAnswer struct {
	Leader  bool                    `json:"leader"`
	Regions []debugapi.RegionStatus `json:"regions"`
}
