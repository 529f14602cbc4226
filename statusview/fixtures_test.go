package statusview

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// statusAt is the controller clock of the recorded fixtures.
var statusAt = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// statusCellsFixture is a recorded GET /debug/cells answer built from the
// real types, so a change of their JSON shape breaks these tests.
func statusCellsFixture() cellsAnswer {
	return cellsAnswer{At: statusAt, Cycle: 4242, Cells: []debugapi.CellDebug{
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
			Signals:  map[string]debugapi.SignalDebug{"queue_depth": {Normalized: 0.3, Weight: 1, Contribution: 0.3}},
			Pressure: 0.41234, Weight: 37, TargetWeight: 40,
			Sources: map[string]debugapi.SourceDebug{"vllm": {OK: true}, "dcgm": {OK: false, Error: "connection refused"}},
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
func statusRoutesFixture() debugapi.RouteTable {
	return debugapi.RouteTable{
		Source: debugapi.RoutesPlan, Epoch: 7, Sequence: 12, LeaderID: "global-a",
		IssuedAt: statusAt.Add(-2 * time.Second), ValidUntil: statusAt.Add(28 * time.Second),
		Models: map[string]debugapi.ModelRoutes{
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
	regions := map[string]any{"leader": true, "regions": []debugapi.RegionStatus{
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

// source parses a test server's address.
func source(t *testing.T, addr string) Source {
	t.Helper()
	s, err := ParseSource(addr)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// collect reads the given addresses with a fresh client, as `isobar
// status` would, and renders the table.
func collect(t *testing.T, ctrls, globals []string) (Report, string) {
	t.Helper()
	var cs, gs []Source
	for _, a := range ctrls {
		cs = append(cs, source(t, a))
	}
	for _, a := range globals {
		gs = append(gs, source(t, a))
	}
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	rep := Fetcher{Client: client, Timeout: 5 * time.Second}.Collect(context.Background(), cs, gs)
	var out bytes.Buffer
	if err := WriteTable(&out, rep); err != nil {
		t.Fatal(err)
	}
	return rep, out.String()
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
