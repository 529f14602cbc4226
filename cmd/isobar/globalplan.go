package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/optimize"
)

// maxPlanInputBytes caps what `isobar global plan` reads.
const maxPlanInputBytes = 16 << 20

// maxRegionNameBytes caps a region name in the plan input.
const maxRegionNameBytes = 128

type globalPlanFlags struct {
	input     string
	output    string
	policy    string
	localFill float64
	explain   bool
}

// newGlobalPlanCmd builds `isobar global plan`, the offline what-if of the
// cross-region optimiser. It reads the command's input and writes its
// output writer (the root sets both); it needs nothing else from ro.
func newGlobalPlanCmd(_ *rootOpts) *cobra.Command {
	f := &globalPlanFlags{}
	cmd := &cobra.Command{
		Use:   "plan --input FILE.json",
		Short: "Offline what-if: the cross-region routing plan for given demand, capacity and RTT",
		Long: `plan solves the cross-region routing problem the global controller solves
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
optimum by at most gap). --output text prints a table.

Exit status: 0 on success, 2 for a bad command line or bad input.`,
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
	data, err := io.ReadAll(io.LimitReader(r, maxPlanInputBytes+1))
	if err != nil {
		return usageError{fmt.Errorf("--input %s: %w", f.input, err)}
	}
	if len(data) > maxPlanInputBytes {
		return usageError{fmt.Errorf("--input %s: larger than %d bytes", f.input, maxPlanInputBytes)}
	}
	p, err := parsePlanInput(data)
	if err != nil {
		return usageError{fmt.Errorf("--input %s: %w", f.input, err)}
	}
	var pl optimize.Plan
	if f.policy == "latency" {
		pl, err = optimize.Solve(p)
	} else {
		pl, err = optimize.SolveLocalFirst(p, f.localFill)
	}
	if err != nil {
		return usageError{fmt.Errorf("--input %s: %w", f.input, err)}
	}
	out := renderPlan(p, pl)
	out.Policy = f.policy
	if f.explain {
		ex, err := optimize.ExplainLocalFirst(p, f.localFill, pl)
		if err != nil {
			return usageError{fmt.Errorf("--input %s: %w", f.input, err)}
		}
		out.Explain = map[string]planExplanation{}
		for _, e := range ex {
			out.Explain[e.Region] = planExplanation{Verdict: e.Verdict, Reason: e.Reason}
		}
	}
	w := cmd.OutOrStdout()
	if f.output == "text" {
		return writePlanText(w, p, pl, out)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// planFields lists the top-level input fields.
func planFields() []string {
	return []string{"headroom", "beta", "k", "shed_penalty_ms", "regions", "rtt_ms"}
}

// regionFields lists a region's input fields.
func regionFields() []string {
	return []string{"name", "demand_rps", "capacity_rps", "engine_latency_ms", "down"}
}

// parsePlanInput parses and checks the JSON input of `global plan`. Every
// error names the offending field by its JSON path.
func parsePlanInput(data []byte) (optimize.Problem, error) {
	if err := checkJSONKeys(data); err != nil {
		return optimize.Problem{}, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil || top == nil {
		return optimize.Problem{}, fmt.Errorf("want a JSON object with %s", strings.Join(planFields(), ", "))
	}
	for _, k := range sortedKeys(top) {
		if !slices.Contains(planFields(), k) {
			return optimize.Problem{}, fmt.Errorf("unknown field %q (known: %s)", k, strings.Join(planFields(), ", "))
		}
	}
	p := optimize.Problem{
		Headroom:      optimize.DefaultHeadroom,
		Beta:          optimize.DefaultBeta,
		K:             optimize.DefaultK,
		ShedPenaltyMs: optimize.DefaultShedPenaltyMs,
	}
	for _, num := range []struct {
		key    string
		dst    *float64
		lo, hi float64
		want   string
	}{
		{"headroom", &p.Headroom, optimize.MinHeadroom, 1, "want 0 < headroom ≤ 1 (at least 0.001)"},
		{"beta", &p.Beta, optimize.MinValue, optimize.MaxValue, fmt.Sprintf("want %g ≤ beta ≤ %g", optimize.MinValue, optimize.MaxValue)},
		{"k", &p.K, 1, optimize.MaxK, fmt.Sprintf("want 1 ≤ k ≤ %g", optimize.MaxK)},
		{"shed_penalty_ms", &p.ShedPenaltyMs, optimize.MinValue, optimize.MaxValue, fmt.Sprintf("want a penalty in ms, %g to %g", optimize.MinValue, optimize.MaxValue)},
	} {
		raw, ok := top[num.key]
		if !ok {
			continue
		}
		v, err := jsonNumber(raw, num.key)
		if err != nil {
			return optimize.Problem{}, err
		}
		if !(v >= num.lo && v <= num.hi) {
			return optimize.Problem{}, fmt.Errorf("%s = %v: %s", num.key, v, num.want)
		}
		*num.dst = v
	}
	rawRegions, ok := top["regions"]
	if !ok {
		return optimize.Problem{}, errors.New("regions: missing: give at least one region")
	}
	var regions []json.RawMessage
	if err := json.Unmarshal(rawRegions, &regions); err != nil || regions == nil {
		return optimize.Problem{}, fmt.Errorf("regions: want an array of regions, got %s", jsonKind(rawRegions))
	}
	if len(regions) == 0 {
		return optimize.Problem{}, errors.New("regions: empty: give at least one region")
	}
	if len(regions) > optimize.MaxRegions {
		return optimize.Problem{}, fmt.Errorf("regions: %d regions, at most %d", len(regions), optimize.MaxRegions)
	}
	index := make(map[string]int, len(regions))
	for i, raw := range regions {
		r, err := parsePlanRegion(raw, i, p.ShedPenaltyMs)
		if err != nil {
			return optimize.Problem{}, err
		}
		if k, dup := index[r.Name]; dup {
			return optimize.Problem{}, fmt.Errorf("regions[%d].name %q: duplicate of regions[%d]", i, r.Name, k)
		}
		index[r.Name] = i
		p.Regions = append(p.Regions, r)
	}
	rtt, err := parsePlanRTT(top["rtt_ms"], index)
	if err != nil {
		return optimize.Problem{}, err
	}
	p.RTTms = rtt
	if err := p.Validate(); err != nil {
		return optimize.Problem{}, err // backstop: the checks above should catch everything
	}
	return p, nil
}

func parsePlanRegion(raw json.RawMessage, i int, penalty float64) (optimize.Region, error) {
	at := fmt.Sprintf("regions[%d]", i)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return optimize.Region{}, fmt.Errorf("%s: want an object with %s, got %s", at, strings.Join(regionFields(), ", "), jsonKind(raw))
	}
	for _, k := range sortedKeys(fields) {
		if !slices.Contains(regionFields(), k) {
			return optimize.Region{}, fmt.Errorf("%s: unknown field %q (known: %s)", at, k, strings.Join(regionFields(), ", "))
		}
	}
	var r optimize.Region
	rawName, ok := fields["name"]
	if !ok {
		return r, fmt.Errorf("%s.name: missing", at)
	}
	if err := json.Unmarshal(rawName, &r.Name); err != nil || jsonKind(rawName) != "a string" {
		return r, fmt.Errorf("%s.name: want a string, got %s", at, jsonKind(rawName))
	}
	if err := checkRegionName(r.Name); err != nil {
		return r, fmt.Errorf("%s.name %q: %w", at, r.Name, err)
	}
	at = fmt.Sprintf("regions[%d] (%q)", i, r.Name)
	for _, num := range []struct {
		key     string
		dst     *float64
		zeroOK  bool
		meaning string
	}{
		{"demand_rps", &r.DemandRPS, true, "requests/s of ingress demand"},
		{"capacity_rps", &r.CapacityRPS, true, "requests/s served at SLO"},
		{"engine_latency_ms", &r.EngineLatencyMs, false, "engine latency at low load, ms"},
	} {
		rawNum, ok := fields[num.key]
		if !ok {
			return r, fmt.Errorf("%s.%s: missing (%s)", at, num.key, num.meaning)
		}
		v, err := jsonNumber(rawNum, at+"."+num.key)
		if err != nil {
			return r, err
		}
		if !(v >= 0 && v <= optimize.MaxValue) || (!num.zeroOK && v == 0) {
			lo := "0"
			if !num.zeroOK {
				lo = "above 0"
			}
			return r, fmt.Errorf("%s.%s = %v: want %s to %g (%s)", at, num.key, v, lo, optimize.MaxValue, num.meaning)
		}
		*num.dst = v
	}
	if r.EngineLatencyMs >= penalty {
		return r, fmt.Errorf("%s.engine_latency_ms = %v: must be below shed_penalty_ms (%v), or shedding beats serving", at, r.EngineLatencyMs, penalty)
	}
	if rawDown, ok := fields["down"]; ok {
		if err := json.Unmarshal(rawDown, &r.Down); err != nil || jsonKind(rawDown) != "a boolean" {
			return r, fmt.Errorf("%s.down: want true or false, got %s", at, jsonKind(rawDown))
		}
	}
	return r, nil
}

// checkRegionName refuses names that would garble the text table or logs.
func checkRegionName(name string) error {
	switch {
	case name == "":
		return errors.New("empty: every region needs a name")
	case len(name) > maxRegionNameBytes:
		return fmt.Errorf("longer than %d bytes", maxRegionNameBytes)
	case !utf8.ValidString(name):
		return errors.New("not valid UTF-8")
	}
	for _, c := range name {
		if !unicode.IsPrint(c) || unicode.IsSpace(c) {
			return fmt.Errorf("contains %q: use printable characters without spaces", c)
		}
	}
	return nil
}

// parsePlanRTT builds the symmetric RTT matrix: +Inf where no pair is
// given, 0 on the diagonal.
func parsePlanRTT(raw json.RawMessage, index map[string]int) ([][]float64, error) {
	n := len(index)
	rtt := make([][]float64, n)
	given := make([][]bool, n)
	for i := range rtt {
		rtt[i] = make([]float64, n)
		given[i] = make([]bool, n)
		for j := range rtt[i] {
			if i != j {
				rtt[i][j] = math.Inf(1)
			}
		}
	}
	if raw == nil {
		return rtt, nil
	}
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(raw, &outer); err != nil || outer == nil {
		return nil, fmt.Errorf("rtt_ms: want an object of objects, {\"a\": {\"b\": 20}}, got %s", jsonKind(raw))
	}
	for _, a := range sortedKeys(outer) {
		i, ok := index[a]
		if !ok {
			return nil, fmt.Errorf("rtt_ms.%s: unknown region %q", a, a)
		}
		var inner map[string]json.RawMessage
		if err := json.Unmarshal(outer[a], &inner); err != nil || inner == nil {
			return nil, fmt.Errorf("rtt_ms.%s: want an object of RTTs by region, got %s", a, jsonKind(outer[a]))
		}
		for _, b := range sortedKeys(inner) {
			at := fmt.Sprintf("rtt_ms.%s.%s", a, b)
			j, ok := index[b]
			if !ok {
				return nil, fmt.Errorf("%s: unknown region %q", at, b)
			}
			v, err := jsonNumber(inner[b], at)
			if err != nil {
				return nil, err
			}
			switch {
			case i == j && v != 0:
				return nil, fmt.Errorf("%s = %v: the RTT of a region to itself is 0", at, v)
			case !(v >= 0 && v <= optimize.MaxValue):
				return nil, fmt.Errorf("%s = %v: want 0 to %g ms (leave a pair out when it is unreachable)", at, v, optimize.MaxValue)
			case given[i][j] && rtt[i][j] != v:
				return nil, fmt.Errorf("%s = %v but rtt_ms.%s.%s = %v: RTT is symmetric, give the pair once", at, v, b, a, rtt[i][j])
			}
			rtt[i][j], rtt[j][i] = v, v
			given[i][j], given[j][i] = true, true
		}
	}
	return rtt, nil
}

// jsonNumber decodes one JSON number, naming the field in its errors.
func jsonNumber(raw json.RawMessage, at string) (float64, error) {
	if k := jsonKind(raw); k != "a number" {
		return 0, fmt.Errorf("%s: want a number, got %s", at, k)
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, fmt.Errorf("%s: %s is out of range", at, bytes.TrimSpace(raw))
	}
	return v, nil
}

// jsonKind names the kind of a raw JSON value, for error messages.
func jsonKind(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "nothing"
	}
	switch t[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// checkJSONKeys checks that data is exactly one JSON value and that no
// object in it repeats a key (encoding/json would keep the last silently).
// Errors name the path of the offending object.
func checkJSONKeys(data []byte) error {
	type frame struct {
		obj     bool
		path    string
		keys    map[string]bool
		wantKey bool   // object: the next token is a key or '}'
		key     string // object: the key of the value being read
		index   int    // array: the index of the value being read
	}
	var stack []*frame
	values := 0 // complete top-level values
	// done records that a value ended: its container moves on.
	done := func() {
		if len(stack) == 0 {
			values++
			return
		}
		if f := stack[len(stack)-1]; f.obj {
			f.wantKey = true
		} else {
			f.index++
		}
	}
	// childPath is the path of the value about to start.
	childPath := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := stack[len(stack)-1]
		if !f.obj {
			return fmt.Sprintf("%s[%d]", f.path, f.index)
		}
		if f.path == "" {
			return f.key
		}
		return f.path + "." + f.key
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // ranges are checked, with the field's name, later
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("not valid JSON: %w", err)
		}
		if len(stack) == 0 && values > 0 {
			return errors.New("not valid JSON: more than one value")
		}
		if len(stack) > 0 {
			if f := stack[len(stack)-1]; f.obj && f.wantKey {
				if key, ok := tok.(string); ok {
					if f.keys[key] {
						at := f.path
						if at == "" {
							at = "input"
						}
						return fmt.Errorf("%s: duplicate key %q", at, key)
					}
					f.keys[key] = true
					f.key, f.wantKey = key, false
					continue
				}
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, path: childPath(), keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{path: childPath()})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			done()
		default:
			done()
		}
	}
	if values == 0 {
		return errors.New("not valid JSON: empty input")
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// planOutput is the JSON output of `global plan`; field order is the
// output's key order, maps come out sorted by key.
type planOutput struct {
	Policy          string                        `json:"policy"`
	Fractions       map[string]map[string]float64 `json:"fractions"`
	Shed            map[string]float64            `json:"shed"`
	CostMs          float64                       `json:"cost_ms"`
	LocalOnlyCostMs float64                       `json:"local_only_cost_ms"`
	LoadRPS         map[string]float64            `json:"load_rps"`
	Iterations      int                           `json:"iterations"`
	Gap             float64                       `json:"gap"`
	// Explain (with --explain): per region, why its demand stayed, moved
	// or was shed.
	Explain map[string]planExplanation `json:"explain,omitempty"`
}

// planExplanation is one region's verdict and its reason.
type planExplanation struct {
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
}

// fractionUnit is the resolution of printed shares.
const fractionUnit = 1e-4

// renderPlan rounds the plan for printing: every up region's shares and
// shed to 4 decimals, still adding up to exactly 10,000 units of 1e-4
// (largest remainders get the spare units), costs and loads to 0.001.
func renderPlan(p optimize.Problem, pl optimize.Plan) planOutput {
	out := planOutput{
		Fractions:       map[string]map[string]float64{},
		Shed:            map[string]float64{},
		LoadRPS:         map[string]float64{},
		CostMs:          round(pl.CostMs, 1e-3),
		LocalOnlyCostMs: round(optimize.LocalOnly(p).CostMs, 1e-3),
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
				row[p.Regions[j].Name] = float64(units[j]) * fractionUnit
			}
		}
		out.Fractions[r.Name] = row
		out.Shed[r.Name] = float64(units[n]) * fractionUnit
	}
	return out
}

// roundRow turns shares adding up to 1 into whole units of fractionUnit
// adding up to exactly 1/fractionUnit.
func roundRow(shares []float64) []int {
	const total = int(1 / fractionUnit)
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

func writePlanText(w io.Writer, p optimize.Problem, pl optimize.Plan, out planOutput) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tDEMAND_RPS\tCAPACITY_RPS\tLOAD_RPS\tUTIL\tLATENCY_MS\tSHED\tROUTES")
	for i, r := range p.Regions {
		util, latency := "-", "-"
		if c := r.CapacityRPS * p.Headroom; c > 0 && !r.Down {
			util = strconv.FormatFloat(pl.Load[i]/c, 'f', 3, 64)
			latency = strconv.FormatFloat(optimize.EngineLatency(p, i, pl.Load[i]), 'f', 1, 64)
		}
		routes := "-"
		if r.Down {
			routes = "(down)"
		} else if row := out.Fractions[r.Name]; len(row) > 0 {
			parts := make([]string, 0, len(row))
			for _, dst := range sortedKeys(row) {
				parts = append(parts, fmt.Sprintf("%s %.4f", dst, row[dst]))
			}
			routes = strings.Join(parts, ", ")
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
