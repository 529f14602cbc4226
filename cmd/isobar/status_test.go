package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional"
)

// statusAt is the controller clock of the recorded fixtures.
var statusAt = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// statusCellsFixture is a recorded GET /debug/cells answer built from the
// real types, so a change of their JSON shape breaks these tests.
func statusCellsFixture() statusCells {
	return statusCells{At: statusAt, Cycle: 4242, Cells: []regional.CellDebug{
		{
			ID: "east-1", Endpoint: "127.0.0.1:8002", Model: "llama-70b", MaxModelLen: 4096,
			State: "Failed", StateSince: statusAt.Add(-20 * time.Second), Reason: "no heartbeat for 1s",
			LastSeen: statusAt.Add(-21 * time.Second), Pressure: 0, Fallback: true,
			Weight: 0, TargetWeight: 0,
		},
		{
			ID: "east-0", Endpoint: "127.0.0.1:8001", Model: "llama-70b", MaxModelLen: 8192,
			State: "Ready", StateSince: statusAt.Add(-time.Minute), Reason: "engine ready",
			LastSeen: statusAt.Add(-1500 * time.Millisecond), Sequence: 991,
			Raw:      map[string]float64{"queue_depth": 3, "rtt_seconds": 0.002},
			Signals:  map[string]regional.SignalDebug{"queue_depth": {Normalized: 0.3, Weight: 1, Contribution: 0.3}},
			Pressure: 0.41234, Weight: 37, TargetWeight: 40,
			Sources: map[string]regional.SourceDebug{"vllm": {OK: true}, "dcgm": {OK: false, Error: "connection refused"}},
		},
		{
			ID: "east-2", Endpoint: "127.0.0.1:8003", Model: "llama-70b", MaxModelLen: 8192,
			State: "Draining", Reason: "operator\tdrain\x1b[2J", LastSeen: statusAt.Add(-200 * time.Millisecond),
			Pressure: 0.9, Weight: 5, TargetWeight: 12, Penalty: 0.25, Probation: true, PenaltyTrips: 2,
			OperatorDrain: true,
		},
	}}
}

// statusRoutesFixture is a recorded GET /debug/routes answer.
func statusRoutesFixture() regional.RouteTable {
	return regional.RouteTable{
		Source: regional.RoutesPlan, Epoch: 7, Sequence: 12, LeaderID: "global-a",
		IssuedAt: statusAt.Add(-2 * time.Second), ValidUntil: statusAt.Add(28 * time.Second),
		Models: map[string]regional.ModelRoutes{
			"llama-70b": {Routes: map[string]float64{"east": 0.7, "west": 0.25}, Shed: 0.05},
			"mistral":   {Routes: map[string]float64{"east": 1}},
		},
		Ingress: map[string]string{"west": "127.0.0.1:7100"},
	}
}

func statusPlanFixture() *isobarpb.RoutingPlan {
	return &isobarpb.RoutingPlan{
		LeaderId: "global-a", Epoch: 7, Sequence: 12,
		IssuedAt:   timestamppb.New(statusAt),
		ValidUntil: timestamppb.New(statusAt.Add(30 * time.Second)),
		Plans: []*isobarpb.ModelPlan{
			{Model: "llama-70b", IngressRegion: "west", Routes: []*isobarpb.Route{{Destination: "west", Fraction: 1}}},
			{Model: "llama-70b", IngressRegion: "east", Shed: 0.05, Routes: []*isobarpb.Route{
				{Destination: "east", Fraction: 0.7}, {Destination: "west", Fraction: 0.25},
			}},
		},
		Ingress: []*isobarpb.RegionIngress{{Region: "west", Address: "127.0.0.1:7100"}},
	}
}

// fakeDebugServer serves recorded debug answers, counting requests.
type fakeDebugServer struct {
	*httptest.Server
	requests atomic.Int64
}

