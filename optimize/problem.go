package optimize

import (
	"errors"
	"fmt"
	"math"
)

// Defaults of the Problem's model parameters (a zero field means its default).
const (
	DefaultHeadroom      = 0.9
	DefaultBeta          = 0.1
	DefaultK             = 4.0
	DefaultShedPenaltyMs = 10000.0
	DefaultTolerance     = 1e-6
	DefaultMaxIterations = 1000
)

// Bounds on the Problem's inputs. They keep every product the solver forms
// finite and the flow matrix within memory.
const (
	// MaxRegions is the largest number of regions a Problem may have (the
	// solver holds an n×n flow matrix).
	MaxRegions = 4096
	// MaxValue bounds every demand, capacity, latency, RTT and penalty.
	MaxValue = 1e9
	// MinValue is the resolution of demand, capacity and engine latency:
	// a demand or capacity below it counts as 0 and an engine latency
	// below it counts as MinValue (smaller numbers would underflow the
	// solver's arithmetic). It is also the smallest Beta.
	MinValue = 1e-6
	// MinHeadroom is the smallest Headroom.
	MinHeadroom = 1e-3
	// MaxK bounds the knee exponent K.
	MaxK = 64.0
)

// ErrInvalidProblem is wrapped by every error Validate (and so Solve)
// returns; test with errors.Is.
var ErrInvalidProblem = errors.New("optimize: invalid problem")

// Region is one region's ingress demand and serving capacity.
type Region struct {
	// Name identifies the region (non-empty, unique within the Problem).
	Name string
	// DemandRPS is the ingress demand at the region's gateway (requests/s,
	// 0 to MaxValue; below MinValue counts as 0).
	DemandRPS float64
	// CapacityRPS is what the region serves at SLO (requests/s, 0 to
	// MaxValue; 0, or below MinValue, serves nothing).
	CapacityRPS float64
	// EngineLatencyMs is the engine latency at low load, L0 (ms, > 0 and
	// at most MaxValue; below MinValue counts as MinValue).
	EngineLatencyMs float64
	// Down marks a region that receives nothing and is not a source: its
	// demand is ignored and its plan row is all zero.
	Down bool
}

// Problem is one instance of the cross-region routing problem. Region i's
// row and column in RTTms belong to Regions[i].
type Problem struct {
	Regions []Region
	// RTTms[i][j] is the round-trip time between regions i and j in ms:
	// symmetric, RTTms[i][i] = 0, +Inf when the pair cannot reach each other.
	RTTms [][]float64
	// Headroom h scales every capacity: no region is planned at or above
	// CapacityRPS·h. In [MinHeadroom, 1]; 0 means DefaultHeadroom (0.9).
	Headroom float64
	// Beta is the height of the latency knee, MinValue ≤ β ≤ MaxValue; 0
	// means DefaultBeta (0.1).
	Beta float64
	// K is the sharpness of the latency knee, 1 ≤ K ≤ MaxK; 0 means
	// DefaultK (4).
	K float64
	// ShedPenaltyMs is the cost P of one shed request in ms; it must exceed
	// every region's EngineLatencyMs (otherwise shedding beats serving an
	// idle region). 0 means DefaultShedPenaltyMs (10,000).
	ShedPenaltyMs float64
	// Tolerance stops the solver once the duality gap is at most Tolerance
	// times the objective; 0 means DefaultTolerance (1e-6).
	Tolerance float64
	// MaxIterations bounds the solver's sweeps; 0 means
	// DefaultMaxIterations (1,000).
	MaxIterations int
}

// Model is the latency model's parameters as a Problem and the planners'
// configurations (global's PlanConfig, regional's fallback) carry them: a
// zero field means its default. WithDefaults is the one place those
// defaults are applied.
type Model struct {
	Headroom, Beta, K, ShedPenaltyMs float64
}

