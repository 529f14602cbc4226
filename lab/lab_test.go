package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A short headless run: traffic flows through every cell, nearly all of it
// succeeds, and the report has the documented shape.
func TestLabHeadlessReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "lab.json")
	var view bytes.Buffer
	cfg := Config{
		Cells: 3, RPS: 30, MaxTokens: 32, TimeScale: 0.1, HeartbeatInterval: 100 * time.Millisecond,
		Duration: 4 * time.Second, Report: out, View: true, ViewEvery: time.Second,
	}
	if err := Run(context.Background(), cfg, Deps{Out: &view}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, b)
	}
	var raw map[string]any
	_ = json.Unmarshal(b, &raw)
	for _, k := range []string{"total", "regions"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("report lacks %q", k)
		}
	}
	if rep.Total.Requests < 40 {
		t.Fatalf("only %d requests in 4 s at 30 RPS", rep.Total.Requests)
	}
	if rate := float64(rep.Total.Succeeded) / float64(rep.Total.Requests); rate < 0.99 {
		t.Errorf("success rate %.3f < 0.99: %+v", rate, rep.Total)
	}
	if rep.Total.TTFTms.P50 <= 0 || rep.Total.TTFTms.P50 > rep.Total.TTFTms.P99 {
		t.Errorf("implausible TTFT percentiles %+v", rep.Total.TTFTms)
	}
	reg, ok := rep.Regions["local"]
	if !ok || len(reg.Cells) != 3 {
		t.Fatalf("regions = %+v", rep.Regions)
	}
	sum := 0
	for id, c := range reg.Cells {
		if c.Requests == 0 {
			t.Errorf("cell %s served nothing", id)
		}
		sum += c.Requests
	}
	if sum != rep.Total.Requests {
		t.Errorf("cells add up to %d, total says %d", sum, rep.Total.Requests)
	}
	for _, want := range []string{"local-cell-0", "PRESSURE", "WEIGHT", "TTFT P50"} {
		if !strings.Contains(view.String(), want) {
			t.Errorf("live view lacks %q", want)
		}
	}
}

func TestLabConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{Cells: -1}, {Cells: 100}, {RPS: -1}, {Duration: -time.Second}} {
		if err := Run(context.Background(), cfg, Deps{}); err == nil {
			t.Errorf("Run(%+v) accepted a bad config", cfg)
		}
	}
}