func startDebugServer(t *testing.T, routes map[string]http.HandlerFunc) *fakeDebugServer {
	t.Helper()
	s := &fakeDebugServer{}
	mux := http.NewServeMux()
	for pattern, h := range routes {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			s.requests.Add(1)
			h(w, r)
		})
	}
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func serveJSON(t *testing.T, code int, v any) http.HandlerFunc {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write(b)
	}
}

func controllerServer(t *testing.T) *fakeDebugServer {
	return startDebugServer(t, map[string]http.HandlerFunc{
		"GET /debug/cells":  serveJSON(t, http.StatusOK, statusCellsFixture()),
		"GET /debug/routes": serveJSON(t, http.StatusOK, statusRoutesFixture()),
	})
}

func globalServer(t *testing.T, plan *isobarpb.RoutingPlan) *fakeDebugServer {
	regions := map[string]any{"leader": true, "regions": []global.RegionStatus{
		{Region: "east", AgeSeconds: 0.4, Live: true, Sequence: 88, Models: 1, Ingress: "127.0.0.1:7000"},
		{Region: "west", AgeSeconds: 31, Live: false, Sequence: 12, Models: 1, Ingress: "127.0.0.1:7100"},
	}}
	planH := serveJSON(t, http.StatusNotFound, map[string]any{"error": "no plan published by this member", "leader": false})
	if plan != nil {
		b, err := protojson.MarshalOptions{Multiline: true}.Marshal(plan)
		if err != nil {
			t.Fatal(err)
		}
		planH = func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(b)
		}
	}
	return startDebugServer(t, map[string]http.HandlerFunc{
		"GET /debug/regions": serveJSON(t, http.StatusOK, regions),
		"GET /debug/plan":    planH,
	})
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

// tableRows returns the rows of the table whose header starts with
// header, split into columns (tabwriter pads columns with 2+ spaces).
func tableRows(t *testing.T, out, header string) [][]string {
	t.Helper()
	cols := regexp.MustCompile(`\s{2,}`)
	var rows [][]string
	in := false
	for line := range strings.SplitSeq(out, "\n") {
		switch {
		case strings.HasPrefix(line, header):
			in = true
			rows = append(rows, cols.Split(strings.TrimSpace(line), -1))
		case in && (line == "" || strings.HasPrefix(line, "==") || strings.HasPrefix(line, "routes:") || strings.HasPrefix(line, "plan:")):
			return rows
		case in:
			rows = append(rows, cols.Split(strings.TrimSpace(line), -1))
		}
	}
	if !in {
		t.Fatalf("no table starting %q in:\n%s", header, out)
	}
	return rows
}

func TestStatusControllerTable(t *testing.T) {
	srv := controllerServer(t)
	var out statusBuffer
	if err := runStatus(t, context.Background(), nil, &out, "--controller", srv.URL); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Log("\n" + got)
	if want := "== controller " + srv.URL + ": 3 cells (1 Draining, 1 Failed, 1 Ready), cycle 4242, at 2026-03-01T12:00:00Z\n"; !strings.HasPrefix(got, want) {
		t.Errorf("header: want %q", want)
	}
	rows := tableRows(t, got, "CELL")
	want := [][]string{
		{"CELL", "STATE", "PRESSURE", "WEIGHT", "TARGET", "PENALTY", "FALLBACK", "HEARTBEAT", "ENDPOINT", "MODEL/MAX_LEN", "REASON"},
		{"east-0", "Ready", "0.412", "37", "40", "-", "no", "1.5s", "127.0.0.1:8001", "llama-70b/8192", "engine ready"},
		{"east-1", "Failed", "0.000", "0", "0", "-", "yes", "21s", "127.0.0.1:8002", "llama-70b/4096", "no heartbeat for 1s"},
		{"east-2", "Draining+drain", "0.900", "5", "12", "0.25 probation", "no", "0.2s", "127.0.0.1:8003", "llama-70b/8192", `operator\tdrain\x1b[2J`},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d table rows, want %d: %q", len(rows), len(want), rows)
	}
	for i := range want {
		if strings.Join(rows[i], "|") != strings.Join(want[i], "|") {
			t.Errorf("row %d:\n got %q\nwant %q", i, rows[i], want[i])
		}
	}
	if !strings.Contains(got, "routes: plan, epoch 7, sequence 12, leader global-a, valid 28s more\n") {
		t.Error("routes line missing or wrong")
	}
	routes := tableRows(t, got, "MODEL")
	wantRoutes := [][]string{
		{"MODEL", "ROUTES", "SHED"},
		{"llama-70b", "east 0.7000, west 0.2500 (127.0.0.1:7100)", "0.0500"},
		{"mistral", "east 1.0000", "0.0000"},
	}
	if len(routes) != len(wantRoutes) {
		t.Fatalf("routes table %q", routes)
	}
	for i := range wantRoutes {
		if strings.Join(routes[i], "|") != strings.Join(wantRoutes[i], "|") {
			t.Errorf("routes row %d:\n got %q\nwant %q", i, routes[i], wantRoutes[i])
		}
	}
	if strings.ContainsRune(got, '\x1b') {
		t.Error("a control character from the controller reached the terminal")
	}
}

