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
	code, out, errOut := runBenchCLI(t, "paper", "--smoke", "--quiet", "--out", dir, "--stages", "calibration,failover", "--seeds", "2")
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
		Seeds   []uint64 `json:"seeds"`
		Grounds map[string]struct {
			Stages map[string]map[string]map[string]struct {
				Median, Min, Max *float64
			} `json:"stages"`
		} `json:"grounds"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Seeds) != 2 || len(rep.Grounds) != 2 {
		t.Fatalf("seeds %v, grounds %d: want 2 and 2", rep.Seeds, len(rep.Grounds))
	}
	for name, g := range rep.Grounds {
		if len(g.Stages) != 2 || g.Stages["failover"]["isobar"]["reroute_p99_ms"].Median == nil {
			t.Errorf("%s: stages %v", name, g.Stages)
		}
	}
	for _, f := range []string{"report.md", "physics_ttft_cdf.png", "paper-fit_failover_timeline.png"} {
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
		{"paper", "--out", t.TempDir(), "--seed", "abc"},
		{"paper", "--out", t.TempDir(), "--seeds", "-1"},
		{"paper", "--out", t.TempDir(), "--grounds", "moon"},
	} {
		if code, _, errOut := runBenchCLI(t, args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut)
		}
	}
}
