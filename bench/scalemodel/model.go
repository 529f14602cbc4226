package scalemodel

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/bench/scale"
)

// Scenario is one fleet the model runs.
type Scenario struct {
	Cells    int
	Regions  int    // hierarchical: one controller per region
	Topology string // scale.Hierarchical or scale.Flat (one controller)
	// Cores the controllers share (all in one process, as bench scale runs
	// them); OtherCPU is cores other processes take from them (the cell
	// senders, when validating against a measured point).
	Cores    float64
	OtherCPU float64
	// Intervals, as bench scale's defaults when zero: heartbeat 500 ms,
	// cycle 100 ms, summary 1 s.
	HeartbeatInterval, CycleInterval, SummaryInterval time.Duration
	// NearestRTT is the peers' RTTs a summary carries (0: every peer);
	// SummaryBytes, when > 0, is a region's summary size instead of the
	// fitted one (e.g. the 475 B measured for item 4's summaries).
	NearestRTT   int
	SummaryBytes float64
	// OneOf > 0: the scenario is one controller (Regions 1) of a fleet of
	// OneOf regions, on a machine of its own; the summary, the global
	// inbound and the solve are the fleet's.
	OneOf int
	// IncludeProcess counts the measuring process's own CPU
	// (Params.ProcessCPUMsPerS), as a bench scale point does.
	IncludeProcess bool
	// Horizon is the virtual time simulated (default 2 s), of which the
	// first tenth is warm-up.
	Horizon time.Duration
	Seed    uint64
}

// Result is what the model gives for a scenario.
type Result struct {
	Scenario           Scenario `json:"-"`
	Controllers        int      `json:"controllers"`
	CellsPerController int      `json:"cells_per_controller"`
	// Heartbeats offered (cells/interval) and served in the simulation.
	OfferedHeartbeatsPerS float64 `json:"offered_heartbeats_per_s"`
	IngestHeartbeatsPerS  float64 `json:"ingest_heartbeats_per_s"`
	// CPUCores is the controllers' CPU demand (ingest + cycles + pushes +
	// per-controller work, and the process's own with IncludeProcess):
	// cores busy on average; IngestCores the heartbeats' part of it (the
	// fitted per-heartbeat CPU less the live cycles' share).
	CPUCores float64 `json:"cpu_cores"`
	// CPUUsedCores is what the cores can give of it: min(CPUCores, Cores −
	// OtherCPU), what a saturated machine's getrusage shows.
	CPUUsedCores float64 `json:"cpu_used_cores"`
	IngestCores  float64 `json:"ingest_cores"`
	// Utilisation is CPUCores / (Cores − OtherCPU); Saturated when ≥ 1:
	// the cycle figures are then not simulated (no steady state) and
	// ingest is the offered heartbeats / Utilisation.
	Utilisation float64 `json:"utilisation"`
	Saturated   bool    `json:"saturated"`
	// CycleOverrun: a live cycle of CellsPerController cells takes its
	// whole tick or more (one goroutine runs it back to back; ticks are
	// dropped); the cycle figures are then not simulated either.
	CycleOverrun bool `json:"cycle_overrun"`
	// Full-push cycle (worst case, timed back to back on the busiest
	// controller while the rest runs, as bench scale times it) and the
	// live cycle (score + project, and the build when it pushes),
	// response times under the shared cores, ms.
	FullCycleP50Ms float64 `json:"full_cycle_p50_ms"`
	FullCycleP99Ms float64 `json:"full_cycle_p99_ms"`
	// FullCycleCPUMs is that cycle's cost, its median CPU time
	// (Params.FullCycleCPU at CellsPerController; NaN when not fitted):
	// what bench scale's cycle_cpu_p50_ms measures.
	FullCycleCPUMs float64 `json:"-"`
	LiveCycleP50Ms float64 `json:"live_cycle_p50_ms"`
	LiveCycleP99Ms float64 `json:"live_cycle_p99_ms"`
	// SummaryBytesPerRegion and GlobalInboundBytesPerS as bench scale
	// reports them (flat: heartbeat bytes into the one controller).
	SummaryBytesPerRegion  float64 `json:"summary_bytes_per_region"`
	GlobalInboundBytesPerS float64 `json:"global_inbound_bytes_per_s"`
	// SolveMs is the optimiser's median solve at the region count
	// (hierarchical).
	SolveMs float64 `json:"solve_ms"`
}

