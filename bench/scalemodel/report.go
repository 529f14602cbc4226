package scalemodel

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/isobar-mesh/isobar/bench/scale"
)

// SolveTargetMs is issue 26's bound on a solve at 1,000 regions.
const SolveTargetMs = 200

// Bend is where one resource runs out for a topology on a core count.
type Bend struct {
	Cores   float64 `json:"cores"`
	Regions int     `json:"regions"` // 0: flat
	// CPUCells is the fleet at which the controllers' CPU demand reaches
	// the cores (0: beyond 10⁸).
	CPUCells int `json:"cpu_cells"`
}

// CycleBendCells is the cells per controller at which a full-push cycle's
// median cost (Params.CycleCost) reaches the cycle interval: one
// controller's cycle no longer fits between ticks, whatever the cores (0:
// beyond 10⁸).
func (p Params) CycleBendCells(interval time.Duration) int {
	return searchInt(1, 1e8, func(n int) bool { return p.CycleCost(float64(n)) >= ms1(interval) })
}

// SolveBendRegions is the region count at which a solve reaches limitMs.
func (p Params) SolveBendRegions(limitMs float64) int {
	return searchInt(1, 1e7, func(r int) bool { return p.Solve.At(float64(r)) >= limitMs })
}

// CPUBend is the fleet at which the controllers' CPU demand (regions 0:
// flat) reaches cores.
func (p Params) CPUBend(cores float64, regions int) Bend {
	s := Scenario{Regions: regions, Topology: scale.Hierarchical, Cores: cores}.withDefaults()
	ctrls := regions
	if regions == 0 {
		s.Topology, ctrls = scale.Flat, 1
	}
	cells := searchInt(max(ctrls, 1), 1e8, func(c int) bool {
		s.Cells = c
		d, _ := p.demand(s, ctrls, math.Ceil(float64(c)/float64(ctrls)))
		return d >= cores
	})
	return Bend{Cores: cores, Regions: regions, CPUCells: cells}
}

