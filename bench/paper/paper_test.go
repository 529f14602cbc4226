package paper

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmokeReport runs every stage at smoke size and checks the report's
// shape and invariants (not the figures: smoke runs are too short).
func TestSmokeReport(t *testing.T) {
	dir := t.TempDir()
	rep, err := Run(context.Background(), DefaultConfig(), Options{Mode: Smoke, Seed: 1}, dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Stages         map[string]map[string]map[string]*float64 `json:"stages"`
		RequestDigests map[string]map[string]string              `json:"request_digests"`
		Targets        []Target                                  `json:"targets"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("report.json: %v", err)
	}
	for _, s := range Stages() {
		pols, ok := got.Stages[s]
		if !ok {
			t.Errorf("stage %s missing", s)
			continue
		}
		for _, p := range stagePolicies(s) {
			f, ok := pols[string(p)]
			if !ok || len(f) == 0 {
				t.Errorf("%s: policy %s missing", s, p)
				continue
			}
			for k, v := range f {
				if k != strings.ToLower(k) || strings.ContainsAny(k, " -") {
					t.Errorf("%s/%s: figure %q is not snake_case", s, p, k)
				}
				// Reductions are negative where isobar is worse.
				if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0) || (*v < 0 && !strings.Contains(k, "_reduction_"))) {
					t.Errorf("%s/%s: %s = %v", s, p, k, *v)
				}
			}
		}
		// Every policy of a stage ran the same requests.
		var first string
		for _, p := range stagePolicies(s) {
			d := got.RequestDigests[s][string(p)]
			if d == "" {
				t.Errorf("%s: no request digest for %s", s, p)
			}
			if first == "" {
				first = d
			} else if d != first {
				t.Errorf("%s: %s ran different requests (%s vs %s)", s, p, d, first)
			}
		}
	}
	for _, want := range []struct{ stage, policy, fig string }{
		{StageCalibration, "rr", "ttft_p95_ms"}, {StageSLOThroughput, "isobar", "baseline_mixed_sustainable_rps"},
		{StageFailover, "isobar", "reroute_p99_ms"}, {StageFailover, "rr", "post_kill_success"},
		{StageMismatch, "isobar-capability", "leak_rate"}, {StageMismatch, "rr", "long_prompt_success"},
		{StageNetwork, "isobar-gpu-only", "jitter_ttft_p95_ms"}, {StageBurst, "lr", "burst_success"},
		{StageTelemetryFailure, "isobar", "fallback_engage_p50_ms"}, {StageLeadTime, "isobar", "slo_breaches"},
	} {
		if v := got.Stages[want.stage][want.policy][want.fig]; v == nil {
			t.Errorf("%s/%s: %s missing or null", want.stage, want.policy, want.fig)
		}
	}
	// Invariants that hold at any size.
	st := rep.Stages
	if v := *st[StageMismatch]["isobar-capability"]["leak_rate"]; v != 0 {
		t.Errorf("capability discovery leaked %.4f of long prompts", v)
	}
	if v := *st[StageMismatch]["rr"]["leak_rate"]; v <= 0 {
		t.Errorf("round-robin never sent a long prompt to the constrained cell (leak %v)", v)
	}
	for _, p := range []string{"rr", "lr", "isobar"} {
		f := st[StageCalibration][p]
		if !(*f["ttft_p50_ms"] <= *f["ttft_p95_ms"] && *f["ttft_p95_ms"] <= *f["ttft_p99_ms"]) {
			t.Errorf("calibration %s: percentiles out of order: %v %v %v", p, *f["ttft_p50_ms"], *f["ttft_p95_ms"], *f["ttft_p99_ms"])
		}
		if s := *f["success"]; s < 0.9 || s > 1 {
			t.Errorf("calibration %s: success %v", p, s)
		}
	}
	if st[StageTelemetryFailure]["rr"]["fallback_engage_p50_ms"] != nil {
		t.Error("round-robin has no telemetry fallback, yet a figure is reported")
	}
	if len(got.Targets) != len(targets()) {
		t.Errorf("%d targets evaluated, want %d", len(got.Targets), len(targets()))
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Calibration", "| policy |", "published rr", "## Targets", "| baseline_mixed |"} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("report.md lacks %q", s)
		}
	}
	for _, c := range rep.Charts {
		png, err := os.ReadFile(filepath.Join(dir, c))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s is not a PNG", c)
		}
	}
	if len(rep.Charts) != 3 {
		t.Errorf("charts %v, want 3", rep.Charts)
	}
}

// TestSameRequestsAcrossPolicies checks the property the digests stand
// for: a workload generates identical requests whatever runs them, and a
// different seed gives different ones.
func TestSameRequestsAcrossPolicies(t *testing.T) {
	w := workload{mix: []mixPart{{class("baseline_mixed"), 0.7}, {class("long_context"), 0.3}}, rps: 10, duration: 30 * time.Second, seed: 4}
	a, b := w.generate(DefaultConfig().Profile), w.generate(DefaultConfig().Profile)
	if digest(a) != digest(b) || len(a) == 0 {
		t.Fatal("same workload, different requests")
	}
	w.seed = 5
	if digest(w.generate(DefaultConfig().Profile)) == digest(a) {
		t.Fatal("different seeds, same requests")
	}
}

// TestFailoverMechanics checks, on one kill, what each policy's data plane
// does: isobar stops choosing the dead cell within the detection delay,
// round-robin only after its health checks fail.
func TestFailoverMechanics(t *testing.T) {
	cfg := DefaultConfig()
	w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 10, duration: 20 * time.Second, seed: 9}
	reqs := w.generate(cfg.Profile)
	kill := 10 * time.Second
	for _, tc := range []struct {
		p        Policy
		min, max time.Duration
	}{
		{Isobar, 0, cfg.DataPlane.KillDetect + cfg.DataPlane.PushDelay + 50*time.Millisecond},
		{RR, cfg.DataPlane.HCInterval * time.Duration(cfg.DataPlane.HCUnhealthy-1), cfg.DataPlane.HCInterval*time.Duration(cfg.DataPlane.HCUnhealthy) + time.Second},
	} {
		f, err := newFleet(cfg, runSpec{policy: tc.p, requests: reqs, faults: []fault{{at: kill, kind: faultKill, cell: 4}}, until: 60 * time.Second, seed: 9})
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.run()
		if err != nil {
			t.Fatal(err)
		}
		got := res.removedAt[4] - kill
		if res.removedAt[4] < 0 || got < tc.min || got > tc.max {
			t.Errorf("%s: removed %v after the kill, want within [%v, %v]", tc.p, got, tc.min, tc.max)
		}
		for _, q := range res.requests {
			if q.arrive > kill+tc.max && q.cell == 4 && q.attempts == 1 {
				t.Errorf("%s: request at %v still sent to the dead cell", tc.p, q.arrive)
				break
			}
		}
	}
}

func TestValidate(t *testing.T) {
	c := DefaultConfig()
	c.DataPlane.Heartbeat = 0
	if err := c.Validate(); err == nil {
		t.Fatal("zero heartbeat accepted")
	}
	if _, err := Run(context.Background(), DefaultConfig(), Options{Mode: "huge"}, t.TempDir()); err == nil {
		t.Fatal("unknown mode accepted")
	}
	if _, err := Run(context.Background(), DefaultConfig(), Options{Stages: []string{"nope"}}, t.TempDir()); err == nil {
		t.Fatal("unknown stage accepted")
	}
	if _, err := ParsePolicy("nope"); err == nil {
		t.Fatal("unknown policy accepted")
	}
}
