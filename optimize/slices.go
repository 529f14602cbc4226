package optimize

import (
	"math"
	"slices"
	"strconv"
	"strings"
)

// Bounds on SolveSlices' input.
const (
	// MaxBands bounds Slice.Band: bands 0 to MaxBands−1.
	MaxBands = 8
	// MaxSlices bounds the number of slices of one SolveSlices call (64
	// per region at MaxRegions).
	MaxSlices = 64 * MaxRegions
)

// Slice is demand that shares a source region, a band and the regions it
// may be served in.
type Slice struct {
	// Source is the index of the slice's ingress region in Problem.Regions.
	Source int
	// Band orders shedding: 0 is the most important, higher bands are
	// shed first (callers pass a criticality: 0 critical, 1 standard, 2
	// sheddable). 0 to MaxBands−1.
	Band int
	// Allowed lists the indexes of the regions the slice may be served
	// in; nil means any region. A non-nil empty list is an error (a slice
	// allowed nowhere would only be shed: say so with a region that is
	// down, or drop the slice).
	Allowed []int
	// RPS is the slice's demand (requests/s, 0 to MaxValue; below
	// MinValue counts as 0).
	RPS float64
}

// SlicePlan is SolveSlices' answer.
type SlicePlan struct {
	// Fractions[k][j] is the share of slice k's demand served at region j:
	// 0 outside the slice's Allowed, always. With Shed[k] a row adds up
	// to 1 for a slice of an up source (all zero for a down one).
	Fractions [][]float64
	// Shed[k] is the share of slice k's demand shed at its ingress.
	Shed []float64
	// Plan is the aggregate per source region, each row the slices' rows
	// weighted by their demand, as SolveLocalFirst returns it; its Load and
	// CostMs are evaluated on the problem whose demands are the slices'.
	Plan Plan
}

// SolveSlices plans demand given as slices: which share of each slice is
// served where, and which share is shed. Region i's demand is the sum of
// the slices whose Source is i; Problem.Regions[i].DemandRPS is ignored.
//
// Under a shortfall the highest band is shed first, then the next: band b
// loses demand only when the demand of bands 0..b itself exceeds every
// capacity it may use. Within a band, admission is max-min fair between
// slices: every slice keeps the same share of its demand unless the
// regions it may use are full, and then those slices keep the largest
// common share their regions allow and the others go on. What is
// admitted is routed as SolveLocalFirst routes: demand stays home while
// its region's headroom covers it (a pinned slice stays home when its
// region is among its Allowed), the excess is placed by Solve nearest
// region with room first, on the same latency objective and capacity
// model; a slice never gets a share outside its Allowed, and a pinned
// slice whose regions are full is shed, never spilled elsewhere.
//
// When every slice is unconstrained (Allowed nil) and all are in one
// band, the plan is SolveLocalFirstFills' on the aggregate demand, bit for
// bit, and each slice takes its source's row: the shed is where the
// latency model sheds, at the overloaded ingress. Otherwise admission
// comes first (see admit), then routing (see routeSlices); the routing
// solve may shed a little more than admission planned (a remote route
// near the knee costs the RTT above the penalty), and that shed is taken
// from the highest band of the slices that share the route first.
//
// fill is SolveLocalFirst's; SolveSlicesFills takes one per region. p
// must be valid; bad slices give an error wrapping ErrInvalidProblem
// that names the slice and field.
func SolveSlices(p Problem, sl []Slice, fill float64) (SlicePlan, error) {
	fills := make([]float64, len(p.Regions))
	for i := range fills {
		fills[i] = fill
	}
	return SolveSlicesFills(p, sl, fills)
}

// SolveSlicesFills is SolveSlices with a local fill share per region, as
// SolveLocalFirstFills takes them.
func SolveSlicesFills(p Problem, sl []Slice, fills []float64) (SlicePlan, error) {
	q, err := sliceProblem(p, sl)
	if err != nil {
		return SlicePlan{}, err
	}
	if unsliced(sl) {
		pl, err := SolveLocalFirstFills(q, fills)
		if err != nil {
			return SlicePlan{}, err
		}
		return fromSourceRows(q, sl, pl), nil
	}
	fl, err := checkFills(q, fills)
	if err != nil {
		return SlicePlan{}, err
	}
	q = q.withDefaults()
	admitted := admit(q, sl, fl)
	return routeSlices(q, sl, admitted, fl), nil
}