// WithDefaults returns m with every zero field replaced by its default
// (DefaultHeadroom, DefaultBeta, DefaultK, DefaultShedPenaltyMs).
func (m Model) WithDefaults() Model {
	if m.Headroom == 0 {
		m.Headroom = DefaultHeadroom
	}
	if m.Beta == 0 {
		m.Beta = DefaultBeta
	}
	if m.K == 0 {
		m.K = DefaultK
	}
	if m.ShedPenaltyMs == 0 {
		m.ShedPenaltyMs = DefaultShedPenaltyMs
	}
	return m
}

// withDefaults returns p with every zero parameter replaced by its default.
func (p Problem) withDefaults() Problem {
	m := Model{Headroom: p.Headroom, Beta: p.Beta, K: p.K, ShedPenaltyMs: p.ShedPenaltyMs}.WithDefaults()
	p.Headroom, p.Beta, p.K, p.ShedPenaltyMs = m.Headroom, m.Beta, m.K, m.ShedPenaltyMs
	if p.Tolerance == 0 {
		p.Tolerance = DefaultTolerance
	}
	if p.MaxIterations == 0 {
		p.MaxIterations = DefaultMaxIterations
	}
	return p
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidProblem, fmt.Sprintf(format, args...))
}

// finiteIn reports whether v is a finite number in [lo, hi].
func finiteIn(v, lo, hi float64) bool {
	return !math.IsNaN(v) && v >= lo && v <= hi
}

// resolved returns r's demand, capacity and engine latency as the model
// uses them: demand and capacity below MinValue are 0, an engine latency
// below MinValue is MinValue.
func (r Region) resolved() (demand, capacity, latency float64) {
	demand, capacity, latency = r.DemandRPS, r.CapacityRPS, r.EngineLatencyMs
	if demand < MinValue {
		demand = 0
	}
	if capacity < MinValue {
		capacity = 0
	}
	return demand, capacity, math.Max(latency, MinValue)
}

// Validate checks p (after defaults) and returns an error wrapping
// ErrInvalidProblem that names the field, and the region where there is
// one, and says what is allowed.
func (p Problem) Validate() error {
	q := p.withDefaults()
	n := len(q.Regions)
	if n == 0 {
		return invalid("Regions is empty: give at least one region")
	}
	if n > MaxRegions {
		return invalid("Regions has %d entries: at most %d are allowed", n, MaxRegions)
	}
	if !finiteIn(q.Headroom, MinHeadroom, 1) {
		return invalid("Headroom = %v: want %v ≤ headroom ≤ 1", q.Headroom, MinHeadroom)
	}
	if !finiteIn(q.Beta, MinValue, MaxValue) {
		return invalid("Beta = %v: want %v ≤ beta ≤ %v", q.Beta, MinValue, MaxValue)
	}
	if !finiteIn(q.K, 1, MaxK) {
		return invalid("K = %v: want 1 ≤ K ≤ %v", q.K, MaxK)
	}
	if !finiteIn(q.ShedPenaltyMs, 0, MaxValue) || q.ShedPenaltyMs == 0 {
		return invalid("ShedPenaltyMs = %v: want a number > 0 and ≤ %v", q.ShedPenaltyMs, MaxValue)
	}
	if !finiteIn(q.Tolerance, 0, 1) || q.Tolerance == 0 {
		return invalid("Tolerance = %v: want 0 < tolerance ≤ 1", q.Tolerance)
	}
	if q.MaxIterations < 0 {
		return invalid("MaxIterations = %d: want ≥ 0 (0 means %d)", q.MaxIterations, DefaultMaxIterations)
	}
	seen := make(map[string]int, n)
	for i, r := range q.Regions {
		if r.Name == "" {
			return invalid("Regions[%d].Name is empty: every region needs a name", i)
		}
		if k, dup := seen[r.Name]; dup {
			return invalid("Regions[%d].Name %q duplicates Regions[%d]: names must be unique", i, r.Name, k)
		}
		seen[r.Name] = i
		if !finiteIn(r.DemandRPS, 0, MaxValue) {
			return invalid("region %q: DemandRPS = %v: want a number from 0 to %v", r.Name, r.DemandRPS, MaxValue)
		}
		if !finiteIn(r.CapacityRPS, 0, MaxValue) {
			return invalid("region %q: CapacityRPS = %v: want a number from 0 to %v", r.Name, r.CapacityRPS, MaxValue)
		}
		if !finiteIn(r.EngineLatencyMs, 0, MaxValue) || r.EngineLatencyMs == 0 {
			return invalid("region %q: EngineLatencyMs = %v: want a number above 0 and at most %v", r.Name, r.EngineLatencyMs, MaxValue)
		}
		if r.EngineLatencyMs >= q.ShedPenaltyMs {
			return invalid("region %q: EngineLatencyMs = %v is not below ShedPenaltyMs = %v: raise the penalty, or shedding beats serving an idle region",
				r.Name, r.EngineLatencyMs, q.ShedPenaltyMs)
		}
	}
	if len(q.RTTms) != n {
		return invalid("RTTms has %d rows: want one per region (%d)", len(q.RTTms), n)
	}
	for i, row := range q.RTTms {
		if len(row) != n {
			return invalid("RTTms[%d] (region %q) has %d entries: want %d", i, q.Regions[i].Name, len(row), n)
		}
	}
	if !rttValid(q.RTTms) {
		return rttError(q)
	}
	return nil
}

