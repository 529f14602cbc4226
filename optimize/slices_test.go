package optimize

import (
	"errors"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

const (
	bandCritical  = 0
	bandStandard  = 1
	bandSheddable = 2
)

// Today's inputs (one standard, unconstrained slice per region) plan
// exactly as SolveLocalFirst, bit for bit.
func TestSlicesUnslicedEqualsLocalFirst(t *testing.T) {
	for _, n := range []int{1, 5, 40, 150} {
		for seed := range uint64(3) {
			p := randomProblem(newRand(seed, uint64(n)), n)
			if n > 1 {
				p.Regions[1].Down = true
				p.Regions[0].DemandRPS *= 3 // some shed somewhere
			}
			var sl []Slice
			for i, r := range p.Regions {
				sl = append(sl, Slice{Source: i, Band: bandStandard, RPS: r.DemandRPS})
			}
			want, err := SolveLocalFirst(p, 0.85)
			if err != nil {
				t.Fatal(err)
			}
			got, err := SolveSlices(p, sl, 0.85)
			if err != nil {
				t.Fatal(err)
			}
			if !plansIdentical(want, got.Plan) {
				t.Fatalf("n=%d seed=%d: SolveSlices' plan differs from SolveLocalFirst's", n, seed)
			}
			for k, s := range sl {
				if !rowsEqual(got.Fractions[k], want.Fractions[s.Source], got.Shed[k], want.Shed[s.Source]) {
					t.Fatalf("slice %d: row differs from its source's", k)
				}
			}
		}
	}
}

func plansIdentical(a, b Plan) bool {
	if len(a.Fractions) != len(b.Fractions) || a.CostMs != b.CostMs || a.Gap != b.Gap || a.Iterations != b.Iterations {
		return false
	}
	for i := range a.Fractions {
		if !rowsEqual(a.Fractions[i], b.Fractions[i], a.Shed[i], b.Shed[i]) || a.Load[i] != b.Load[i] {
			return false
		}
	}
	return true
}

func twoRegions() Problem {
	return Problem{
		Regions: []Region{
			{Name: "a", CapacityRPS: 100, EngineLatencyMs: 300},
			{Name: "b", CapacityRPS: 50, EngineLatencyMs: 300},
		},
		RTTms: [][]float64{{0, 20}, {20, 0}},
	}
}

func solveSlices(t *testing.T, p Problem, sl []Slice) SlicePlan {
	t.Helper()
	sp, err := SolveSlices(p, sl, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkSlicePlan(t, p, sl, sp)
	return sp
}

// checkSlicePlan checks the invariants of every slice plan: rows add up
// to 1, no share outside Allowed or to a region that cannot serve, the
// aggregate plan is valid for its problem and is the slices' rows
// weighted by demand.
func checkSlicePlan(t tb, p Problem, sl []Slice, sp SlicePlan) {
	t.Helper()
	n := len(p.Regions)
	for k, s := range sl {
		row := sp.Fractions[k]
		sum := sp.Shed[k]
		if sp.Shed[k] < -1e-12 || sp.Shed[k] > 1+1e-12 || math.IsNaN(sp.Shed[k]) {
			t.Fatalf("slice %d: shed %v", k, sp.Shed[k])
		}
		for j, f := range row {
			if f < 0 || math.IsNaN(f) {
				t.Fatalf("slice %d: fraction to %d = %v", k, j, f)
			}
			if f > 0 && !allows(s, j) {
				t.Fatalf("slice %d (allowed %v): %v routed to region %d outside its regions", k, s.Allowed, f, j)
			}
			sum += f
		}
		if p.Regions[s.Source].Down {
			if sum != 0 {
				t.Fatalf("slice %d of a down source has a row summing to %v", k, sum)
			}
			continue
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Fatalf("slice %d: fractions + shed = %v, want 1", k, sum)
		}
	}
	if len(sp.Plan.Fractions) != n {
		t.Fatalf("aggregate plan has %d rows for %d regions", len(sp.Plan.Fractions), n)
	}
	q := p
	q.Regions = append([]Region(nil), p.Regions...)
	for i := range q.Regions {
		q.Regions[i].DemandRPS = 0
	}
	for _, s := range sl {
		q.Regions[s.Source].DemandRPS += s.RPS
	}
	if c := Cost(q, sp.Plan); math.IsInf(c, 1) || math.Abs(c-sp.Plan.CostMs) > 1e-9*math.Max(1, c) {
		t.Fatalf("aggregate plan cost %v, CostMs %v: invalid for its problem", c, sp.Plan.CostMs)
	}
}

// shedRPS sums the shed rps of the slices of one band.
func shedRPS(sl []Slice, sp SlicePlan, band int) float64 {
	var s float64
	for k, x := range sl {
		if x.Band == band {
			s += sp.Shed[k] * x.RPS
		}
	}
	return s
}

// Under a shortfall the sheddable band absorbs it, shared evenly between
// its slices; standard and critical lose nothing.
func TestSlicesShedSheddableFirst(t *testing.T) {
	p := twoRegions()
	sl := []Slice{
		{Source: 0, Band: bandCritical, RPS: 40},
		{Source: 0, Band: bandStandard, RPS: 60},
		{Source: 0, Band: bandSheddable, RPS: 50},
		{Source: 1, Band: bandStandard, RPS: 20},
		{Source: 1, Band: bandSheddable, RPS: 20},
	}
	sp := solveSlices(t, p, sl)
	if s := shedRPS(sl, sp, bandCritical) + shedRPS(sl, sp, bandStandard); s > 1e-6 {
		t.Errorf("critical and standard shed %v rps, want 0 (sheds %v)", s, sp.Shed)
	}
	if s := shedRPS(sl, sp, bandSheddable); s < 50 {
		t.Errorf("sheddable shed %v rps, want the shortfall (> 50)", s)
	}
	if a, b := sp.Shed[2], sp.Shed[4]; math.Abs(a-b) > 0.02 {
		t.Errorf("sheddable slices shed %v and %v: want the same share", a, b)
	}
	// Today's policy (one band) sheds where the overload is, blind to
	// what it drops.
	today, err := SolveLocalFirst(Problem{Regions: []Region{
		{Name: "a", DemandRPS: 150, CapacityRPS: 100, EngineLatencyMs: 300},
		{Name: "b", DemandRPS: 40, CapacityRPS: 50, EngineLatencyMs: 300},
	}, RTTms: p.RTTms}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("today: shed a %.3f b %.3f; sliced: %v", today.Shed[0], today.Shed[1], sp.Shed)
}

// Critical demand beyond every capacity it may use is shed, and it takes
// all the capacity first: the other bands are shed entirely.
func TestSlicesCriticalExceedsCapacity(t *testing.T) {
	p := twoRegions()
	sl := []Slice{
		{Source: 0, Band: bandSheddable, RPS: 10},
		{Source: 0, Band: bandCritical, RPS: 200},
		{Source: 1, Band: bandStandard, RPS: 10},
	}
	sp := solveSlices(t, p, sl)
	if sp.Shed[0] < 1-1e-9 || sp.Shed[2] < 1-1e-9 {
		t.Errorf("sheddable shed %v, standard shed %v: want everything, critical does not fit", sp.Shed[0], sp.Shed[2])
	}
	served := (1 - sp.Shed[1]) * 200
	total := 0.9 * 150
	if served < 0.93*total || served >= total {
		t.Errorf("critical served %v rps, want nearly all of capacity·headroom %v", served, total)
	}
}

// A pinned slice whose regions are full is shed, never spilled; the
// unpinned demand of the same band spills to the room elsewhere.
func TestSlicesPinnedShedNotSpilled(t *testing.T) {
	p := twoRegions()
	sl := []Slice{
		{Source: 0, Band: bandStandard, RPS: 100, Allowed: []int{0}},
		{Source: 0, Band: bandStandard, RPS: 30},
	}
	sp := solveSlices(t, p, sl)
	if sp.Fractions[0][1] != 0 {
		t.Fatalf("pinned slice spilled %v to b", sp.Fractions[0][1])
	}
	if sp.Shed[0] <= 0 {
		t.Errorf("pinned slice sheds nothing although a is over capacity: row %v", sp.Fractions[0])
	}
	if sp.Fractions[1][1] <= 0 {
		t.Errorf("unpinned slice does not spill to b: row %v shed %v", sp.Fractions[1], sp.Shed[1])
	}
	if sp.Shed[1] > 1e-6 {
		t.Errorf("unpinned slice shed %v with room at b", sp.Shed[1])
	}
}

// Ties within a band: slices that compete for the same capacity keep the
// same share; one whose regions are full keeps what they allow and the
// other takes the rest (max-min fair).
func TestSlicesFairWithinBand(t *testing.T) {
	p := twoRegions()
	same := []Slice{
		{Source: 0, Band: bandCritical, RPS: 100, Allowed: []int{0, 1}},
		{Source: 1, Band: bandCritical, RPS: 100},
	}
	sp := solveSlices(t, p, same)
	if math.Abs(sp.Shed[0]-sp.Shed[1]) > 0.02 || sp.Shed[0] < 0.3 {
		t.Errorf("tied slices shed %v and %v: want the same share, about half", sp.Shed[0], sp.Shed[1])
	}
	narrow := []Slice{
		{Source: 0, Band: bandCritical, RPS: 100, Allowed: []int{1}},
		{Source: 0, Band: bandCritical, RPS: 100},
	}
	sp = solveSlices(t, p, narrow)
	if got := (1 - sp.Shed[0]) * 100; got < 40 || got > 45 {
		t.Errorf("slice pinned to b (capacity·headroom 45) served %v rps", got)
	}
	if got := (1 - sp.Shed[1]) * 100; got < 85 || got > 90 {
		t.Errorf("unpinned slice served %v rps, want the rest of a (capacity·headroom 90)", got)
	}
}

// With room everywhere nothing is shed, whatever the bands.
func TestSlicesNoShortfallShedsNothing(t *testing.T) {
	p := twoRegions()
	sl := []Slice{
		{Source: 0, Band: bandCritical, RPS: 20, Allowed: []int{0}},
		{Source: 0, Band: bandSheddable, RPS: 30},
		{Source: 1, Band: bandStandard, RPS: 20, Allowed: []int{1, 0}},
		{Source: 1, Band: bandSheddable, RPS: 0, Allowed: []int{0}},
	}
	sp := solveSlices(t, p, sl)
	for k := range sl {
		if sp.Shed[k] > 1e-9 {
			t.Errorf("slice %d shed %v with room everywhere", k, sp.Shed[k])
		}
	}
	if sp.Fractions[0][0] != 1 || sp.Fractions[2][1] != 1 {
		t.Errorf("covered demand left home: %v", sp.Fractions)
	}
	if sp.Fractions[3][0] != 1 {
		t.Errorf("a slice without demand pinned to a: row %v, want a", sp.Fractions[3])
	}
}

func TestSlicesErrors(t *testing.T) {
	p := twoRegions()
	for _, tc := range []struct {
		name string
		sl   []Slice
		want string
	}{
		{"source", []Slice{{Source: 2, RPS: 1}}, "slices[0].Source"},
		{"negative source", []Slice{{Source: -1, RPS: 1}}, "slices[0].Source"},
		{"band", []Slice{{Band: MaxBands, RPS: 1}}, "slices[0].Band"},
		{"nan", []Slice{{RPS: 1}, {RPS: math.NaN()}}, "slices[1].RPS"},
		{"negative", []Slice{{RPS: -1}}, "slices[0].RPS"},
		{"inf", []Slice{{RPS: math.Inf(1)}}, "slices[0].RPS"},
		{"empty allowed", []Slice{{RPS: 1, Allowed: []int{}}}, "slices[0].Allowed is empty"},
		{"allowed index", []Slice{{RPS: 1, Allowed: []int{0, 5}}}, "slices[0].Allowed[1]"},
		{"allowed twice", []Slice{{RPS: 1, Allowed: []int{1, 1}}}, "listed twice"},
		{"sum", []Slice{{RPS: MaxValue}, {RPS: MaxValue}}, "add up to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := SolveSlices(p, tc.sl, 0)
			if !errors.Is(err, ErrInvalidProblem) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalidProblem naming %q", err, tc.want)
			}
		})
	}
	if _, err := SolveSlices(p, []Slice{{RPS: 1, Band: 2}, {RPS: 1}}, 1.5); !errors.Is(err, ErrInvalidProblem) {
		t.Fatalf("bad fill: %v", err)
	}
	if _, err := SolveSlices(Problem{}, nil, 0); !errors.Is(err, ErrInvalidProblem) {
		t.Fatalf("empty problem: %v", err)
	}
}

// genSlices draws slices over p's regions: every band, pinned and
// unpinned, some without demand.
func genSlices(t *rapid.T, p Problem) []Slice {
	n := len(p.Regions)
	var sl []Slice
	for range rapid.IntRange(0, 12).Draw(t, "slices") {
		s := Slice{
			Source: rapid.IntRange(0, n-1).Draw(t, "source"),
			Band:   rapid.IntRange(0, 2).Draw(t, "band"),
			RPS:    rapid.SampledFrom([]float64{0, 1, 30, 100, 400}).Draw(t, "rps") * rapid.Float64Range(0.5, 1.5).Draw(t, "rpsScale"),
		}
		if rapid.Bool().Draw(t, "pinned") {
			for j := range n {
				if rapid.IntRange(0, 2).Draw(t, "allow") == 0 {
					s.Allowed = append(s.Allowed, j)
				}
			}
			if len(s.Allowed) == 0 {
				s.Allowed = []int{rapid.IntRange(0, n-1).Draw(t, "only")}
			}
		}
		sl = append(sl, s)
	}
	return sl
}

// Residency is never violated, rows add up, the aggregate plan is valid,
// and critical demand is shed only when the regions it may use are full
// (no critical shed while sheddable demand with the same regions is
// served).
func TestSlicesProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := genProblem(rt)
		sl := genSlices(rt, p)
		sp, err := SolveSlices(p, sl, rapid.Float64Range(0.5, 0.95).Draw(rt, "fill"))
		if err != nil {
			rt.Fatalf("SolveSlices: %v", err)
		}
		checkSlicePlan(rt, p, sl, sp)
		for k, a := range sl {
			for m, b := range sl {
				if a.Band == bandCritical && b.Band == bandSheddable && a.Source == b.Source && allowedKey(a.Allowed) == allowedKey(b.Allowed) &&
					sp.Shed[k] > 0.01 && sp.Shed[m] < 0.99 && b.RPS > 1e-3 && a.RPS > 1e-3 {
					rt.Fatalf("critical slice %d sheds %v while sheddable slice %d with the same route sheds only %v", k, sp.Shed[k], m, sp.Shed[m])
				}
			}
		}
	})
}
