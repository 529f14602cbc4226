package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/optimize"
)

type globalPlanFlags struct {
	input     string
	output    string
	policy    string
	localFill float64
	explain   bool
}

// globalPlanLong is the command's --help text.
const globalPlanLong = `plan solves the cross-region routing problem the global controller solves
each cycle, for demand, capacity and RTT given in a JSON file, and prints the
plan: which share of each region's ingress demand is served where, and which
share is shed.

Cost. Region i has demand d_i (requests/s), capacity c_i (requests/s at SLO)
and engine latency L0_i at low load (ms); headroom h scales every capacity;
rtt_ij is the round-trip time (ms). The plan sends x_ij of i's demand to j and
sheds s_i, minimising the total expected latency

    sum_ij x_ij * (rtt_ij + L_j(load_j))  +  P * sum_i s_i

where load_j = sum_i x_ij and P is the shed penalty (default 10000 ms per
request). cost_ms is that total divided by the total demand: the mean expected
ms per request, a shed request counted at P.

Latency model. With u = load / (c * h),

    L(u) = L0 * (1 + beta * u^k / (1 - u)),   beta 0.1, k 4 by default:

flat at low load, a knee near capacity (a continuous-batching engine: TTFT
barely moves until the batch is full, then queueing dominates), infinite at
u = 1, so no region is ever planned at or above c * h. A region is loaded only
as far as its marginal latency stays below P (about 95 % of c * h with the
defaults), so demand is shed only when it approaches what can be served, and
explicitly rather than by overloading anyone. local_only_cost_ms is the cost
of serving every region's demand locally that way and shedding the rest.

Input (--input FILE, or - for stdin):

    {"headroom": 0.9,
     "regions": [{"name": "a", "demand_rps": 90, "capacity_rps": 100,
                  "engine_latency_ms": 300}, ...],
     "rtt_ms": {"a": {"b": 20, "c": 60}, "b": {"c": 30}}}

A region may give its demand as slices instead of demand_rps:

    "demand": [{"rps": 30, "criticality": "critical", "allowed_regions": ["a"]},
               {"rps": 60}]

criticality is critical, standard (the default) or sheddable; without
allowed_regions a slice may be served anywhere, with it only in the regions
named. Under a shortfall sheddable demand is shed first, then standard;
critical only when critical demand alone exceeds every capacity it may use.
A slice pinned to regions that are full is shed, never spilled. Giving both
demand_rps and demand is an error unless they agree.

headroom (default 0.9) must be in (0, 1] (at least 0.001). Optional "beta",
"k" (1 to 64) and "shed_penalty_ms" (above every engine_latency_ms) change
the model. Demand and capacity are 0 to 1e9 requests/s (below 1e-6 counts as
0); a region without capacity serves nothing, one with "down": true also
sends nothing. RTT is symmetric: give each pair once, in either direction
(both directions must agree); a missing pair is unreachable.
Unknown fields, duplicate keys or regions, and out-of-range numbers are errors.

Policy (--policy). local-first (the default, what the global controller
runs): each region keeps min(demand, fill * c * h) at home (--local-fill,
default 0.9), and only the excess is placed by the cost above, on the room
left: nearest region with room first; only what no region can serve below
the shed penalty is shed. latency: the cost above alone, which at moderate
load already moves demand to an idler remote region when its latency plus
the RTT undercuts a loaded home's.

--explain (local-first only) adds, per region, why its demand stayed, moved
or was shed: a verdict (local, spill, shed, idle, down) and the figures.

Output (--output json, the default): fractions (per ingress region, the
non-zero shares by destination, 4 decimals, adding up to 1 with its shed),
shed, cost_ms, local_only_cost_ms, load_rps, iterations (solver rounds) and
gap (the Frank-Wolfe duality gap in ms per request: cost_ms exceeds the
optimum by at most gap). local-first also prints, per source region,
shed_by_criticality (rps shed in each criticality) and slices (one entry per
demand slice in input order: criticality, allowed_regions, rps, shed_rps and
fractions by destination); a region with demand_rps is one standard slice.
--output text prints a table.

Exit status: 0 on success, 2 for a bad command line or bad input.`

