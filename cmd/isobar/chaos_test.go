package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/chaos"
)

func runChaosCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"chaos"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// labArgs start a small, fast lab with short phases.
var labArgs = []string{"--lab", "--lab-fast", "--lab-regions", "a,b", "--lab-cells", "2",
	"--before", "500ms", "--during", "1s", "--after", "500ms", "--quiet"}

func TestChaosList(t *testing.T) {
	code, out, errOut := runChaosCLI(t, "list")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, d := range chaos.Drills() {
		if !strings.Contains(out, d.Name) {
			t.Errorf("chaos list lacks %s", d.Name)
		}
	}
}

func TestChaosUsageErrors(t *testing.T) {
	scenario := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(scenario, []byte("drills: [{drill: kill-cell, cell: 1}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "name a drill"},
		{[]string{"run", "no-such-drill", "--lab"}, `no drill "no-such-drill"`},
		{[]string{"run", "kill-cell"}, "--target"},
		{[]string{"run", "kill-cell", "--file", scenario}, "not both"},
		{[]string{"run", "--file", scenario, "--lab"}, "unknown field"},
		{[]string{"run", "kill-cell", "--lab", "--max-error-rate", "2"}, "--max-error-rate"},
		{[]string{"run", "kill-cell", "--target", "127.0.0.1:1", "--tls-cert", "nope.pem", "--tls-key", "nope.pem", "--tls-ca", "nope.pem"}, "--tls-cert"},
	} {
		code, _, errOut := runChaosCLI(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message naming %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestChaosImpossibleRTO: a threshold no fleet can meet fails the drill,
// with a message saying which and by how much, and exit status 3 (a
// drill that ran and failed, apart from an error's 1).
func TestChaosImpossibleRTO(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a lab")
	}
	report := filepath.Join(t.TempDir(), "report.json")
	code, out, errOut := runChaosCLI(t, append([]string{"run", "kill-cell", "--max-rto", "1ns", "--report", report}, labArgs...)...)
	if code != 3 {
		t.Fatalf("exit %d, want 3; stdout %s stderr %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "over --max-rto 1ns") || !strings.Contains(errOut, "1 of 1 drills failed: kill-cell") {
		t.Errorf("stderr %q does not say which threshold failed", errOut)
	}
	if !strings.Contains(out, "FAIL") {
		t.Errorf("table %q shows no FAIL", out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep map[string]any
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"drill", "passed", "detect_ms", "reroute_ms", "success", "lost"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("report lacks %q: %s", k, b)
		}
	}
	if rep["passed"] != false || rep["drill"] != "kill-cell" {
		t.Errorf("report %s", b)
	}
	rr, _ := rep["reroute_ms"].(map[string]any)
	succ, _ := rep["success"].(map[string]any)
	for _, k := range []string{"p50", "p95", "p99"} {
		if _, ok := rr[k].(float64); !ok {
			t.Errorf("reroute_ms.%s missing: %s", k, b)
		}
	}
	for _, k := range []string{"before", "during", "after"} {
		if v, ok := succ[k].(float64); !ok || v < 0 || v > 1 {
			t.Errorf("success.%s = %v: want a fraction", k, succ[k])
		}
	}
}

// TestChaosScenarioFile runs two drills from a scenario file in one lab.
func TestChaosScenarioFile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a lab")
	}
	dir := t.TempDir()
	scenario, report := filepath.Join(dir, "drills.yaml"), filepath.Join(dir, "report.json")
	if err := os.WriteFile(scenario, []byte(`
options: {rps: 6}
thresholds: {max_error_rate: 0.05}
drills:
  - drill: kill-cell
    cells: [1]
    thresholds: {max_rto: 5s}
  - drill: telemetry-loss
`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runChaosCLI(t, append([]string{"run", "--file", scenario, "--report", report}, labArgs...)...)
	if code != 0 {
		t.Fatalf("exit %d; stdout %s stderr %s", code, out, errOut)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Passed bool           `json:"passed"`
		Drills []chaos.Report `json:"drills"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Passed || len(rep.Drills) != 2 || rep.Drills[0].Drill != "kill-cell" || rep.Drills[1].Drill != "telemetry-loss" {
		t.Fatalf("report %s", b)
	}
	if f := rep.Drills[0].Faults; len(f) != 1 || f[0].Cells[0] != 1 {
		t.Errorf("kill-cell hit %+v, want cell 1 as the scenario says", f)
	}
}