// searchInt is the least x in [lo, hi] with f(x) (f monotone), 0 when
// none.
func searchInt(lo, hi int, f func(int) bool) int {
	if !f(hi) {
		return 0
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if f(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func ms1(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteParams writes the constants as a table.
func WriteParams(w io.Writer, p Params) {
	form := func(l Linear) string {
		g := "n"
		if l.NLogN {
			g = "n·log₂n"
		}
		return fmt.Sprintf("%.4g + %.4g·%s", l.A, l.B, g)
	}
	fmt.Fprintln(w, "| constant | value |")
	fmt.Fprintln(w, "|---|---|")
	fmt.Fprintf(w, "| CPU per heartbeat at %d hb/s (cycles' share folded in) | %.2f µs, × (rate/%d)^(%.2f−1) |\n", RefHeartbeatsPerS, p.HeartbeatCPUUs, RefHeartbeatsPerS, p.HeartbeatCPUExp)
	fmt.Fprintf(w, "| CPU per controller (fixed) | %.3f ms/s |\n", p.ControllerCPUMsPerS)
	fmt.Fprintf(w, "| CPU of the measuring process (fixed) | %.2f ms/s |\n", p.ProcessCPUMsPerS)
	fmt.Fprintf(w, "| full-push cycle, median wall time | %s ms |\n", form(p.FullCycle))
	if p.FullCycleCPU != (Linear{}) {
		fmt.Fprintf(w, "| full-push cycle, median CPU time (its cost) | %s ms |\n", form(p.FullCycleCPU))
	}
	fmt.Fprintf(w, "| live cycle (score + project), mean | %s ms |\n", form(p.LiveCycle))
	fmt.Fprintf(w, "| live xDS build per push, mean | %s ms |\n", form(p.LiveBuild))
	fmt.Fprintf(w, "| cycle spread σ (lognormal) | %.3f (P99/P50 %.1f×) |\n", p.CycleSpread, math.Exp(z99*p.CycleSpread))
	fmt.Fprintf(w, "| live pushes per controller per s | %.3f |\n", p.PushesPerControllerPerS)
	fmt.Fprintf(w, "| heartbeat bytes | %.1f |\n", p.HeartbeatBytes)
	fmt.Fprintf(w, "| summary bytes | %.1f + %.2f per RTT entry |\n", p.SummaryBaseBytes, p.SummaryPerRTTBytes)
	fmt.Fprintf(w, "| solve | %.4g·R^%.3f ms |\n", p.Solve.C, p.Solve.P)
}

// WriteValidation writes comparisons side by side.
func WriteValidation(w io.Writer, cs []Comparison) {
	fmt.Fprintln(w, "| cells | regions | topology | figure | measured | model | error | within 15 % |")
	fmt.Fprintln(w, "|---:|---:|---|---|---:|---:|---:|---|")
	for _, c := range cs {
		for _, k := range c.Checks {
			verdict := "(not gated)"
			if k.Gated {
				verdict = map[bool]string{true: "yes", false: "**no**"}[k.Pass()]
			}
			fmt.Fprintf(w, "| %d | %d | %s | %s | %s | %s | %s | %s |\n", c.Cells, c.Regions, c.Topology, k.Figure,
				g4(k.Measured), g4(k.Model), pct(k.RelErr()), verdict)
		}
	}
}

// WriteResults writes the model's figures per scenario; item4Bytes > 0
// adds the global inbound with summaries of that size.
func WriteResults(w io.Writer, rs []Result, item4Bytes float64) {
	fmt.Fprintf(w, "| cells | regions | topology | machine | cores | cells/ctrl | hb/s | ctrl CPU cores (ingest) | per ctrl cores | utilisation | full cycle CPU ms | full cycle P50 / P99 ms | live cycle P50 / P99 ms | summary B/region | global inbound B/s | inbound, %.0f B summaries | solve ms |\n", item4Bytes)
	fmt.Fprintln(w, "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		s := r.Scenario
		regions, sum, alt, solve := fmt.Sprint(s.Regions), fmt.Sprintf("%.0f", r.SummaryBytesPerRegion), "—", fmt.Sprintf("%.1f", r.SolveMs)
		if s.Topology == scale.Flat {
			regions, sum, solve = "—", "—", "—"
		} else if item4Bytes > 0 {
			alt = fmt.Sprintf("%.0f", float64(s.Regions)*item4Bytes/s.SummaryInterval.Seconds())
		}
		cells, machine := fmt.Sprint(s.Cells), "all controllers"
		if s.OneOf > 0 {
			cells, regions, machine = fmt.Sprint(s.Cells*s.OneOf), fmt.Sprint(s.OneOf), "one controller"
			if item4Bytes > 0 {
				alt = fmt.Sprintf("%.0f", float64(s.OneOf)*item4Bytes/s.SummaryInterval.Seconds())
			}
		}
		util := fmt.Sprintf("%.2f", r.Utilisation)
		if r.CycleOverrun {
			util += " (cycle overruns its tick)"
		}
		if r.Saturated {
			util += fmt.Sprintf(" (saturated: ingest %.0f hb/s, %.0f %%)", r.IngestHeartbeatsPerS, 100*r.IngestHeartbeatsPerS/r.OfferedHeartbeatsPerS)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.0f | %d | %.0f | %.2f (%.2f) | %.4f | %s | %s | %s / %s | %s / %s | %s | %.0f | %s | %s |\n",
			cells, regions, s.Topology, machine, s.Cores, r.CellsPerController, r.OfferedHeartbeatsPerS, r.CPUCores, r.IngestCores,
			r.CPUCores/float64(r.Controllers), util, g4(r.FullCycleCPUMs), g4(r.FullCycleP50Ms), g4(r.FullCycleP99Ms), g4(r.LiveCycleP50Ms), g4(r.LiveCycleP99Ms),
			sum, r.GlobalInboundBytesPerS, alt, solve)
	}
}

// WriteBends writes where each resource runs out.
func WriteBends(w io.Writer, p Params, bends []Bend, cycle time.Duration) {
	fmt.Fprintln(w, "| cores | topology | controllers' CPU reaches the cores at |")
	fmt.Fprintln(w, "|---:|---|---:|")
	for _, b := range bends {
		topo := fmt.Sprintf("%d regions", b.Regions)
		if b.Regions == 0 {
			topo = "flat"
		}
		at := orBeyond(b.CPUCells) + " cells"
		if b.Regions > 0 && b.CPUCells == b.Regions {
			at = fmt.Sprintf("already at %d cells (one per region: the controllers' fixed CPU)", b.Regions)
		}
		fmt.Fprintf(w, "| %.0f | %s | %s |\n", b.Cores, topo, at)
	}
	live := searchInt(1, 1e8, func(n int) bool { return p.LiveCycle.At(float64(n)) >= ms1(cycle) })
	fmt.Fprintf(w, "\nOne controller's cycle runs in one goroutine, so more cores do not help it: a live cycle's mean (wall time, as measured) fills the %v tick at %s cells per controller, "+
		"a full-push cycle's median cost at %s. A solve reaches %d ms at %s regions.\n",
		cycle, orBeyond(live), orBeyond(p.CycleBendCells(cycle)), SolveTargetMs, orBeyond(p.SolveBendRegions(SolveTargetMs)))
}

func orBeyond(n int) string {
	if n == 0 {
		return "beyond 10⁸"
	}
	return fmt.Sprint(n)
}

func g4(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%.4g", v)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.1f %%", 100*v)
}
