package optimize

import (
	"math"
	"slices"
	"sort"
	"strconv"
)

// ShareUnit is the resolution of the shares in a Report: 1e-4.
const ShareUnit = 1e-4

// Report is a plan rounded for printing, the JSON output of `isobar
// global plan`. Field order is the output's key order; encoding/json
// writes maps sorted by key.
type Report struct {
	// Policy names the routing policy that made the plan.
	Policy string `json:"policy"`
	// Fractions: per up ingress region, the non-zero shares of its demand
	// by destination region, in whole ShareUnits; with the region's Shed
	// they add up to exactly 1.
	Fractions map[string]map[string]float64 `json:"fractions"`
	// Shed: per region, the share of its demand shed (0 for a down one).
	Shed map[string]float64 `json:"shed"`
	// CostMs and LocalOnlyCostMs: the plan's and the local-only plan's
	// mean expected ms per request, to 0.001 ms.
	CostMs          float64 `json:"cost_ms"`
	LocalOnlyCostMs float64 `json:"local_only_cost_ms"`
	// LoadRPS: per region, the load the plan sends it, to 0.001 rps.
	LoadRPS map[string]float64 `json:"load_rps"`
	// Iterations and Gap are the plan's, the gap to 3 significant digits.
	Iterations int     `json:"iterations"`
	Gap        float64 `json:"gap"`
	// Explain: per region, why its demand stayed, moved or was shed
	// (absent unless asked for).
	Explain map[string]ReportReason `json:"explain,omitempty"`
	// ShedByCriticality: per up source region, the demand shed in each
	// criticality (Criticalities), in requests/s to 0.001 (NewSliceReport
	// only).
	ShedByCriticality map[string]map[string]float64 `json:"shed_by_criticality,omitempty"`
	// Slices: per up source region, its demand slices in input order
	// (NewSliceReport only).
	Slices map[string][]ReportSlice `json:"slices,omitempty"`
}

// ReportSlice is one demand slice in a Report.
type ReportSlice struct {
	Criticality string `json:"criticality"`
	// AllowedRegions: where the slice may be served, in input order;
	// absent: any region.
	AllowedRegions []string `json:"allowed_regions,omitempty"`
	// RPS and ShedRPS: the slice's demand and what of it is shed, to
	// 0.001 requests/s.
	RPS     float64 `json:"rps"`
	ShedRPS float64 `json:"shed_rps"`
	// Fractions: the non-zero shares of the slice's demand by
	// destination, in whole ShareUnits; with ShedRPS/RPS (rounded the same
	// way) they add up to 1.
	Fractions map[string]float64 `json:"fractions"`
}

// ReportReason is one region's Explanation in a Report.
type ReportReason struct {
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
}

// NewReport rounds pl, a plan for p, for printing: every up region's
// shares and shed to whole ShareUnits, still adding up to exactly 1
// (largest remainders get the spare units), costs and loads to 0.001.
// policy labels the plan; ex, when not nil, becomes Explain (see
// ExplainLocalFirst). p must be valid and pl a plan for it.
func NewReport(p Problem, pl Plan, policy string, ex []Explanation) Report {
	out := Report{
		Policy:          policy,
		Fractions:       map[string]map[string]float64{},
		Shed:            map[string]float64{},
		LoadRPS:         map[string]float64{},
		CostMs:          round(pl.CostMs, 1e-3),
		LocalOnlyCostMs: round(LocalOnly(p).CostMs, 1e-3),
		Iterations:      pl.Iterations,
		Gap:             sigDigits(pl.Gap, 3),
	}
	n := len(p.Regions)
	for i, r := range p.Regions {
		out.LoadRPS[r.Name] = round(pl.Load[i], 1e-3)
		out.Shed[r.Name] = 0
		if r.Down {
			continue
		}
		units := roundRow(append(slices.Clone(pl.Fractions[i]), pl.Shed[i]))
		row := map[string]float64{}
		for j := range n {
			if units[j] > 0 {
				row[p.Regions[j].Name] = float64(units[j]) * ShareUnit
			}
		}
		out.Fractions[r.Name] = row
		out.Shed[r.Name] = float64(units[n]) * ShareUnit
	}
	if ex != nil {
		out.Explain = make(map[string]ReportReason, len(ex))
		for _, e := range ex {
			out.Explain[e.Region] = ReportReason{Verdict: e.Verdict, Reason: e.Reason}
		}
	}
	return out
}

