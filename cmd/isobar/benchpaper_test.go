package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchPaperSmoke runs isobar bench paper --smoke on two stages and
// checks the files and the targets table.
func TestBenchPaperSmoke(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runBenchCLI(t, "paper", "--smoke", "--quiet", "--out", dir, "--stages", "calibration,failover")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "failover reroute P99") || !strings.Contains(out, "report.json") {
		t.Errorf("output %q", out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Stages map[string]map[string]map[string]*float64 `json:"stages"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Stages) != 2 || rep.Stages["failover"]["isobar"]["reroute_p99_ms"] == nil {
		t.Errorf("stages %v", rep.Stages)
	}
	for _, f := range []string{"report.md", "ttft_cdf.png", "failover_timeline.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

func TestBenchPaperUsage(t *testing.T) {
	for _, args := range [][]string{
		{"paper"},
		{"paper", "--out", t.TempDir(), "--stages", "nope"},
		{"paper", "--out", t.TempDir(), "--quick", "--smoke"},
	} {
		if code, _, errOut := runBenchCLI(t, args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut)
		}
	}
}