// rttValid reports whether the square matrix rtt is a valid RTT matrix: a
// zero diagonal, every entry in [0, MaxValue] or +Inf, symmetric. It reads
// each entry once, in tiles so that the transposed reads stay in cache;
// rttError says what is wrong.
func rttValid(rtt [][]float64) bool {
	const tile = 64
	n := len(rtt)
	inf := math.Inf(1)
	ok := true
	for bi := 0; bi < n; bi += tile {
		for bj := bi; bj < n; bj += tile {
			for i := bi; i < min(bi+tile, n); i++ {
				row := rtt[i]
				if bj == bi && row[i] != 0 {
					ok = false
				}
				for j := max(bj, i+1); j < min(bj+tile, n); j++ {
					// NaN fails v == w.
					if v, w := row[j], rtt[j][i]; v != w || !(v >= 0) || (v > MaxValue && v != inf) {
						ok = false
					}
				}
			}
		}
	}
	return ok
}

// rttError returns the error for the first bad RTT entry in row order,
// or, when every entry is in range, the first asymmetric pair.
func rttError(q Problem) error {
	for i, row := range q.RTTms {
		for j, v := range row {
			if i == j && v != 0 {
				return invalid("RTTms[%d][%d] (%q to itself) = %v: want 0", i, j, q.Regions[i].Name, v)
			}
			if math.IsNaN(v) || v < 0 || (v > MaxValue && !math.IsInf(v, 1)) {
				return invalid("RTTms[%d][%d] (%q to %q) = %v: want 0 ≤ rtt ≤ %v, or +Inf for unreachable",
					i, j, q.Regions[i].Name, q.Regions[j].Name, v, MaxValue)
			}
		}
	}
	// Symmetry, in the tiles rttValid reads.
	const tile = 64
	n := len(q.RTTms)
	for bi := 0; bi < n; bi += tile {
		for bj := bi; bj < n; bj += tile {
			for i := bi; i < min(bi+tile, n); i++ {
				for j := max(bj, i+1); j < min(bj+tile, n); j++ {
					if v, w := q.RTTms[i][j], q.RTTms[j][i]; v != w {
						return invalid("RTTms[%d][%d] (%q to %q) = %v but RTTms[%d][%d] = %v: RTT must be symmetric",
							i, j, q.Regions[i].Name, q.Regions[j].Name, v, j, i, w)
					}
				}
			}
		}
	}
	return invalid("RTTms is not a valid RTT matrix")
}
