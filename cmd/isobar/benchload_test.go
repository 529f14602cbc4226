package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/sim"
)

// TestBenchLoadAgainstEngine runs isobar bench load against a simulated
// engine: the model is discovered from /v1/models, every request is an
// NDJSON line, and the summary JSON counts them.
func TestBenchLoadAgainstEngine(t *testing.T) {
	e, err := sim.NewEngine(sim.EngineConfig{Model: "m1", MaxModelLen: 4096, Profile: sim.ProfileTiny, TimeScale: 0.01, Seed: 1},
		sim.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
	dir := t.TempDir()
	nd, rep := filepath.Join(dir, "r.ndjson"), filepath.Join(dir, "s.json")
	code, out, errOut := runBenchCLI(t, "load", "--url", "http://"+e.Addr(), "--rps", "20", "--arrival", "constant",
		"--duration", "500ms", "--max-tokens", "2", "--ndjson", nd, "--report", rep, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "TTFT ms p50 / p95 / p99") || !strings.Contains(out, "baseline_mixed") {
		t.Errorf("summary table %q", out)
	}
	b, err := os.ReadFile(nd)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"seq", "class", "start", "ttft_ms", "end", "e2e_ms", "status", "ok", "prompt_tokens"} {
		if _, ok := first[k]; !ok {
			t.Errorf("NDJSON line lacks %q: %s", k, lines[0])
		}
	}
	var s struct {
		Requests, Succeeded int
	}
	b, err = os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Requests != len(lines) || s.Succeeded != s.Requests || s.Requests < 8 {
		t.Errorf("summary %s for %d lines", b, len(lines))
	}
}

func TestBenchLoadUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"load"}, "--url"},
		{[]string{"load", "--url", "http://127.0.0.1:1", "--model", "m", "--class", "nope"}, "--class"},
		{[]string{"load", "--url", "http://127.0.0.1:1", "--model", "m", "--rps", "0"}, "--rps"},
		{[]string{"load", "--url", "http://127.0.0.1:1", "--model", "m", "--arrival", "bursty"}, "--arrival"},
		{[]string{"load", "--url", "ftp://x", "--model", "m"}, "--url"},
	} {
		code, _, errOut := runBenchCLI(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 naming %s", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := runBenchCLI(t, "load", "--list")
	if code != 0 || !strings.Contains(out, "very_long") {
		t.Errorf("--list: exit %d %q", code, out)
	}
}
