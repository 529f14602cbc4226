package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/reqclass"
)

// workedExampleJSON is docs/design.md §5.2 (optimize's
// testdata/worked-example.json): demand A 90, B 120, C 40 rps; capacity
// 100, 100, 80; L0 300 ms; RTT A–B 20, B–C 30, A–C 60 ms.
func workedExampleJSON(headroom string) string {
	b, err := os.ReadFile("../../optimize/testdata/worked-example.json")
	if err != nil {
		panic(err) // a file of the repository
	}
	return strings.Replace(string(b), "HEADROOM", headroom, 1)
}

// runPlan runs `plan` in-process with args, stdin and captured output.
func runPlan(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newGlobalPlanCmd(&rootOpts{})
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), err
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "problem.json")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func decodePlanOutput(t *testing.T, s string) optimize.Report {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var out optimize.Report
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("output is not the plan JSON: %v\n%s", err, s)
	}
	return out
}

// checkRows asserts every printed row adds up to 1 with its shed, in whole
// units of 1e-4.
func checkRows(t *testing.T, out optimize.Report) {
	t.Helper()
	for src, row := range out.Fractions {
		units := math.Round(out.Shed[src] / optimize.ShareUnit)
		for dst, f := range row {
			if f <= 0 {
				t.Errorf("%s→%s printed as %v; zero shares are left out", src, dst, f)
			}
			if u := f / optimize.ShareUnit; math.Abs(u-math.Round(u)) > 1e-6 {
				t.Errorf("%s→%s = %v is not a multiple of 1e-4", src, dst, f)
			}
			units += math.Round(f / optimize.ShareUnit)
		}
		if units != 1/optimize.ShareUnit {
			t.Errorf("row %s adds up to %v units of 1e-4, want 10000", src, units)
		}
	}
}

func TestGlobalPlanWorkedExample(t *testing.T) {
	path := writeTemp(t, workedExampleJSON("1.0"))
	s, err := runPlan(t, "", "--input", path, "--policy", "latency")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	// Stable key order.
	last := -1
	for _, key := range []string{`"policy"`, `"fractions"`, `"shed"`, `"cost_ms"`, `"local_only_cost_ms"`, `"load_rps"`, `"iterations"`, `"gap"`} {
		at := strings.Index(s, key)
		if at <= last {
			t.Fatalf("key %s out of order in\n%s", key, s)
		}
		last = at
	}
	out := decodePlanOutput(t, s)
	checkRows(t, out)
	t.Logf("worked example, headroom 1.0:\n%s", s)
	if bc := out.Fractions["b"]["c"]; bc*120 < 20 || bc*120 > 35 {
		t.Errorf("b→c = %v of 120 rps (%.1f rps), want about 20–35 rps", bc, bc*120)
	}
	if out.Policy != "latency" {
		t.Errorf("policy %q, want latency", out.Policy)
	}

	// The same problem twice gives the same bytes.
	again, err := runPlan(t, "", "--input", path, "--policy", "latency")
	if err != nil || again != s {
		t.Errorf("second run differs (err %v)", err)
	}
}

func TestGlobalPlanHeadroomStdin(t *testing.T) {
	s, err := runPlan(t, workedExampleJSON("0.9"), "--input", "-")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	out := decodePlanOutput(t, s)
	checkRows(t, out)
	for name, limit := range map[string]float64{"a": 90, "b": 90, "c": 72} {
		if out.LoadRPS[name] > limit {
			t.Errorf("%s loaded %v above capacity·headroom %v", name, out.LoadRPS[name], limit)
		}
	}
	var shed float64
	for name, d := range map[string]float64{"a": 90, "b": 120, "c": 40} {
		shed += out.Shed[name] * d
	}
	t.Logf("headroom 0.9: shed %.2f rps, loads %v", shed, out.LoadRPS)
}

