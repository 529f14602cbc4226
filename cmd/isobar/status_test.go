package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/statusview"
)

// The fetching and the tables are statusview's, tested there; these tests
// cover the command: flags, exit statuses, output formats and --watch.

// fakeDebugServer is a regional controller's debug API with one cell and
// one model's routes, counting requests.
type fakeDebugServer struct {
	*httptest.Server
	requests atomic.Int64
}

func controllerServer(t *testing.T) *fakeDebugServer {
	t.Helper()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cells, err := json.Marshal(map[string]any{"at": at, "cycle": 7, "cells": []regional.CellDebug{
		{ID: "east-0", Endpoint: "127.0.0.1:8001", Model: "llama-70b", State: "Ready", LastSeen: at.Add(-time.Second), Weight: 37, TargetWeight: 40},
	}})
	if err != nil {
		t.Fatal(err)
	}
	routes, err := json.Marshal(regional.RouteTable{Source: regional.RoutesFallback,
		Models: map[string]regional.ModelRoutes{"llama-70b": {Routes: map[string]float64{"east": 0.75, "west": 0.25}}}})
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeDebugServer{}
	mux := http.NewServeMux()
	for pattern, body := range map[string][]byte{"GET /debug/cells": cells, "GET /debug/routes": routes} {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, _ *http.Request) {
			s.requests.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
		})
	}
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// statusBuffer is an output writer safe for the watch goroutine.
type statusBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *statusBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *statusBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runStatus runs `status` in-process with args.
func runStatus(t *testing.T, ctx context.Context, clk clockwork.Clock, out *statusBuffer, args ...string) error {
	t.Helper()
	if clk == nil {
		clk = clockwork.NewRealClock()
	}
	cmd := newStatusCmdWith(&rootOpts{}, statusDeps{clock: clk, client: &http.Client{}})
	var errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(&errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}

// TestStatusOnce prints the table once, or the report as indented JSON.
func TestStatusOnce(t *testing.T) {
	srv := controllerServer(t)
	var out statusBuffer
	if err := runStatus(t, context.Background(), nil, &out, "--controller", srv.URL); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Log("\n" + got)
	for _, want := range []string{
		"== controller " + srv.URL + ": 1 cells (1 Ready), cycle 7, at 2026-03-01T12:00:00Z\n",
		"CELL ", "east-0 ", "routes: fallback\n", "llama-70b  east 0.7500, west 0.2500  0.0000\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if strings.Contains(got, "isobar status at") {
		t.Error("a single print has the watch header")
	}

	out = statusBuffer{}
	if err := runStatus(t, context.Background(), nil, &out, "-c", srv.URL, "-o", "json"); err != nil {
		t.Fatal(err)
	}
	var rep statusview.Report
	dec := json.NewDecoder(strings.NewReader(out.String()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("output is not the status JSON: %v\n%s", err, out.String())
	}
	if len(rep.Controllers) != 1 || rep.Controllers[0].Controller != srv.URL || rep.Controllers[0].Cycle != 7 || len(rep.Controllers[0].Cells) != 1 {
		t.Errorf("report %+v", rep)
	}
	if !strings.Contains(out.String(), "\n  \"controllers\"") {
		t.Errorf("a single JSON print is indented:\n%s", out.String())
	}
}

// TestStatusSourcesFailed: a source that cannot be read is printed in its
// place and makes the exit status 1, not 2.
func TestStatusSourcesFailed(t *testing.T) {
	srv := controllerServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	_ = ln.Close()
	var out statusBuffer
	err = runStatus(t, context.Background(), nil, &out, "--debug-addr", srv.URL, "--global", down)
	t.Log("\n" + out.String())
	if !errors.Is(err, errStatusSources) || !strings.Contains(err.Error(), "1 of 2") {
		t.Fatalf("error %v, want 1 of 2 sources failed", err)
	}
	if errors.As(err, new(usageError)) {
		t.Error("a source failure is not a usage error (exit status 1, not 2)")
	}
	if !strings.Contains(out.String(), "== global "+down+"\nerror: cannot reach ") {
		t.Error("the unreachable member is not reported in its place")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"status", "--debug-addr", down}, &stdout, &stderr); code != 1 {
		t.Errorf("exit %d, want 1 (stderr %s)", code, stderr.String())
	}
}

// statusWaitFor polls cond, failing after 10 s.
func statusWaitFor(t *testing.T, out *statusBuffer, what string, cond func() bool) {
	t.Helper()
	limit := time.NewTimer(10 * time.Second)
	defer limit.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-limit.C:
			t.Fatalf("timed out waiting for %s; output:\n%s", what, out.String())
		}
	}
}

