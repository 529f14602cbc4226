package scalemodel

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/isobar-mesh/isobar/bench/scale"
)

// figCycleCPU names the cycle's cost among a Comparison's checks.
const figCycleCPU = "cycle CPU P50 ms (full push: its cost)"

// Tolerance is how far the model may be from a measured point on the
// figures the issue names (cycle cost, ingest CPU, global intake).
const Tolerance = 0.15

// Check is one figure of one measured point beside the model's.
type Check struct {
	Figure   string  `json:"figure"`
	Measured float64 `json:"measured"`
	Model    float64 `json:"model"`
	// Gated: the figure is one the issue holds to Tolerance.
	Gated bool `json:"gated"`
}

// RelErr is |model − measured| / measured (NaN when unmeasured).
func (c Check) RelErr() float64 {
	if c.Measured == 0 || math.IsNaN(c.Measured) || math.IsNaN(c.Model) {
		return math.NaN()
	}
	return math.Abs(c.Model-c.Measured) / c.Measured
}

// Pass: not gated, or within Tolerance.
func (c Check) Pass() bool { return !c.Gated || c.RelErr() <= Tolerance }

// Comparison is the model run as one measured point ran.
type Comparison struct {
	Cells, Regions int
	Topology       string
	// Saturated: the model's demand exceeds the cores the point had.
	Saturated bool
	Checks    []Check
}

// Pass: every gated check passes.
func (c Comparison) Pass() bool {
	for _, k := range c.Checks {
		if !k.Pass() {
			return false
		}
	}
	return true
}

// Validate runs the model as each measured point of cells cells in rep
// ran (its machine's cores, less the senders' measured CPU; the
// process's own CPU counted; the run's intervals and the summaries'
// nearest) and puts the figures side by side. It errs when rep has no
// such point with figures.
func Validate(p Params, rep *scale.Report, cells, nearest int, seed uint64) ([]Comparison, error) {
	var out []Comparison
	for _, pt := range rep.Points {
		f := pt.Figures
		if pt.Cells != cells || pt.Skipped != "" || f == nil || f.OfferedHeartbeatsPerS <= 0 {
			continue
		}
		other := 0.0
		if f.SenderCPUSPerS != nil {
			other = *f.SenderCPUSPerS
		}
		c := rep.Config
		r, err := Run(p, Scenario{
			Cells: pt.Cells, Regions: pt.Regions, Topology: pt.Topology,
			Cores: float64(rep.Machine.NumCPU), OtherCPU: other, NearestRTT: nearest, IncludeProcess: true,
			HeartbeatInterval: ms(c.HeartbeatIntervalMs), CycleInterval: ms(c.CycleIntervalMs), SummaryInterval: ms(c.SummaryIntervalMs),
			Seed: seed,
		})
		if err != nil {
			return nil, err
		}
		cpu := Check{Figure: "controllers' CPU s/s", Measured: f.CPUSPerS, Model: r.CPUUsedCores, Gated: true}
		if r.Saturated {
			// A saturated machine's CPU is its cores: no check of the model.
			cpu.Figure, cpu.Gated = fmt.Sprintf("controllers' CPU s/s (model saturated: demand %.2f cores, the cores left shown)", r.CPUCores), false
		}
		// The cycle's cost is its CPU time where both sides have it; its
		// wall time, the cost plus its waits for a core beside the rest
		// of the machine, is then shown but not held to Tolerance.
		costed := f.CycleCPUP50Ms != nil && !math.IsNaN(r.FullCycleCPUMs)
		checks := []Check{}
		if costed {
			checks = append(checks, Check{Figure: figCycleCPU, Measured: *f.CycleCPUP50Ms, Model: r.FullCycleCPUMs, Gated: true})
		}
		out = append(out, Comparison{Cells: pt.Cells, Regions: pt.Regions, Topology: pt.Topology, Saturated: r.Saturated, Checks: append(checks,
			Check{Figure: "cycle P50 ms (full push, wall)", Measured: f.CycleP50Ms, Model: r.FullCycleP50Ms, Gated: !costed},
			Check{Figure: "cycle P99 ms (full push, wall)", Measured: f.CycleP99Ms, Model: r.FullCycleP99Ms},
			cpu,
			Check{Figure: "ingest hb/s", Measured: f.IngestHeartbeatsPerS, Model: r.IngestHeartbeatsPerS},
			Check{Figure: "global inbound B/s", Measured: f.GlobalInboundBytesPerS, Model: r.GlobalInboundBytesPerS, Gated: true},
		)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("scalemodel: validate: no measured point of %d cells with figures", cells)
	}
	return out, nil
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// nullNaN is v, or nil (JSON null) when v is not a number.
func nullNaN(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// MarshalJSON writes an unmeasured or unmodelled figure as null.
func (c Check) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Figure   string   `json:"figure"`
		Measured *float64 `json:"measured"`
		Model    *float64 `json:"model"`
		Gated    bool     `json:"gated"`
		Pass     bool     `json:"pass"`
	}{c.Figure, nullNaN(c.Measured), nullNaN(c.Model), c.Gated, c.Pass()})
}

// MarshalJSON writes the cycle figures of a saturated scenario as null.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	return json.Marshal(struct {
		plain
		Cells          int      `json:"cells"`
		Regions        int      `json:"regions"`
		Topology       string   `json:"topology"`
		Cores          float64  `json:"cores"`
		FullCycleP50Ms *float64 `json:"full_cycle_p50_ms"`
		FullCycleP99Ms *float64 `json:"full_cycle_p99_ms"`
		FullCycleCPUMs *float64 `json:"full_cycle_cpu_ms"`
		LiveCycleP50Ms *float64 `json:"live_cycle_p50_ms"`
		LiveCycleP99Ms *float64 `json:"live_cycle_p99_ms"`
	}{plain(r), r.Scenario.Cells, r.Scenario.Regions, r.Scenario.Topology, r.Scenario.Cores,
		nullNaN(r.FullCycleP50Ms), nullNaN(r.FullCycleP99Ms), nullNaN(r.FullCycleCPUMs), nullNaN(r.LiveCycleP50Ms), nullNaN(r.LiveCycleP99Ms)})
}
