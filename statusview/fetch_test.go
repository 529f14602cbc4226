package statusview

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional"
)

// TestReportJSON: the report's JSON carries the debug API's own shapes.
func TestReportJSON(t *testing.T) {
	srv := controllerServer(t)
	rep, _ := collect(t, []string{srv.URL}, nil)
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&back); err != nil {
		t.Fatalf("not the status JSON: %v\n%s", err, b)
	}
	if len(back.Controllers) != 1 || len(back.Globals) != 0 {
		t.Fatalf("%d controllers, %d globals", len(back.Controllers), len(back.Globals))
	}
	c := back.Controllers[0]
	if c.Controller != srv.URL || c.Cycle != 4242 || c.At == nil || !c.At.Equal(statusAt) || len(c.Errors) != 0 {
		t.Errorf("controller %q cycle %d at %v errors %q", c.Controller, c.Cycle, c.At, c.Errors)
	}
	byID := map[string]debugapi.CellDebug{}
	for _, cell := range statusCellsFixture().Cells {
		byID[cell.ID] = cell
	}
	for i, cell := range c.Cells {
		if i > 0 && c.Cells[i-1].ID >= cell.ID {
			t.Errorf("cells not sorted by id: %s after %s", cell.ID, c.Cells[i-1].ID)
		}
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

// TestSeveralControllers: one section per controller, in the order given;
// a controller that cannot be reached or answers something else is
// reported in its place and counted by Failed.
func TestSeveralControllers(t *testing.T) {
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

	rep, got := collect(t, []string{east.URL, down, html.URL, broken.URL}, nil)
	t.Log("\n" + got)
	if n := rep.Failed(); n != 3 {
		t.Errorf("Failed() = %d, want 3", n)
	}
	if !strings.HasPrefix(rep.Controllers[1].Errors[0], ErrUnreachable.Error()+" ") {
		t.Errorf("unreachable controller: %q", rep.Controllers[1].Errors)
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

// A request the context has ended fails as unreachable, in its place.
func TestCollectContextEnded(t *testing.T) {
	srv := controllerServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep := Fetcher{}.Collect(ctx, []Source{source(t, srv.URL)}, nil)
	if rep.Failed() != 1 || len(rep.Controllers[0].Errors) != 1 || !strings.Contains(rep.Controllers[0].Errors[0], "context canceled") {
		t.Errorf("report %+v", rep)
	}
	if srv.requests.Load() != 0 {
		t.Errorf("%d requests sent after the context ended", srv.requests.Load())
	}
}

// TestGlobal reads a global member's regions and plan, and a member
// without a plan.
func TestGlobal(t *testing.T) {
	leader := globalServer(t, statusPlanFixture())
	standby := globalServer(t, nil)
	rep, got := collect(t, nil, []string{leader.URL, standby.URL})
	t.Log("\n" + got)
	if n := rep.Failed(); n != 0 {
		t.Fatalf("%d sources failed", n)
	}
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

	b, err := json.Marshal(Report{Globals: rep.Globals[:1]})
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Globals []struct {
			Leader  bool
			Regions []debugapi.RegionStatus
			Plan    json.RawMessage
		}
	}
	if err := json.Unmarshal(b, &back); err != nil || len(back.Globals) != 1 {
		t.Fatalf("json: %v\n%s", err, b)
	}
	var plan isobarpb.RoutingPlan
	if err := protojson.Unmarshal(back.Globals[0].Plan, &plan); err != nil || plan.GetEpoch() != 7 || len(plan.GetPlans()) != 2 {
		t.Errorf("plan in json: %v %v", err, &plan)
	}
}

// TestRealController reads a real regional controller's debug API (no
// cells yet, no cross-region routing).
func TestRealController(t *testing.T) {
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
	rep, got := collect(t, []string{c.HTTPAddr()}, nil)
	t.Log("\n" + got)
	if n := rep.Failed(); n != 0 {
		t.Fatalf("%d sources failed: %q", n, rep.Controllers[0].Errors)
	}
	for _, want := range []string{"== controller " + c.HTTPAddr() + ": 0 cells, cycle ", "no cells\n", "routes: local\n", "all traffic served locally\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