// TestStatusWatch refreshes on the (fake) clock until the context ends.
func TestStatusWatch(t *testing.T) {
	srv := controllerServer(t)
	clk := clockwork.NewFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out statusBuffer
	done := make(chan error, 1)
	go func() { done <- runStatus(t, ctx, clk, &out, "--debug-addr", srv.URL, "--watch", "2s") }()
	waitFor := func(what string, cond func() bool) { t.Helper(); statusWaitFor(t, &out, what, cond) }
	frames := func() int { return strings.Count(out.String(), "isobar status at ") }
	waitFor("first frame", func() bool { return frames() == 1 && strings.Contains(out.String(), "MODEL") })
	if got := srv.requests.Load(); got != 2 {
		t.Fatalf("%d requests for one frame, want 2", got)
	}
	blockCtx, blockCancel := context.WithTimeout(ctx, 10*time.Second)
	defer blockCancel()
	if err := clk.BlockUntilContext(blockCtx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	waitFor("second frame", func() bool { return frames() == 2 && srv.requests.Load() == 4 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch ended with %v, want nil on interrupt", err)
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Error("screen cleared on a non-terminal")
	}
}

// TestStatusWatchJSON prints one JSON document per line per refresh.
func TestStatusWatchJSON(t *testing.T) {
	srv := controllerServer(t)
	clk := clockwork.NewFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	var out statusBuffer
	done := make(chan error, 1)
	go func() { done <- runStatus(t, ctx, clk, &out, "-c", srv.URL, "-w", "1s", "-o", "json") }()
	statusWaitFor(t, &out, "first document", func() bool { return strings.HasSuffix(out.String(), "\n") })
	blockCtx, blockCancel := context.WithTimeout(ctx, 10*time.Second)
	defer blockCancel()
	if err := clk.BlockUntilContext(blockCtx, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines for one refresh, want 1", len(lines))
	}
	var rep statusview.Report
	if err := json.Unmarshal([]byte(lines[0]), &rep); err != nil || len(rep.Controllers) != 1 {
		t.Fatalf("line is not a status report: %v", err)
	}
}

func TestStatusUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "give at least one --debug-addr"},
		{[]string{"-c", "localhost"}, "want host:port"},
		{[]string{"-c", "127.0.0.1:99999"}, "port \"99999\""},
		{[]string{"-c", "127.0.0.1:0"}, "port \"0\""},
		{[]string{"-c", "ftp://127.0.0.1:21"}, `scheme "ftp"`},
		{[]string{"-c", "http://127.0.0.1:9090/debug/cells"}, "without path"},
		{[]string{"-c", "http://127.0.0.1"}, "no host:port"},
		{[]string{"-g", ""}, "--global"},
		{[]string{"-c", "127.0.0.1:9090", "-o", "yaml"}, `--output "yaml"`},
		{[]string{"-c", "127.0.0.1:9090", "-w", "10ms"}, "--watch 10ms"},
		{[]string{"-c", "127.0.0.1:9090", "--timeout", "0s"}, "--timeout"},
		{[]string{"-c", "127.0.0.1:9090", "extra"}, "takes no arguments"},
		{[]string{"--nonsense"}, "unknown flag"},
	} {
		var out statusBuffer
		err := runStatus(t, context.Background(), nil, &out, tc.args...)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: error %v is not a usage error", tc.args, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %q lacks %q", tc.args, err, tc.want)
		}
	}
}