// TestStatusJSON: --output json carries the debug API's own shapes.
func TestStatusJSON(t *testing.T) {
	srv := controllerServer(t)
	var out statusBuffer
	if err := runStatus(t, context.Background(), nil, &out, "-c", srv.URL, "-o", "json"); err != nil {
		t.Fatal(err)
	}
	var rep statusReport
	dec := json.NewDecoder(strings.NewReader(out.String()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("output is not the status JSON: %v\n%s", err, out.String())
	}
	if len(rep.Controllers) != 1 || len(rep.Globals) != 0 {
		t.Fatalf("%d controllers, %d globals", len(rep.Controllers), len(rep.Globals))
	}
	c := rep.Controllers[0]
	if c.Controller != srv.URL || c.Cycle != 4242 || c.At == nil || !c.At.Equal(statusAt) || len(c.Errors) != 0 {
		t.Errorf("controller %q cycle %d at %v errors %q", c.Controller, c.Cycle, c.At, c.Errors)
	}
	fixture := statusCellsFixture().Cells
	byID := map[string]regional.CellDebug{}
	for _, cell := range fixture {
		byID[cell.ID] = cell
	}
	for _, cell := range c.Cells {
		wantJSON, _ := json.Marshal(byID[cell.ID])
		gotJSON, _ := json.Marshal(cell)
		if !bytes.Equal(wantJSON, gotJSON) {
			t.Errorf("cell %s:\n got %s\nwant %s", cell.ID, gotJSON, wantJSON)
		}
	}
	if c.Routes == nil || c.Routes.Epoch != 7 || c.Routes.Models["llama-70b"].Routes["west"] != 0.25 {
		t.Errorf("routes %+v", c.Routes)
	}
}

// TestStatusSeveralRegions: one section per controller, in flag order;
// a controller that cannot be reached or answers something else is
// reported in its place, and the exit status says so.
func TestStatusSeveralRegions(t *testing.T) {
	east := controllerServer(t)
	html := startDebugServer(t, map[string]http.HandlerFunc{
		"/": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte("<html><body>grafana</body></html>"))
		},
	})
	broken := startDebugServer(t, map[string]http.HandlerFunc{
		"GET /debug/cells":  serveJSON(t, http.StatusServiceUnavailable, map[string]string{"error": "registry stopped"}),
		"GET /debug/routes": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"Source": "local"`)) },
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	_ = ln.Close()

	var out statusBuffer
	err = runStatus(t, context.Background(), nil, &out,
		"--controller", east.URL, "--controller", down, "--controller", html.URL, "--controller", broken.URL)
	got := out.String()
	t.Log("\n" + got)
	if !errors.Is(err, errStatusSources) || !strings.Contains(err.Error(), "3 of 4") {
		t.Fatalf("error %v, want 3 of 4 sources failed", err)
	}
	var ue usageError
	if errors.As(err, &ue) {
		t.Error("a source failure is not a usage error (exit status 1, not 2)")
	}
	sections := strings.Split(got, "== controller ")[1:]
	if len(sections) != 4 {
		t.Fatalf("%d sections, want 4", len(sections))
	}
	for i, want := range []string{
		east.URL + ": 3 cells",
		down + "\nerror: cannot reach http://" + down + "/debug/cells: ",
		html.URL + "\nerror: GET " + html.URL + "/debug/cells: answered text/html, not JSON: \"<html><body>grafana</body></html>\"",
		broken.URL + "\nerror: GET " + broken.URL + "/debug/cells: HTTP 503: ",
	} {
		if !strings.HasPrefix(sections[i], want) {
			t.Errorf("section %d starts %q, want %q", i, sections[i][:min(len(sections[i]), 120)], want)
		}
	}
	if strings.Count(sections[1], "error:") != 1 {
		t.Error("an unreachable controller should be reported once, not per endpoint")
	}
	if !strings.Contains(sections[3], "/debug/routes: answered text/plain, not JSON: \"{\\\"Source\\\": \\\"local\\\"\"") {
		t.Error("truncated routes JSON not reported")
	}
}

// TestStatusGlobal reads a global member's regions and plan, and a
// member without a plan.
func TestStatusGlobal(t *testing.T) {
	leader := globalServer(t, statusPlanFixture())
	standby := globalServer(t, nil)
	var out statusBuffer
	if err := runStatus(t, context.Background(), nil, &out, "--global", leader.URL, "--global", standby.URL); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Log("\n" + got)
	if !strings.Contains(got, "== global "+leader.URL+": leader yes, 2 regions\n") {
		t.Error("leader header missing")
	}
	regions := tableRows(t, got, "REGION")
	wantRegions := [][]string{
		{"REGION", "LIVE", "SUMMARY_AGE", "SEQUENCE", "MODELS", "INGRESS"},
		{"east", "yes", "0.4s", "88", "1", "127.0.0.1:7000"},
		{"west", "no", "31s", "12", "1", "127.0.0.1:7100"},
	}
	for i := range wantRegions {
		if i >= len(regions) || strings.Join(regions[i], "|") != strings.Join(wantRegions[i], "|") {
			t.Errorf("regions row %d: got %q, want %q", i, regions, wantRegions[i])
		}
	}
	if !strings.Contains(got, "plan: epoch 7, sequence 12, leader global-a, issued 2026-03-01T12:00:00Z, valid for 30s\n") {
		t.Error("plan line missing")
	}
	plans := tableRows(t, got, "MODEL")
	wantPlans := [][]string{
		{"MODEL", "INGRESS", "ROUTES", "SHED"},
		{"llama-70b", "east", "east 0.7000, west 0.2500", "0.0500"},
		{"llama-70b", "west", "west 1.0000", "0.0000"},
	}
	for i := range wantPlans {
		if i >= len(plans) || strings.Join(plans[i], "|") != strings.Join(wantPlans[i], "|") {
			t.Errorf("plan row %d: got %q, want %q", i, plans, wantPlans[i])
		}
	}
	if !strings.Contains(got, "plan: no plan published by this member\n") {
		t.Error("standby without a plan not shown")
	}

	out = statusBuffer{}
	if err := runStatus(t, context.Background(), nil, &out, "-g", leader.URL, "-o", "json"); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Globals []struct {
			Leader  bool
			Regions []global.RegionStatus
			Plan    json.RawMessage
		}
	}
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil || len(rep.Globals) != 1 {
		t.Fatalf("json output: %v\n%s", err, out.String())
	}
	var plan isobarpb.RoutingPlan
	if err := protojson.Unmarshal(rep.Globals[0].Plan, &plan); err != nil || plan.GetEpoch() != 7 || len(plan.GetPlans()) != 2 {
		t.Errorf("plan in json output: %v %v", err, &plan)
	}
}

// TestStatusRealController reads a real regional controller's debug API
// (no cells yet, no cross-region routing).
func TestStatusRealController(t *testing.T) {
	cfg := regional.DefaultConfig("east")
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := regional.New(cfg, regional.Deps{GRPCListener: grpcLn, HTTPListener: httpLn})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	var out statusBuffer
	if err := runStatus(t, context.Background(), nil, &out, "--controller", c.HTTPAddr()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	t.Log("\n" + got)
	for _, want := range []string{"== controller " + c.HTTPAddr() + ": 0 cells, cycle ", "no cells\n", "routes: local\n", "all traffic served locally\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
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
	go func() { done <- runStatus(t, ctx, clk, &out, "--controller", srv.URL, "--watch", "2s") }()
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
	var rep statusReport
	if err := json.Unmarshal([]byte(lines[0]), &rep); err != nil || len(rep.Controllers) != 1 {
		t.Fatalf("line is not a status report: %v", err)
	}
}

func TestStatusUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "give at least one --controller"},
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

func TestStatusText(t *testing.T) {
	for in, want := range map[string]string{
		"":                      "-",
		"east-0":                "east-0",
		"a\tb":                  `a\tb`,
		"\x1b[31mred":           `\x1b[31mred`,
		"bad\xff":               `bad\xff`,
		strings.Repeat("x", 70): strings.Repeat("x", 63) + "…",
		"ünïcode":               "ünïcode",
	} {
		if got := statusText(in); got != want {
			t.Errorf("statusText(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzStatusAnswers feeds arbitrary controller and global answers through
// the decoding and the table: it must never panic, and no control
// character from the input may reach the terminal.
func FuzzStatusAnswers(f *testing.F) {
	cells, _ := json.Marshal(statusCellsFixture())
	routes, _ := json.Marshal(statusRoutesFixture())
	plan, _ := protojson.Marshal(statusPlanFixture())
	f.Add(cells, routes, plan)
	f.Add([]byte(`{"at":"2026-01-01T00:00:00Z","cells":[{"id":"\u001b[2J","last_seen":"0001-01-01T00:00:00Z"}]}`),
		[]byte(`{"source":"local","note":"x"}`), []byte(`{}`))
	f.Add([]byte(`{"cells":null}`), []byte(`{"Source":"plan","ValidUntil":"1970-01-01T00:00:00Z","Models":{"m":{"Routes":{"a\n":1e308}}}}`),
		[]byte(`{"plans":[{"routes":[{"fraction":"NaN"}]}]}`))
	f.Add([]byte(`[]`), []byte(`null`), []byte(`{"issuedAt":"9999-12-31T23:59:59Z","validUntil":"0001-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, cellsBody, routesBody, planBody []byte) {
		var w bytes.Buffer
		c := controllerStatus{Controller: "x"}
		var cd statusCells
		if json.Unmarshal(cellsBody, &cd) == nil {
			at := cd.At
			c.At, c.Cells = &at, cd.Cells
		}
		var rt regional.RouteTable
		if json.Unmarshal(routesBody, &rt) == nil {
			c.Routes = &rt
		}
		g := globalStatus{Global: "g"}
		p := &isobarpb.RoutingPlan{}
		if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(planBody, p) == nil {
			g.plan = p
		}
		if err := writeStatusTable(&w, statusReport{Controllers: []controllerStatus{c}, Globals: []globalStatus{g}}); err != nil {
			t.Fatal(err)
		}
		for _, r := range w.String() {
			if r != '\n' && r < 0x20 || r == 0x7f {
				t.Fatalf("control character %q in the table:\n%s", r, w.String())
			}
		}
	})
}
