package optimize

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// DefaultLocalFill is the share of capacity·headroom a region fills with
// its own demand before any of that demand leaves it (SolveLocalFirst).
const DefaultLocalFill = 0.9

// EngineLatencyBand is the relative spread within which SolveLocalFirst
// counts the regions' engine latencies as equal when it places the excess.
const EngineLatencyBand = 0.25

// equaliseLatencies gives every up region whose engine latency is within
// EngineLatencyBand of the median of the up regions' latencies that
// median, in place.
func equaliseLatencies(rs []Region) {
	var ls []float64
	for _, r := range rs {
		if !r.Down && r.EngineLatencyMs > 0 {
			ls = append(ls, r.EngineLatencyMs)
		}
	}
	if len(ls) < 2 {
		return
	}
	slices.Sort(ls)
	med := ls[len(ls)/2]
	for i := range rs {
		if l := rs[i].EngineLatencyMs; !rs[i].Down && l > 0 && math.Abs(l-med) <= EngineLatencyBand*med {
			rs[i].EngineLatencyMs = med
		}
	}
}

// SolveLocalFirst is the routing policy of the design: keep each region's
// demand local while its own headroom covers it, spill the rest to the
// nearest regions with room, and shed only what no region can serve.
//
// It solves in two stages. First every up region i with capacity serves
// l_i = min(d_i, fill·c_i·h) of its own demand at home, whatever the RTTs;
// a region whose demand stays under fill·c_i·h keeps a local-only row even
// when a remote region is idler (the latency model alone would send some
// of it away once local load raises its marginal latency above a remote
// one's plus the RTT). Then Solve places the residual demand d_i − l_i on
// the residual capacities, c_j − l_j/h (the room left under c_j·h): the
// cost of an option there is its RTT plus the engine's marginal latency,
// so the excess goes to the nearest region with room first, stays home as
// far as home has room, and is shed only where no region's marginal
// latency stays under the shed penalty. In that solve, engine latencies
// within EngineLatencyBand of each other count as equal (their median):
// a region's measured low-load latency carries tens of milliseconds of
// noise, as much as the RTT between neighbours, and the excess would
// otherwise go to a farther region whose engines happened to look
// quicker. A region more than the band away keeps its own.
//
// fill is in (0, 1]; 0 means DefaultLocalFill. The plan's Load and CostMs
// are evaluated on p; its Gap and Iterations are the residual solve's (0
// when no demand is left over). By design the plan can cost more than
// Solve's latency optimum: it trades modelled latency for locality. p must
// be valid (see Validate).
func SolveLocalFirst(p Problem, fill float64) (Plan, error) {
	fills := make([]float64, len(p.Regions))
	for i := range fills {
		fills[i] = fill
	}
	return SolveLocalFirstFills(p, fills)
}

// SolveLocalFirstFills is SolveLocalFirst with a fill share per region
// (fills[i] for p.Regions[i]; 0 means DefaultLocalFill): the planner gives
// a region that is not spilling a higher fill than one that is, so a
// region near its threshold does not flap between local-only and spill.
func SolveLocalFirstFills(p Problem, fills []float64) (Plan, error) {
	if err := p.Validate(); err != nil {
		return Plan{}, err
	}
	fills, err := checkFills(p, fills)
	if err != nil {
		return Plan{}, err
	}
	q := p.withDefaults()
	n := len(q.Regions)
	res, local, anyResidual := residualProblem(q, fills)
	pl := newPlan(n)
	var rp Plan
	if anyResidual {
		equaliseLatencies(res.Regions)
		if err := res.Validate(); err != nil {
			return Plan{}, fmt.Errorf("optimize: residual problem: %w", err)
		}
		rp = solveModel(res, true)
		pl.Iterations = rp.Iterations
	}
	for i, r := range q.Regions {
		d := r.DemandRPS
		switch {
		case r.Down:
			continue
		case d < MinValue:
			// No demand: the row a new request takes, home when home can
			// serve (the local-first rule), else the residual plan's.
			if r.CapacityRPS >= MinValue || !anyResidual {
				if r.CapacityRPS >= MinValue {
					pl.Fractions[i][i] = 1
				} else {
					pl.Shed[i] = 1
				}
				continue
			}
			copy(pl.Fractions[i], rp.Fractions[i])
			pl.Shed[i] = rp.Shed[i]
			continue
		case local[i] >= d || !anyResidual || res.Regions[i].DemandRPS < MinValue:
			if local[i] > 0 {
				pl.Fractions[i][i] = local[i] / d
			}
			pl.Shed[i] = 1 - pl.Fractions[i][i]
			continue
		}
		rd := res.Regions[i].DemandRPS
		for j := range n {
			pl.Fractions[i][j] = rp.Fractions[i][j] * rd / d
		}
		pl.Fractions[i][i] += local[i] / d
		pl.Shed[i] = rp.Shed[i] * rd / d
	}
	m := compile(q)
	m.finish(&pl)
	// The gap that means something here is the residual solve's: how far
	// the spill is from the best placement of the excess.
	pl.Gap = 0
	if anyResidual {
		pl.Gap = rp.Gap
	}
	return pl, nil
}

