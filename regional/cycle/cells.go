package cycle

import (
	"github.com/isobar-mesh/isobar/internal/keepwrite"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
)

// Cell is what the mapping needs of one cell: what its heartbeat and the
// probe say (Reading, without the data plane's error rate), its lifecycle
// state and declared context, and the data plane's error window.
type Cell struct {
	ID    string
	Model string
	// MaxModelLen is the declared max_model_len (0: not declared).
	MaxModelLen uint32
	// State is the lifecycle state; Excluded (an endpoint conflict, a
	// suspect stream) keeps the cell out of the load balancer whatever it
	// is.
	State    lifecycle.State
	Excluded bool
	// Reading is the heartbeat's signals and the probe's round trip;
	// its DataPlaneErrorRate is ignored (DataPlane sets it).
	Reading score.Reading
	// EngineRequests is the engine's request count over the window its
	// error rate (Reading.ErrorRate) covers.
	EngineRequests float64
	// DataPlane is the data planes' error rate for the cell.
	DataPlane ErrorWindow
	// Utilisation is the cell's model's pool utilisation in the region:
	// load over the capacity of its Ready cells, penalised ones included
	// (0: unknown). It bounds what an error-rate penalty may hold out
	// (projection.PenaltyConfig.MaxLoadAfterHold).
	Utilisation float64
}

// ErrorWindow is an error rate over a window of Requests requests; OK
// when there is one.
type ErrorWindow struct {
	Rate, Requests float64
	OK             bool
}

// FromView is the Cell of view v, with the data plane's error window dp.
func FromView(v CellView, dp ErrorWindow) Cell {
	return Cell{
		ID: v.ID, Model: v.Model, MaxModelLen: v.MaxModelLen,
		State: v.State, Excluded: v.EndpointConflict || v.Suspect,
		Reading: v.ScoreReading(), EngineRequests: v.Signals.GetWindowRequests(),
		DataPlane: dp,
	}
}

// ScoreInput is the scorer's input for c: its reading and the data
// plane's error rate (when there is one), through score.InputFrom.
func ScoreInput(c Cell) score.Input {
	r := c.Reading
	r.DataPlaneErrorRate = score.Value{}
	if c.DataPlane.OK {
		r.DataPlaneErrorRate = score.Some(c.DataPlane.Rate)
	}
	return score.InputFrom(r)
}

// Map scores each cell with scorer and returns, in the order of cells,
// its projection.Cell and its score.
//
// A cell's ContextShare is its declared context over the longest its
// model's cells declare. Its error rate is the engine's (when the engine
// reports one) or the data plane's, whichever is worse: the data plane
// also sees failures the engine never counts (connect failures, resets,
// timeouts).
func Map(scorer score.Config, cells []Cell) ([]projection.Cell, []score.Result) {
	return MapKnown(scorer, cells, nil, nil, nil)
}

// MapKnown is Map where known, when not nil, gives for each cell (same
// order) a score already computed from the same ScoreInput (nil: none),
// which is used instead of scoring it again (score.Config.Score is a pure function of
// its input): the registry passes the scores of the cells whose heartbeat,
// probe and data plane window did not change since the last cycle. The
// results are written into pcells and results (resized keeping their
// elements, keepwrite.Resize), so that a caller that cycles reuses them.
//
// A known score that is results[i] itself says more: cells[i] is the cell
// the last call (into the same buffers) mapped at i, from the same input
// but for its Utilisation, so pcells[i] still holds its mapping. Unless its
// Utilisation or its ContextShare (its model's longest context may have
// moved) differs, the cell is not mapped again.
func MapKnown(scorer score.Config, cells []Cell, known func(i int) *score.Result,
	pcells []projection.Cell, results []score.Result) ([]projection.Cell, []score.Result) {
	// Cells of one model mostly come in runs: a run's longest is folded
	// into the map once, not once per cell.
	longest := map[string]uint32{}
	run, runMax := "", uint32(0)
	for i := range cells {
		c := &cells[i]
		if i > 0 && c.Model != run {
			longest[run] = max(longest[run], runMax)
			runMax = 0
		}
		run, runMax = c.Model, max(runMax, c.MaxModelLen)
	}
	if len(cells) > 0 {
		longest[run] = max(longest[run], runMax)
	}
	pcells = keepwrite.Resize(pcells, len(cells))
	results = keepwrite.Resize(results, len(cells))
	for i := range cells {
		c := &cells[i]
		var res *score.Result
		if known != nil {
			res = known(i)
		}
		if i == 0 || c.Model != run {
			run, runMax = c.Model, longest[c.Model]
		}
		switch {
		case res == nil:
			results[i] = scorer.Score(ScoreInput(*c))
		case res != &results[i]:
			results[i] = *res
		case pcells[i].Utilisation == c.Utilisation && pcells[i].ContextShare == contextShare(c, runMax):
			continue // mapped by the last call, from the same input
		}
		keepwrite.Set(&pcells[i], projectionCell(c, &results[i], runMax)) // mostly the same as last cycle's
	}
	return pcells, results
}

// contextShare is c's declared context over its model's longest, 0 when
// it declares none.
func contextShare(c *Cell, longest uint32) float64 {
	if c.MaxModelLen == 0 {
		return 0
	}
	return float64(c.MaxModelLen) / float64(longest)
}

// projectionCell is c as the projection takes it, scored res, its model's
// longest declared context being longest.
func projectionCell(c *Cell, res *score.Result, longest uint32) projection.Cell {
	state := c.State
	if c.Excluded {
		state = lifecycle.Failed // never in the load balancer
	}
	pc := projection.Cell{ID: c.ID, State: state, Pressure: res.Pressure, Pool: c.Model, Utilisation: c.Utilisation,
		Thermal: res.Normalized[score.Thermal], ThermalOK: res.Present[score.Thermal], ContextShare: contextShare(c, longest)}
	if c.Reading.AppOK && c.Reading.ErrorRate.OK {
		pc.ErrorRate, pc.ErrorOK = c.Reading.ErrorRate.V, true
		pc.ErrorRequests = c.EngineRequests
	}
	if dp := c.DataPlane; dp.OK && (!pc.ErrorOK || dp.Rate > pc.ErrorRate) {
		pc.ErrorRate, pc.ErrorRequests, pc.ErrorOK = dp.Rate, dp.Requests, true
	}
	return pc
}

// fallback is a view's Fallback for its score res: the scorer fell back,
// or a telemetry source is down.
func fallback(v *CellView, res score.Result) bool { return res.Fallback || !v.DCGM.OK || !v.VLLM.OK }

// Annotated returns v with its score res, Fallback and projected weight
// w. Views are shared between cycles and never modified once published:
// when v already holds them it is returned as is; when own (v is the
// caller's, not yet published) it is set in place; otherwise a copy is.
// The registry keeps a cell's view this way across cycles, so that a cycle
// allocates only the views of the cells that changed.
func Annotated(v *CellView, res score.Result, w projection.Weight, own bool) *CellView {
	fb := fallback(v, res)
	if v.Score == res && v.Weight == w && v.Fallback == fb {
		return v
	}
	if !own {
		c := *v
		v = &c
	}
	v.Score, v.Weight, v.Fallback = res, w, fb
	return v
}

// Weighted returns copies of views with each one's projected weight
// (weights, in the same order: projection.Decision.Weights for the cells
// Map made of them).
func Weighted(views []*CellView, weights []projection.Weight) []*CellView {
	out := make([]*CellView, len(views))
	for i, v := range views {
		c := *v
		c.Weight = weights[i]
		out[i] = &c
	}
	return out
}