// The default policy is the global controller's, local-first; --explain
// says per region why its demand stayed, moved or was shed.
func TestGlobalPlanLocalFirstExplain(t *testing.T) {
	s, err := runPlan(t, workedExampleJSON("1"), "--input", "-", "--explain")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	var out optimize.Report
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	t.Logf("\n%s", s)
	if out.Policy != "local-first" || out.Fractions["a"]["a"] != 1 || out.Fractions["c"]["c"] != 1 {
		t.Errorf("policy %q fractions %v: want local-first with a and c wholly home", out.Policy, out.Fractions)
	}
	if bc := out.Fractions["b"]["c"] * 120; bc < 10 || bc > 35 {
		t.Errorf("b→c %.1f rps, want about 20", bc)
	}
	for region, verdict := range map[string]string{"a": "local", "b": "spill", "c": "local"} {
		if e := out.Explain[region]; e.Verdict != verdict || e.Reason == "" {
			t.Errorf("%s: explanation %+v, want verdict %s", region, e, verdict)
		}
	}
	txt, err := runPlan(t, workedExampleJSON("1"), "--input", "-", "--explain", "--output", "text")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"policy local-first", "why:", "b: spill: demand 120 rps exceeds the local fill 90 rps", "to c (RTT 30 ms)"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text output lacks %q:\n%s", want, txt)
		}
	}
	for _, args := range [][]string{
		{"--policy", "fastest"},
		{"--policy", "latency", "--explain"},
		{"--local-fill", "0"},
		{"--local-fill", "1.5"},
	} {
		if _, err := runPlan(t, workedExampleJSON("1"), append([]string{"--input", "-"}, args...)...); err == nil {
			t.Errorf("%v accepted", args)
		} else if !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v is not a usage error", args, err)
		}
	}
}

func TestGlobalPlanText(t *testing.T) {
	s, err := runPlan(t, workedExampleJSON("1"), "--input", "-", "--output", "text", "--policy", "latency")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	t.Logf("\n%s", s)
	for _, want := range []string{"REGION", "LATENCY_MS", "ROUTES", "b      ", "c 0.2615", "cost ", "local-only"} {
		if !strings.Contains(s, want) {
			t.Errorf("text output lacks %q:\n%s", want, s)
		}
	}
	if lines := strings.Count(s, "\n"); lines != 5 {
		t.Errorf("%d lines, want header, 3 regions and the cost line", lines)
	}
}

func TestGlobalPlanDownAndOptions(t *testing.T) {
	in := `{"headroom": 0.8, "beta": 0.2, "k": 3, "shed_penalty_ms": 5000,
	  "regions": [
	    {"name": "us-east", "demand_rps": 150, "capacity_rps": 100, "engine_latency_ms": 250},
	    {"name": "us-west", "demand_rps": 20, "capacity_rps": 100, "engine_latency_ms": 250},
	    {"name": "eu", "demand_rps": 30, "capacity_rps": 100, "engine_latency_ms": 250, "down": true}
	  ],
	  "rtt_ms": {"us-west": {"us-east": 70}, "eu": {"us-east": 80}}}`
	s, err := runPlan(t, in, "-i", "-")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	out := decodePlanOutput(t, s)
	checkRows(t, out)
	if _, ok := out.Fractions["eu"]; ok {
		t.Errorf("down region eu has a row: %v", out.Fractions["eu"])
	}
	if out.LoadRPS["eu"] != 0 {
		t.Errorf("down region eu loaded %v", out.LoadRPS["eu"])
	}
	if out.Fractions["us-east"]["us-west"] == 0 {
		t.Errorf("us-east does not spill to us-west: %v", out.Fractions["us-east"])
	}
}