// residualProblem splits q (with defaults) into what each region serves
// at home, local[i] (its fill share of its capacity, at most its demand),
// and the residual problem of the rest; anyResidual reports whether any
// region has residual demand.
func residualProblem(q Problem, fills []float64) (res Problem, local []float64, anyResidual bool) {
	n := len(q.Regions)
	local = make([]float64, n)
	res = q
	res.Regions = make([]Region, n)
	for i, r := range q.Regions {
		res.Regions[i] = r
		if r.Down {
			continue
		}
		if r.CapacityRPS >= MinValue && r.DemandRPS >= MinValue {
			local[i] = math.Min(r.DemandRPS, fills[i]*r.CapacityRPS*q.Headroom)
			res.Regions[i].DemandRPS = r.DemandRPS - local[i]
			res.Regions[i].CapacityRPS = math.Max(0, r.CapacityRPS-local[i]/q.Headroom)
		}
		if res.Regions[i].DemandRPS >= MinValue {
			anyResidual = true
		}
	}
	return res, local, anyResidual
}

// Verdicts of an Explanation.
const (
	VerdictDown  = "down"
	VerdictIdle  = "idle"
	VerdictLocal = "local"
	VerdictSpill = "spill"
	VerdictShed  = "shed"
)

// Explanation says why a region's demand stayed, moved or was shed in a
// local-first plan.
type Explanation struct {
	Region string
	// Verdict is one of the Verdict constants: shed when any demand is
	// shed, else spill when any leaves the region, else local (idle: no
	// demand; down: not planned).
	Verdict string
	// Reason is a sentence with the figures behind the verdict.
	Reason string
}

// ExplainLocalFirst explains pl, a plan SolveLocalFirst(p, fill) returned,
// region by region: the local fill threshold against the demand, where
// the excess went (destinations nearest first, with their RTT) and what
// was shed because no region had room. p must be valid.
func ExplainLocalFirst(p Problem, fill float64, pl Plan) ([]Explanation, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if fill == 0 {
		fill = DefaultLocalFill
	}
	q := p.withDefaults()
	n := len(q.Regions)
	if len(pl.Fractions) != n || len(pl.Shed) != n {
		return nil, invalid("plan has %d rows for %d regions", len(pl.Fractions), n)
	}
	out := make([]Explanation, n)
	for i, r := range q.Regions {
		e := Explanation{Region: r.Name}
		d := r.DemandRPS
		threshold := fill * r.CapacityRPS * q.Headroom
		switch {
		case r.Down:
			e.Verdict, e.Reason = VerdictDown, "region down: its demand is not planned and it receives no traffic"
		case d < MinValue:
			e.Verdict, e.Reason = VerdictIdle, "no demand"
		default:
			home := pl.Fractions[i][i] * d
			shed := pl.Shed[i] * d
			type dest struct {
				name     string
				rps, rtt float64
			}
			var away []dest
			for j, f := range pl.Fractions[i] {
				if j != i && f*d >= MinValue {
					away = append(away, dest{q.Regions[j].Name, f * d, q.RTTms[i][j]})
				}
			}
			slices.SortFunc(away, func(a, b dest) int { return cmp.Compare(a.rtt, b.rtt) })
			var b strings.Builder
			if d <= threshold {
				fmt.Fprintf(&b, "demand %.3g rps is within the local fill %.3g rps (%.0f %% of capacity %.3g × headroom %.3g): kept home",
					d, threshold, 100*fill, r.CapacityRPS, q.Headroom)
			} else {
				fmt.Fprintf(&b, "demand %.3g rps exceeds the local fill %.3g rps (%.0f %% of capacity %.3g × headroom %.3g): %.3g rps served at home",
					d, threshold, 100*fill, r.CapacityRPS, q.Headroom, home)
			}
			if len(away) > 0 {
				b.WriteString("; the excess spilled nearest first:")
				for k, a := range away {
					if k > 0 {
						b.WriteString(",")
					}
					fmt.Fprintf(&b, " %.3g rps to %s (RTT %.3g ms)", a.rps, a.name, a.rtt)
				}
			}
			if shed >= MinValue {
				fmt.Fprintf(&b, "; %.3g rps shed: no region had room left below the shed penalty (%.0f ms per request)", shed, q.ShedPenaltyMs)
			}
			e.Reason = b.String()
			switch {
			case shed >= MinValue:
				e.Verdict = VerdictShed
			case len(away) > 0:
				e.Verdict = VerdictSpill
			default:
				e.Verdict = VerdictLocal
			}
		}
		out[i] = e
	}
	return out, nil
}