// withDefaults fills a scenario's zero fields.
func (s Scenario) withDefaults() Scenario {
	if s.HeartbeatInterval <= 0 {
		s.HeartbeatInterval = 500 * time.Millisecond
	}
	if s.CycleInterval <= 0 {
		s.CycleInterval = 100 * time.Millisecond
	}
	if s.SummaryInterval <= 0 {
		s.SummaryInterval = time.Second
	}
	if s.Horizon <= 0 {
		s.Horizon = 2 * time.Second
	}
	if s.Topology == "" {
		s.Topology = scale.Hierarchical
	}
	return s
}

func (s Scenario) validate() error {
	switch {
	case s.Cells < 1:
		return fmt.Errorf("scalemodel: %d cells", s.Cells)
	case s.Topology != scale.Flat && s.Topology != scale.Hierarchical:
		return fmt.Errorf("scalemodel: topology %q (want %s or %s)", s.Topology, scale.Hierarchical, scale.Flat)
	case s.Topology == scale.Hierarchical && (s.Regions < 1 || s.Regions > s.Cells):
		return fmt.Errorf("scalemodel: %d regions for %d cells (every region needs a cell)", s.Regions, s.Cells)
	case s.Cores-s.OtherCPU <= 0:
		return fmt.Errorf("scalemodel: %.2f cores less %.2f taken by others leaves none", s.Cores, s.OtherCPU)
	}
	return nil
}

// demand is the controllers' CPU demand in cores, and its heartbeats'
// part. The fitted ingest CPU holds the live cycles' per-cell work
// (Params.HeartbeatCPUUs), so the demand is that, the controllers' fixed
// CPU and (IncludeProcess) the process's. The heartbeats' own part, what
// the simulation's heartbeat jobs cost beside its cycle jobs, is the
// ingest CPU less the cycles' CPU.
func (p Params) demand(s Scenario, ctrls int, n float64) (total, ingest float64) {
	hb := float64(s.Cells) / s.HeartbeatInterval.Seconds()
	cycleRate := 1 / s.CycleInterval.Seconds()
	lumped := p.IngestCores(hb)
	ingest = math.Max(0, lumped-float64(ctrls)*p.CycleCPU(n, cycleRate)/1000)
	total = lumped + float64(ctrls)*p.ControllerCPUMsPerS/1000
	if s.IncludeProcess {
		total += p.ProcessCPUMsPerS / 1000
	}
	return total, ingest
}

// Run runs the model for one scenario: the analytic demand, and the
// discrete-event simulation of the shared cores for the cycles' response
// times (skipped when saturated).
func Run(p Params, s Scenario) (Result, error) {
	s = s.withDefaults()
	if err := s.validate(); err != nil {
		return Result{}, err
	}
	ctrls := 1
	if s.Topology == scale.Hierarchical {
		ctrls = s.Regions
	}
	n := math.Ceil(float64(s.Cells) / float64(ctrls))
	r := Result{Scenario: s, Controllers: ctrls, CellsPerController: int(n), FullCycleCPUMs: math.NaN()}
	if p.FullCycleCPU != (Linear{}) {
		r.FullCycleCPUMs = p.FullCycleCPU.At(n)
	}
	r.OfferedHeartbeatsPerS = float64(s.Cells) / s.HeartbeatInterval.Seconds()
	r.CPUCores, r.IngestCores = p.demand(s, ctrls, n)
	capacity := s.Cores - s.OtherCPU
	r.Utilisation = r.CPUCores / capacity
	r.Saturated = r.Utilisation >= 1
	if s.Topology == scale.Flat {
		r.GlobalInboundBytesPerS = r.OfferedHeartbeatsPerS * p.HeartbeatBytes
	} else {
		fleet := s.Regions
		if s.OneOf > 0 {
			fleet = s.OneOf
		}
		r.SummaryBytesPerRegion = s.SummaryBytes
		if r.SummaryBytesPerRegion <= 0 {
			r.SummaryBytesPerRegion = p.SummaryBytes(fleet, s.NearestRTT)
		}
		r.GlobalInboundBytesPerS = float64(fleet) * r.SummaryBytesPerRegion / s.SummaryInterval.Seconds()
		r.SolveMs = p.Solve.At(float64(fleet))
	}
	r.CPUUsedCores = math.Min(r.CPUCores, capacity)
	r.CycleOverrun = p.LiveCycle.At(n) >= ms1(s.CycleInterval)
	if r.Saturated || r.CycleOverrun {
		r.FullCycleP50Ms, r.FullCycleP99Ms, r.LiveCycleP50Ms, r.LiveCycleP99Ms = math.NaN(), math.NaN(), math.NaN(), math.NaN()
	}
	if r.Saturated {
		// Processor sharing past saturation: every piece of work is
		// slowed alike, so each class gets capacity/demand of what it
		// asks, the heartbeats included; cycle times have no steady state.
		r.IngestHeartbeatsPerS = r.OfferedHeartbeatsPerS / r.Utilisation
		return r, nil
	}
	if r.CycleOverrun {
		r.IngestHeartbeatsPerS = r.OfferedHeartbeatsPerS
		return r, nil
	}
	simulate(p, s, ctrls, n, capacity, r.IngestCores/r.OfferedHeartbeatsPerS, &r)
	return r, nil
}