// TestGlobalPlanBadInput: the input's errors (optimize.ReadInput, whose
// tests cover each check) are usage errors naming the input.
func TestGlobalPlanBadInput(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", ``, "--input -: not valid JSON"},
		{"too large", `{"regions": [` + strings.Repeat(" ", optimize.MaxInputBytes) + `]}`, "--input -: larger than 16777216 bytes"},
		{"unknown field", `{"regions": [], "extra": 1}`, `--input -: unknown field "extra"`},
		{"negative demand", `{"regions": [{"name": "a", "demand_rps": -1, "capacity_rps": 2, "engine_latency_ms": 3}]}`, `--input -: regions[0] ("a").demand_rps = -1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runPlan(t, tc.in, "--input", "-")
			if err == nil {
				t.Fatalf("accepted %s", tc.in)
			}
			var ue usageError
			if !errors.As(err, &ue) {
				t.Errorf("error %v is not a usage error (exit 2)", err)
			}
			if !errors.Is(err, optimize.ErrInvalidInput) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestGlobalPlanCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no input", nil, "--input is required"},
		{"bad output", []string{"--input", "-", "--output", "yaml"}, `--output "yaml"`},
		{"missing file", []string{"--input", filepath.Join(t.TempDir(), "nope.json")}, "no such file"},
		{"unknown flag", []string{"--inptu", "x"}, "unknown flag"},
		{"argument", []string{"--input", "-", "extra"}, "takes no arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runPlan(t, workedExampleJSON("0.9"), tc.args...)
			var ue usageError
			if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want a usage error containing %q", err, tc.want)
			}
		})
	}
}

// TestGlobalPlanExitStatus runs the whole CLI: 0 on success, 2 on bad input.
func TestGlobalPlanExitStatus(t *testing.T) {
	good := writeTemp(t, workedExampleJSON("0.9"))
	var stdout, stderr bytes.Buffer
	if code := run([]string{"global", "plan", "--input", good}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	decodePlanOutput(t, stdout.String())
	bad := writeTemp(t, `{"regions": [{"name": "a", "demand_rps": -1, "capacity_rps": 2, "engine_latency_ms": 3}]}`)
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"global", "plan", "--input", bad}, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d for bad input, want 2 (stderr %s)", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "demand_rps = -1") {
		t.Errorf("stderr %q does not name the field", stderr.String())
	}
}

// slicedPlanJSON: a short of capacity, with critical demand pinned to
// us-east, standard and sheddable demand anywhere.
const slicedPlanJSON = `{"regions": [
  {"name": "us-east", "capacity_rps": 100, "engine_latency_ms": 300,
   "demand": [{"rps": 30, "criticality": "critical", "allowed_regions": ["us-east"]},
              {"rps": 60}, {"rps": 70, "criticality": "sheddable"}]},
  {"name": "us-west", "demand_rps": 20, "capacity_rps": 50, "engine_latency_ms": 300}],
 "rtt_ms": {"us-east": {"us-west": 70}}}`

// The what-if speaks slices: sheddable demand absorbs the shortfall, the
// pinned slice stays in its region, and the slices come back in input
// order with their shed by criticality.
func TestGlobalPlanSlices(t *testing.T) {
	s, err := runPlan(t, slicedPlanJSON, "--input", "-")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	out := decodePlanOutput(t, s)
	checkRows(t, out)
	east := out.Slices["us-east"]
	if len(east) != 3 || east[0].Criticality != "critical" || east[1].Criticality != "standard" || east[2].Criticality != "sheddable" {
		t.Fatalf("us-east slices %+v, want critical, standard, sheddable in input order", east)
	}
	if len(east[0].Fractions) != 1 || east[0].Fractions["us-east"] != 1 || east[0].ShedRPS != 0 {
		t.Errorf("pinned critical slice %+v: want all of it served at us-east", east[0])
	}
	by := out.ShedByCriticality["us-east"]
	if by["critical"] != 0 || by["standard"] != 0 || by["sheddable"] < 20 {
		t.Errorf("us-east shed by criticality %v: want the sheddable demand to absorb the shortfall", by)
	}
	if w := out.Slices["us-west"]; len(w) != 1 || w[0].Criticality != "standard" || w[0].RPS != 20 {
		t.Errorf("us-west (demand_rps alone) slices %+v, want one standard slice of 20", w)
	}
	text, err := runPlan(t, slicedPlanJSON, "--input", "-", "--output", "text")
	if err != nil {
		t.Fatalf("plan --output text: %v", err)
	}
	for _, want := range []string{"SLICES", "CRITICALITY", "us-east  critical     us-east", "sheddable"} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}
	if _, err := runPlan(t, slicedPlanJSON, "--input", "-", "--policy", "latency"); err == nil || !strings.Contains(err.Error(), "--policy latency") {
		t.Errorf("latency policy on slices: %v, want a usage error", err)
	}
}

// Bad slices exit 2 with a message naming the field.
func TestGlobalPlanSlicesBadInput(t *testing.T) {
	region := func(slice string) string {
		return `{"regions": [{"name": "a", "capacity_rps": 2, "engine_latency_ms": 3, "demand": [` + slice + `]}]}`
	}
	for _, tc := range []struct{ name, in, want string }{
		{"criticality", region(`{"rps": 1, "criticality": "gold"}`), `regions[0] ("a").demand[0].criticality "gold": unknown`},
		{"allowed region", region(`{"rps": 1, "allowed_regions": ["b"]}`), `regions[0] ("a").demand[0].allowed_regions[0]: unknown region "b"`},
		{"negative rate", region(`{"rps": -3}`), `regions[0] ("a").demand[0].rps = -3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run([]string{"global", "plan", "--input", writeTemp(t, tc.in)}, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %s)", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tc.want)
			}
		})
	}
}

// The input's criticality names are reqclass's, band for value.
func TestGlobalPlanCriticalityNames(t *testing.T) {
	names := optimize.Criticalities()
	if len(names) != int(reqclass.Count) {
		t.Fatalf("optimize names %d criticalities, reqclass has %d", len(names), reqclass.Count)
	}
	for band, name := range names {
		c, ok := reqclass.Parse(name)
		if !ok || int(c) != band || c.String() != name {
			t.Errorf("band %d %q: reqclass.Parse gives %v, %v", band, name, c, ok)
		}
	}
	if optimize.DefaultBand != int(reqclass.Standard) {
		t.Errorf("default band %d, reqclass.Standard %d", optimize.DefaultBand, reqclass.Standard)
	}
}