// newGlobalPlanCmd builds `isobar global plan`, the offline what-if of the
// cross-region optimiser. It reads the command's input and writes its
// output writer (the root sets both); it needs nothing else from ro.
func newGlobalPlanCmd(_ *rootOpts) *cobra.Command {
	f := &globalPlanFlags{}
	cmd := &cobra.Command{
		Use:   "plan --input FILE.json",
		Short: "Offline what-if: the cross-region routing plan for given demand, capacity and RTT",
		Long:  globalPlanLong,
		Example: `  isobar global plan --input regions.json
  isobar global plan --input - --output text < regions.json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("plan takes no arguments, got %q", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	fl := cmd.Flags()
	fl.StringVarP(&f.input, "input", "i", "", "problem as JSON: a file, or - for stdin (required)")
	fl.StringVarP(&f.output, "output", "o", "json", "output format: json or text")
	fl.StringVar(&f.policy, "policy", "local-first", "routing policy: local-first (what the global controller runs) or latency (the latency optimum alone)")
	fl.Float64Var(&f.localFill, "local-fill", optimize.DefaultLocalFill, "local-first: share of capacity*headroom a region fills with its own demand before spilling, in (0, 1]")
	fl.BoolVar(&f.explain, "explain", false, "say per region why its demand stayed, moved or was shed (local-first only)")
	return cmd
}

func (f *globalPlanFlags) run(cmd *cobra.Command) error {
	if f.output != "json" && f.output != "text" {
		return usageError{fmt.Errorf("--output %q: want json or text", f.output)}
	}
	if f.input == "" {
		return usageError{errors.New("--input is required: a JSON file, or - for stdin")}
	}
	if f.policy != "local-first" && f.policy != "latency" {
		return usageError{fmt.Errorf("--policy %q: want local-first or latency", f.policy)}
	}
	if f.explain && f.policy != "local-first" {
		return usageError{errors.New("--explain explains the local-first policy: drop --policy latency")}
	}
	if !(f.localFill > 0 && f.localFill <= 1) {
		return usageError{fmt.Errorf("--local-fill %v: want a share in (0, 1]", f.localFill)}
	}
	var r io.Reader
	if f.input == "-" {
		r = cmd.InOrStdin()
	} else {
		file, err := os.Open(f.input)
		if err != nil {
			return usageError{fmt.Errorf("--input: %w", err)}
		}
		defer file.Close()
		r = file
	}
	in, err := optimize.ReadSlicedInput(r)
	if err != nil {
		return usageError{fmt.Errorf("--input %s: %w", f.input, err)}
	}
	p := in.Problem
	out, pl, err := f.solve(in)
	if err != nil {
		return usageError{fmt.Errorf("--input %s: %w", f.input, err)}
	}
	w := cmd.OutOrStdout()
	if f.output == "text" {
		if err := writePlanText(w, p, pl, out); err != nil {
			return err
		}
		return writeSlicesText(w, p, out)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// solve plans in by the chosen policy and returns the report and the
// (aggregate) plan.
func (f *globalPlanFlags) solve(in optimize.SlicedInput) (optimize.Report, optimize.Plan, error) {
	p := in.Problem
	if f.policy == "latency" {
		if in.Sliced {
			return optimize.Report{}, optimize.Plan{}, errors.New("--policy latency plans one demand per region: give demand_rps, or use --policy local-first for demand slices")
		}
		pl, err := optimize.Solve(p)
		return optimize.NewReport(p, pl, f.policy, nil), pl, err
	}
	sp, err := optimize.SolveSlices(p, in.Slices, f.localFill)
	if err != nil {
		return optimize.Report{}, optimize.Plan{}, err
	}
	var ex []optimize.Explanation
	if f.explain {
		if ex, err = optimize.ExplainLocalFirst(p, f.localFill, sp.Plan); err != nil {
			return optimize.Report{}, optimize.Plan{}, err
		}
	}
	return optimize.NewSliceReport(p, in.Slices, sp, f.policy, ex), sp.Plan, nil
}

// writeSlicesText prints, after the table, each source region's demand
// slices (when any region has more than one, or one that is not
// standard and unconstrained): criticality, allowed regions, demand,
// shed and routes.
func writeSlicesText(w io.Writer, p optimize.Problem, out optimize.Report) error {
	plain := true
	for _, list := range out.Slices {
		for _, s := range list {
			plain = plain && len(list) == 1 && s.Criticality == "standard" && s.AllowedRegions == nil
		}
	}
	if plain {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLICES\tCRITICALITY\tALLOWED\tRPS\tSHED_RPS\tROUTES")
	for _, r := range p.Regions {
		for _, s := range out.Slices[r.Name] {
			allowed := "any"
			if s.AllowedRegions != nil {
				allowed = strings.Join(s.AllowedRegions, ",")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%.3f\t%s\n", r.Name, s.Criticality, allowed, s.RPS, s.ShedRPS, routesText(s.Fractions))
		}
	}
	return tw.Flush()
}

// routesText prints shares by destination, sorted by name ("-": none).
func routesText(row map[string]float64) string {
	if len(row) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(row))
	for _, dst := range slices.Sorted(maps.Keys(row)) {
		parts = append(parts, fmt.Sprintf("%s %.4f", dst, row[dst]))
	}
	return strings.Join(parts, ", ")
}

// writePlanText prints the plan as a table, one row per region, then the
// cost line and, with --explain, the reasons.
func writePlanText(w io.Writer, p optimize.Problem, pl optimize.Plan, out optimize.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tDEMAND_RPS\tCAPACITY_RPS\tLOAD_RPS\tUTIL\tLATENCY_MS\tSHED\tROUTES")
	for i, r := range p.Regions {
		util, latency := "-", "-"
		if c := r.CapacityRPS * p.Headroom; c > 0 && !r.Down {
			util = strconv.FormatFloat(pl.Load[i]/c, 'f', 3, 64)
			latency = strconv.FormatFloat(optimize.EngineLatency(p, i, pl.Load[i]), 'f', 1, 64)
		}
		routes := routesText(out.Fractions[r.Name])
		if r.Down {
			routes = "(down)"
		}
		fmt.Fprintf(tw, "%s\t%g\t%g\t%.3f\t%s\t%s\t%.4f\t%s\n",
			r.Name, r.DemandRPS, r.CapacityRPS, pl.Load[i], util, latency, out.Shed[r.Name], routes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "cost %.3f ms per request (local-only %.3f ms), headroom %g, policy %s, %d iterations, gap %.3g ms\n",
		out.CostMs, out.LocalOnlyCostMs, p.Headroom, out.Policy, out.Iterations, out.Gap); err != nil {
		return err
	}
	if len(out.Explain) > 0 {
		if _, err := fmt.Fprintln(w, "why:"); err != nil {
			return err
		}
		for _, r := range p.Regions {
			e := out.Explain[r.Name]
			if _, err := fmt.Fprintf(w, "  %s: %s: %s\n", r.Name, e.Verdict, e.Reason); err != nil {
				return err
			}
		}
	}
	return nil
}