// checkFills returns a copy of fills with 0 replaced by DefaultLocalFill,
// or an error naming the bad one.
func checkFills(q Problem, fills []float64) ([]float64, error) {
	if len(fills) != len(q.Regions) {
		return nil, invalid("%d local fills for %d regions", len(fills), len(q.Regions))
	}
	out := append([]float64(nil), fills...)
	for i, f := range out {
		if f == 0 {
			out[i] = DefaultLocalFill
		} else if math.IsNaN(f) || f <= 0 || f > 1 {
			return nil, invalid("local fill %v of region %q: want a share in (0, 1]", f, q.Regions[i].Name)
		}
	}
	return out, nil
}

// sliceProblem validates p and sl and returns p with each region's demand
// replaced by the sum of its slices.
func sliceProblem(p Problem, sl []Slice) (Problem, error) {
	if err := p.Validate(); err != nil {
		return Problem{}, err
	}
	n := len(p.Regions)
	if len(sl) > MaxSlices {
		return Problem{}, invalid("%d slices: at most %d", len(sl), MaxSlices)
	}
	q := p
	q.Regions = slices.Clone(p.Regions)
	for i := range q.Regions {
		q.Regions[i].DemandRPS = 0
	}
	for k, s := range sl {
		if err := checkSlice(k, s, n); err != nil {
			return Problem{}, err
		}
		q.Regions[s.Source].DemandRPS += sliceRPS(s)
	}
	for _, r := range q.Regions {
		if !finiteIn(r.DemandRPS, 0, MaxValue) {
			return Problem{}, invalid("region %q: its slices add up to %v rps: at most %v", r.Name, r.DemandRPS, MaxValue)
		}
	}
	return q, nil
}

// checkSlice checks slice k against a problem of n regions.
func checkSlice(k int, s Slice, n int) error {
	switch {
	case s.Source < 0 || s.Source >= n:
		return invalid("slices[%d].Source = %d: want a region index in [0, %d)", k, s.Source, n)
	case s.Band < 0 || s.Band >= MaxBands:
		return invalid("slices[%d].Band = %d: want 0 to %d", k, s.Band, MaxBands-1)
	case !finiteIn(s.RPS, 0, MaxValue):
		return invalid("slices[%d].RPS = %v: want a number from 0 to %v", k, s.RPS, MaxValue)
	case s.Allowed != nil && len(s.Allowed) == 0:
		return invalid("slices[%d].Allowed is empty: nil means any region; list at least one region", k)
	case len(s.Allowed) > n:
		return invalid("slices[%d].Allowed has %d entries for %d regions", k, len(s.Allowed), n)
	}
	seen := make(map[int]bool, len(s.Allowed))
	for a, j := range s.Allowed {
		if j < 0 || j >= n {
			return invalid("slices[%d].Allowed[%d] = %d: want a region index in [0, %d)", k, a, j, n)
		}
		if seen[j] {
			return invalid("slices[%d].Allowed[%d] = %d: listed twice", k, a, j)
		}
		seen[j] = true
	}
	return nil
}

// sliceRPS is s's demand as the model uses it: below MinValue is 0.
func sliceRPS(s Slice) float64 {
	if s.RPS < MinValue {
		return 0
	}
	return s.RPS
}

// unsliced reports whether every slice is unconstrained and all share one
// band: then admission has nothing to order and the aggregate plan is
// SolveLocalFirstFills'.
func unsliced(sl []Slice) bool {
	for _, s := range sl {
		if s.Allowed != nil || s.Band != sl[0].Band {
			return false
		}
	}
	return true
}

// fromSourceRows gives every slice its source's row of pl.
func fromSourceRows(q Problem, sl []Slice, pl Plan) SlicePlan {
	out := newSlicePlan(len(sl), len(q.Regions))
	for k, s := range sl {
		if q.Regions[s.Source].Down {
			continue
		}
		copy(out.Fractions[k], pl.Fractions[s.Source])
		out.Shed[k] = pl.Shed[s.Source]
	}
	out.Plan = pl
	return out
}

func newSlicePlan(k, n int) SlicePlan {
	out := SlicePlan{Fractions: make([][]float64, k), Shed: make([]float64, k)}
	flat := make([]float64, k*n)
	for i := range out.Fractions {
		out.Fractions[i] = flat[i*n : (i+1)*n : (i+1)*n]
	}
	return out
}

// allowedKey names a slice's Allowed set canonically ("" for any region).
func allowedKey(allowed []int) string {
	if allowed == nil {
		return ""
	}
	s := slices.Clone(allowed)
	slices.Sort(s)
	var b strings.Builder
	b.WriteByte('=')
	for _, j := range s {
		b.WriteString(strconv.Itoa(j))
		b.WriteByte(',')
	}
	return b.String()
}

// allows reports whether s may be served at region j.
func allows(s Slice, j int) bool {
	return s.Allowed == nil || slices.Contains(s.Allowed, j)
}