// roundRow turns shares adding up to 1 into whole units of ShareUnit
// adding up to exactly 1/ShareUnit.
func roundRow(shares []float64) []int {
	const total = int(1 / ShareUnit)
	units := make([]int, len(shares))
	rest := make([]float64, len(shares))
	sum := 0
	for k, v := range shares {
		x := math.Max(v, 0) * float64(total)
		units[k] = int(math.Floor(x))
		rest[k] = x - float64(units[k])
		sum += units[k]
	}
	order := make([]int, len(shares))
	for k := range order {
		order[k] = k
	}
	sort.SliceStable(order, func(a, b int) bool { return rest[order[a]] > rest[order[b]] })
	for k := 0; sum < total && k < len(order); k++ {
		if rest[order[k]] > 0 {
			units[order[k]]++
			sum++
		}
	}
	for k := 0; sum > total && k < len(order); k++ { // rounding above 1
		if c := order[len(order)-1-k]; units[c] > 0 {
			units[c]--
			sum--
		}
	}
	return units
}

func round(v, unit float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return v
	}
	return math.Round(v/unit) * unit
}

func sigDigits(v float64, digits int) float64 {
	r, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', digits, 64), 64)
	if err != nil {
		return v
	}
	return r
}

// NewSliceReport is NewReport for a SlicePlan of p's slices sl (as
// SolveSlices returned it): the aggregate plan's report plus, per up
// source region, the shed by criticality and each slice's routes. p's
// demands must be the slices' sums (ParseSlicedInput gives them so).
func NewSliceReport(p Problem, sl []Slice, sp SlicePlan, policy string, ex []Explanation) Report {
	out := NewReport(p, sp.Plan, policy, ex)
	out.ShedByCriticality = map[string]map[string]float64{}
	out.Slices = map[string][]ReportSlice{}
	names := Criticalities()
	for _, r := range p.Regions {
		if r.Down {
			continue
		}
		byC := make(map[string]float64, len(names))
		for _, c := range names {
			byC[c] = 0
		}
		out.ShedByCriticality[r.Name] = byC
		out.Slices[r.Name] = []ReportSlice{}
	}
	n := len(p.Regions)
	for k, s := range sl {
		src := p.Regions[s.Source]
		if src.Down {
			continue
		}
		c := "band-" + strconv.Itoa(s.Band)
		if s.Band < len(names) {
			c = names[s.Band]
		}
		rs := ReportSlice{Criticality: c, RPS: round(s.RPS, 1e-3), ShedRPS: round(sp.Shed[k]*s.RPS, 1e-3), Fractions: map[string]float64{}}
		for _, j := range s.Allowed {
			rs.AllowedRegions = append(rs.AllowedRegions, p.Regions[j].Name)
		}
		units := roundRow(append(slices.Clone(sp.Fractions[k]), sp.Shed[k]))
		for j := range n {
			if units[j] > 0 {
				rs.Fractions[p.Regions[j].Name] = float64(units[j]) * ShareUnit
			}
		}
		out.ShedByCriticality[src.Name][c] += sp.Shed[k] * s.RPS
		out.Slices[src.Name] = append(out.Slices[src.Name], rs)
	}
	for _, byC := range out.ShedByCriticality {
		for c, v := range byC {
			byC[c] = round(v, 1e-3)
		}
	}
	return out
}
