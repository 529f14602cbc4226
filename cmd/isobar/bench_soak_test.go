package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runBenchCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"bench"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestBenchSoakHelp(t *testing.T) {
	code, out, errOut := runBenchCLI(t, "soak", "--help")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"--duration", "--cells", "--regions", "--churn-interval", "--churn-down", "--churn ",
		"--sample", "--report", "no TLS", "streams_match_cells", "plan_epochs_monotonic", "rss_flat"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	code, out, _ = runBenchCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "soak") {
		t.Errorf("bench --help: exit %d, %q does not list soak", code, out)
	}
}

func TestBenchSoakUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "needs a subcommand"},
		{[]string{"soak", "--cells", "0"}, "--cells"},
		{[]string{"soak", "--cells", "1", "--regions", "a,b"}, "--cells 1"},
		{[]string{"soak", "--cells", "-5"}, "--cells"},
		{[]string{"soak", "--churn", "2"}, "--churn"},
		{[]string{"soak", "--duration", "soon"}, "--duration"},
		{[]string{"soak", "--duration", "-1m"}, "--duration"},
		{[]string{"soak", "--regions", "a,a"}, "--regions"},
		{[]string{"soak", "--warmup", "20m"}, "--warmup"},
		{[]string{"soak", "--rss-allowance-mib", "-1"}, "--rss-allowance-mib"},
		{[]string{"soak", "--no-such-flag"}, "no-such-flag"},
		{[]string{"soak", "extra"}, "unknown command"},
		{[]string{"nope"}, "unknown command"},
	} {
		code, _, errOut := runBenchCLI(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message naming %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestBenchSoakRun: a short soak through the command line passes, prints
// the table and writes the report.
func TestBenchSoakRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a soak")
	}
	report := filepath.Join(t.TempDir(), "soak.json")
	code, out, errOut := runBenchCLI(t, "soak", "--duration", "3s", "--warmup", "1s", "--sample", "500ms",
		"--regions", "a,b", "--cells", "8", "--churn", "0.25", "--churn-interval", "500ms", "--churn-down", "300ms",
		"--heartbeat-interval", "100ms", "--settle", "20s", "--max-rss-growth", "1", "--rss-allowance-mib", "512",
		"--quiet", "--report", report, "--dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if !strings.Contains(out, "result: PASS") || !strings.Contains(out, "plan_gap") {
		t.Errorf("table %q lacks the result or the checks", out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Passed  bool              `json:"passed"`
		Samples []json.RawMessage `json:"samples"`
		Checks  []struct {
			Name   string `json:"name"`
			Passed bool   `json:"passed"`
		} `json:"checks"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Passed || len(rep.Samples) < 5 || len(rep.Checks) != 8 {
		t.Errorf("report: passed %v, %d samples, %d checks", rep.Passed, len(rep.Samples), len(rep.Checks))
	}
}