// simulate runs the processor-sharing server in virtual time and fills
// r's ingest and cycle response times.
func simulate(p Params, s Scenario, ctrls int, n, capacity, hbCost float64, r *Result) {
	rng := rand.New(rand.NewPCG(s.Seed, 0x15ba26))
	horizon := s.Horizon.Seconds()
	warm := horizon / 10
	hbs := newPeriodic(s.Cells, s.HeartbeatInterval.Seconds(), rng)
	cycles := newPeriodic(ctrls, s.CycleInterval.Seconds(), rng)
	cycleRate := 1 / s.CycleInterval.Seconds()
	pushP := p.PushesPerS(cycleRate) / cycleRate
	// Mean-preserving lognormal for the live costs (fitted as means).
	liveMedian := func(mean float64) float64 { return mean * math.Exp(-p.CycleSpread*p.CycleSpread/2) }
	overhead := p.ControllerCPUMsPerS / cycleRate / 1000
	if s.IncludeProcess {
		overhead += p.ProcessCPUMsPerS / cycleRate / 1000 / float64(ctrls)
	}
	srv := &psServer{cores: capacity}
	srv.add(kindProbe, lognormal(rng, p.CycleCost(n), p.CycleSpread)/1000)
	var full, live []float64
	served := 0
	for {
		tc, th, ty := srv.nextCompletion(), hbs.next(), cycles.next()
		t := min(tc, th, ty)
		if t > horizon {
			break
		}
		srv.advance(t)
		switch t {
		case tc:
			j := heap.Pop(&srv.active).(job)
			after := j.arrival >= warm
			switch {
			case j.kind == kindProbe:
				if after {
					full = append(full, 1000*(t-j.arrival))
				}
				srv.add(kindProbe, lognormal(rng, p.CycleCost(n), p.CycleSpread)/1000)
			case j.kind == kindLiveCycle && after:
				live = append(live, 1000*(t-j.arrival))
			case j.kind == kindHeartbeat && after:
				served++
			}
		case th:
			hbs.fire()
			srv.add(kindHeartbeat, hbCost)
		default:
			cycles.fire()
			cost := lognormal(rng, liveMedian(p.LiveCycle.At(n)), p.CycleSpread)
			if rng.Float64() < pushP {
				cost += lognormal(rng, liveMedian(p.LiveBuild.At(n)), p.CycleSpread)
			}
			srv.add(kindLiveCycle, cost/1000)
			if overhead > 0 {
				srv.add(kindOverhead, overhead)
			}
		}
	}
	r.IngestHeartbeatsPerS = float64(served) / (horizon - warm)
	r.FullCycleP50Ms, r.FullCycleP99Ms = quantile(full, 0.5), quantile(full, 0.99)
	r.LiveCycleP50Ms, r.LiveCycleP99Ms = quantile(live, 0.5), quantile(live, 0.99)
}

// quantile is the nearest-rank q-quantile (NaN for none).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
