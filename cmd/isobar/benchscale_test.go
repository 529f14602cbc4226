package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runBenchScaleCmd runs `bench scale` through newBenchScaleCmd directly (the
// bench command registers it).
func runBenchScaleCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ro := &rootOpts{logLevel: "error", logFormat: "text", stdout: &stdout, stderr: &stderr}
	cmd := newBenchScaleCmd(ro)
	cmd.SetArgs(args)
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return stdout.String(), stderr.String(), err
}

func TestBenchScaleUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--out DIR is required"},
		{[]string{"--out", t.TempDir(), "--window", "0s"}, "--window"},
		{[]string{"--out", t.TempDir(), "--deaths", "0"}, "--deaths"},
		{[]string{"--out", t.TempDir(), "--silent-deaths", "0"}, "--silent-deaths"},
		{[]string{"--out", t.TempDir(), "--cell-procs", "-1"}, "--cell-procs"},
		{[]string{"--out", t.TempDir(), "--death-timeout", "0s"}, "--death-timeout"},
		{[]string{"--out", t.TempDir(), "--start-timeout", "0s"}, "--start-timeout"},
		{[]string{"--out", t.TempDir(), "--cell-procs", "65"}, "cell processes 65"},
		{[]string{"--out", t.TempDir(), "--cells", "0"}, "cells 0"},
		{[]string{"--out", t.TempDir(), "--regions", "1000"}, "regions 1000"},
		{[]string{"--out", t.TempDir(), "extra"}, "unknown command"},
	} {
		_, _, err := runBenchScaleCmd(t, tc.args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want a usage error naming %q", tc.args, err, tc.want)
		}
	}
}

func TestBenchScaleHelp(t *testing.T) {
	out, _, err := runBenchScaleCmd(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--out", "--cells", "--regions", "--window", "--deaths", "--seed", "hierarchical", "flat",
		"death_to_removed", "RLIMIT_NOFILE", "scale.json", "--cell-procs", "--silent-deaths", "--in-process", "silent_to_removed", "--memprofile"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// TestBenchScaleTiny runs the command on a tiny fleet and checks the files,
// the allocation profile among them (not the CPU profile: a test binary
// run with -cpuprofile holds the one CPU profiler).
func TestBenchScaleTiny(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	memProf := filepath.Join(t.TempDir(), "mem.prof")
	out, errOut, err := runBenchScaleCmd(t, "--out", dir, "--cells", "4", "--regions", "1,2,8", "--window", "200ms",
		"--deaths", "2", "--silent-deaths", "1", "--cycles", "5", "--in-process", "--memprofile", memProf)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if !strings.Contains(out, "| cells | regions | topology |") || !strings.Contains(out, "| 4 | 2 | hierarchical |") {
		t.Errorf("stdout lacks the table:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "scale.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Machine struct {
			NumCPU int `json:"num_cpu"`
		} `json:"machine"`
		Points []struct {
			Cells    int             `json:"cells"`
			Regions  int             `json:"regions"`
			Topology string          `json:"topology"`
			Skipped  string          `json:"skipped"`
			Error    string          `json:"error"`
			Figures  json.RawMessage `json:"figures"`
		} `json:"points"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Machine.NumCPU < 1 || len(rep.Points) != 4 {
		t.Fatalf("machine %+v, %d points; want 4", rep.Machine, len(rep.Points))
	}
	for _, p := range rep.Points {
		switch {
		case p.Regions == 8:
			if !strings.Contains(p.Skipped, "fewer cells") {
				t.Errorf("4 cells over 8 regions: skipped %q, want a reason", p.Skipped)
			}
		case p.Skipped != "" || p.Error != "" || len(p.Figures) == 0:
			t.Errorf("point %+v did not run cleanly", p)
		}
	}
	for _, name := range []string{"scale.md", "cycle.png", "inbound.png", "cpu.png", "death.png"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	// pprof's format: gzipped protobuf.
	if b, err := os.ReadFile(memProf); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("--memprofile: %d bytes (%v), want a gzipped profile", len(b), err)
	}
}

// An allocation profile that cannot be written is an error naming the path.
func TestWriteAllocProfileError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "mem.prof")
	if err := writeAllocProfile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("writeAllocProfile(%s) = %v, want an error naming it", path, err)
	}
}

// TestBenchScaleCellProcs runs a tiny point with its 20 cells in 2 child
// processes of this binary (the test binary acts as the CLI in them).
func TestBenchScaleCellProcs(t *testing.T) {
	t.Setenv("ISOBAR_TEST_AS_CLI", "1") // inherited by the cell processes
	dir := filepath.Join(t.TempDir(), "out")
	_, errOut, err := runBenchScaleCmd(t, "--out", dir, "--cells", "20", "--regions", "2", "--cell-procs", "2",
		"--window", "1500ms", "--deaths", "2", "--silent-deaths", "1", "--cycles", "5")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	b, err := os.ReadFile(filepath.Join(dir, "scale.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Points []struct {
			Regions  int    `json:"regions"`
			Topology string `json:"topology"`
			Skipped  string `json:"skipped"`
			Error    string `json:"error"`
			Figures  *struct {
				CellProcs         int      `json:"cell_procs"`
				SenderCPU         *float64 `json:"sender_cpu_s_per_s"`
				SilentDeathsTimed int      `json:"silent_deaths_timed"`
			} `json:"figures"`
		} `json:"points"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Points) != 2 {
		t.Fatalf("%d points, want 2 (flat, 2 regions)", len(rep.Points))
	}
	for _, p := range rep.Points {
		f := p.Figures
		if p.Skipped != "" || p.Error != "" || f == nil || f.CellProcs != 2 || f.SenderCPU == nil || f.SilentDeathsTimed != 1 {
			t.Errorf("point %+v (figures %+v): want it run in 2 cell processes", p, f)
		}
	}
}
