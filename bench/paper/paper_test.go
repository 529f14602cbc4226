package paper

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/bench/load"
)

// TestSmokeReport runs every stage at smoke size on both grounds at two
// seeds and checks the report's shape and invariants (not the figures:
// smoke runs are too short).
func TestSmokeReport(t *testing.T) {
	dir := t.TempDir()
	grounds, err := Grounds()
	if err != nil {
		t.Fatal(err)
	}
	// Every stage but issue 25's two, which TestOverloadAndRetryStormStages
	// runs at smoke size on its own: the 150 % overload of the stock-Envoy
	// baselines is the heaviest trial of all (every request queues in the
	// engines), and under the race detector, beside the lab's drills, it
	// doubled this test's time.
	var stages []string
	for _, s := range Stages() {
		if s != StageOverloadPriority && s != StageRetryStorm {
			stages = append(stages, s)
		}
	}
	rep, err := Run(context.Background(), grounds, Options{Mode: Smoke, Seed: 1, Stages: stages}, dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Seeds   []uint64 `json:"seeds"`
		Grounds map[string]struct {
			Stages         map[string]map[string]map[string]Agg `json:"stages"`
			RequestDigests map[string]map[string]string         `json:"request_digests"`
			Targets        []Target                             `json:"targets"`
			Knee           string                               `json:"knee"`
		} `json:"grounds"`
		Published map[string]any `json:"published"`
		Method    string         `json:"method"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("report.json: %v", err)
	}
	if len(got.Seeds) != 2 || got.Method == "" || len(got.Published) == 0 {
		t.Fatalf("seeds %v, method %q, %d published stages", got.Seeds, got.Method, len(got.Published))
	}
	for _, gname := range []string{GroundPhysics, GroundPaperFit} {
		g, ok := got.Grounds[gname]
		if !ok {
			t.Fatalf("ground %s missing", gname)
		}
		if !strings.Contains(g.Knee, "published 12 RPS") {
			t.Errorf("%s: knee %q", gname, g.Knee)
		}
		for _, s := range stages {
			pols, ok := g.Stages[s]
			physicsOnly := s == StageHetero || s == StageHomogeneous6
			if physicsOnly && gname != GroundPhysics {
				if ok {
					t.Errorf("%s: physics-only stage %s ran", gname, s)
				}
				continue
			}
			if !ok {
				t.Errorf("%s: stage %s missing", gname, s)
				continue
			}
			for _, p := range stagePolicies(s) {
				f, ok := pols[string(p)]
				if !ok || len(f) == 0 {
					t.Errorf("%s/%s: policy %s missing", gname, s, p)
					continue
				}
				for k, a := range f {
					if k != strings.ToLower(k) || strings.ContainsAny(k, " -") {
						t.Errorf("%s/%s/%s: figure %q is not snake_case", gname, s, p, k)
					}
					if a.Median == nil {
						continue
					}
					if a.Min == nil || a.Max == nil || *a.Min > *a.Median || *a.Median > *a.Max || a.N < 1 || a.N > 2 {
						t.Errorf("%s/%s/%s: %s = %+v: want min <= median <= max over 1–2 seeds", gname, s, p, k, a)
					}
					// Reductions are negative where isobar is worse, lead times where
					// the alert came after the crossing.
					if v := *a.Median; math.IsNaN(v) || math.IsInf(v, 0) || (v < 0 && !strings.Contains(k, "_reduction_") && !strings.HasPrefix(k, "lead_time_")) {
						t.Errorf("%s/%s/%s: %s = %v", gname, s, p, k, v)
					}
				}
			}
			// Every policy of a stage ran the same requests.
			var first string
			for _, p := range stagePolicies(s) {
				d := g.RequestDigests[s][string(p)]
				if d == "" {
					t.Errorf("%s/%s: no request digest for %s", gname, s, p)
				}
				if first == "" {
					first = d
				} else if d != first {
					t.Errorf("%s/%s: %s ran different requests (%s vs %s)", gname, s, p, d, first)
				}
			}
		}
		for _, want := range []struct{ stage, policy, fig string }{
			{StageCalibration, "rr", "ttft_p95_ms"}, {StageSLOThroughput, "isobar", "baseline_mixed_sustainable_rps"},
			{StageSLOThroughput, "lr", "baseline_mixed_oracle_fraction"},
			{StageFailover, "isobar", "reroute_p99_ms"}, {StageFailover, "rr-plain", "post_kill_success"},
			{StageMismatch, "isobar-capability", "leak_rate"}, {StageMismatch, "rr", "long_prompt_success"},
			{StageNetwork, "isobar-gpu-only", "jitter_ttft_p95_ms"}, {StageBurst, "lr", "burst_success"},
			{StageTelemetryFailure, "isobar", "fallback_engage_p50_ms"}, {StageLeadTime, "isobar", "slo_breaches"},
			{StageThrottled, "isobar-envoy", "sustainable_rps"}, {StageSLOThroughput, "isobar-envoy", "baseline_mixed_vs_lr"},
		} {
			if a := g.Stages[want.stage][want.policy][want.fig]; a.Median == nil {
				t.Errorf("%s/%s/%s: %s missing or null", gname, want.stage, want.policy, want.fig)
			}
		}
		if gname == GroundPhysics {
			for _, want := range []struct{ stage, policy, fig string }{
				{StageHetero, "rr", "e2e_p99_served_ms"}, {StageHetero, "isobar", "e2e_p99_ms"}, {StageHetero, "isobar", "constrained_weight_ratio"},
				{StageHetero, "oracle", "sustainable_rps"}, {StageHomogeneous6, "lr", "e2e_p99_ms_at_20rps"},
			} {
				if a := g.Stages[want.stage][want.policy][want.fig]; a.Median == nil {
					t.Errorf("%s/%s/%s: %s missing or null", gname, want.stage, want.policy, want.fig)
				}
			}
			if a := g.Stages[StageHetero]["rr"]["constrained_weight_ratio"]; a.Median != nil {
				t.Errorf("rr has no weights, yet a constrained weight ratio is reported: %v", *a.Median)
			}
		}
		// Invariants that hold at any size.
		st := rep.Grounds[gname].Stages
		for _, p := range []string{"isobar-capability", "oracle"} {
			if v := *st[StageMismatch][p]["leak_rate"].Max; v != 0 {
				t.Errorf("%s: %s leaked %.4f of long prompts", gname, p, v)
			}
		}
		if v := *st[StageMismatch]["rr"]["leak_rate"].Min; v <= 0 {
			t.Errorf("%s: round-robin never sent a long prompt to the constrained cell (leak %v)", gname, v)
		}
		for _, p := range []string{"rr", "lr", "isobar", "oracle"} {
			f := st[StageCalibration][p]
			if !(*f["ttft_p50_ms"].Median <= *f["ttft_p95_ms"].Median && *f["ttft_p95_ms"].Median <= *f["ttft_p99_ms"].Median) {
				t.Errorf("%s calibration %s: percentiles out of order: %v %v %v", gname, p, *f["ttft_p50_ms"].Median, *f["ttft_p95_ms"].Median, *f["ttft_p99_ms"].Median)
			}
			if s := *f["success"].Min; s < 0.9 || s > 1 {
				t.Errorf("%s calibration %s: success %v", gname, p, s)
			}
		}
		if st[StageTelemetryFailure]["rr"]["fallback_engage_p50_ms"].Median != nil {
			t.Errorf("%s: round-robin has no telemetry fallback, yet a figure is reported", gname)
		}
		want := 0
		for _, tg := range targets() {
			if slices.Contains(stages, tg.Stage) {
				want++
			}
		}
		if len(g.Targets) != want {
			t.Errorf("%s: %d targets evaluated, want %d (those of the stages run)", gname, len(g.Targets), want)
		}
		if n := len(rep.Grounds[gname].Charts); n != 3 {
			t.Errorf("%s: charts %v, want 3", gname, rep.Grounds[gname].Charts)
		}
		for _, c := range rep.Grounds[gname].Charts {
			png, err := os.ReadFile(filepath.Join(dir, c))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("%s is not a PNG", c)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"# Ground `physics`", "# Ground `paper-fit`", "## Calibration", "| policy |", "published rr",
		"## Targets", "| baseline_mixed |", "Verdicts per class", "×o)"} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("report.md lacks %q", s)
		}
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
// round-robin with outlier detection at its first refused connection, and
// plain round-robin only after its health checks fail.
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
		// rr-plain waits for its health checks; rr, with outlier
		// detection, ejects the cell at its first refused connection.
		{RRPlain, cfg.DataPlane.HCInterval * time.Duration(cfg.DataPlane.HCUnhealthy-1), cfg.DataPlane.HCInterval*time.Duration(cfg.DataPlane.HCUnhealthy) + time.Second},
		{RR, 0, 3 * time.Second},
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
	one := []Config{DefaultConfig()}
	if _, err := Run(context.Background(), one, Options{Mode: "huge"}, t.TempDir()); err == nil {
		t.Fatal("unknown mode accepted")
	}
	if _, err := Run(context.Background(), one, Options{Stages: []string{"nope"}}, t.TempDir()); err == nil {
		t.Fatal("unknown stage accepted")
	}
	if _, err := Run(context.Background(), []Config{DefaultConfig(), DefaultConfig()}, Options{}, t.TempDir()); err == nil {
		t.Fatal("a ground given twice accepted")
	}
	if _, err := Run(context.Background(), one, Options{Seeds: -1}, t.TempDir()); err == nil {
		t.Fatal("negative seeds accepted")
	}
	if _, err := ParsePolicy("nope"); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

// TestSameDrawsAcrossPolicies: request i's network delay comes from its
// own keyed source, so every policy sees the same draws whatever else it
// consumes (rr's health-check probes, the isobar policies' RTT probes, the
// oracle's nothing). All sites sit at the same distance with the same
// jitter, so the outbound trip of each request's first attempt depends on
// the draw alone and must match across policies.
func TestSameDrawsAcrossPolicies(t *testing.T) {
	cfg := DefaultConfig()
	for i := range cfg.Topology.Sites {
		cfg.Topology.Sites[i].OneWay = 5 * time.Millisecond
	}
	w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 8, duration: 20 * time.Second, seed: 11}
	reqs := w.generate(cfg.Profile)
	var faults []fault
	for s := range cfg.Topology.Sites {
		faults = append(faults, fault{at: 0, kind: faultJitter, site: s, value: float64(10 * time.Millisecond)})
	}
	var want []time.Duration
	for _, p := range []Policy{RR, LR, Isobar, Oracle} {
		f, err := newFleet(cfg, runSpec{policy: p, requests: reqs, faults: faults, until: 60 * time.Second, seed: 11})
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.run()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]time.Duration, len(res.requests))
		distinct := map[time.Duration]bool{}
		for i, q := range res.requests {
			if q.attempts != 1 || q.status != statusOK {
				t.Fatalf("%s: request %d: %d attempts, status %d", p, i, q.attempts, q.status)
			}
			got[i] = q.engineArrive - q.arrive
			distinct[got[i]] = true
		}
		if len(distinct) < len(got)/2 {
			t.Fatalf("%s: %d distinct trip delays over %d requests: the jitter is not drawn", p, len(distinct), len(got))
		}
		if want == nil {
			want = got
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: request %d's outbound trip %v, rr's %v: the draws differ by policy", p, i, got[i], want[i])
			}
		}
	}
}

// TestPaperFitCalibrationRow: the paper-fit ground is unchanged. With
// the workload its calibration row was measured on (512±200 normal
// prompts, exactly 128 output tokens, one Envoy worker), rr at 10 RPS
// still gives the row 70b-awq-flat was frozen with: TTFT P50 324 ms, P95
// 621 ms, P99 792 ms, E2E P95 5.7 s (seeds differ: the tolerance covers
// seed-to-seed spread).
func TestPaperFitCalibrationRow(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataPlane.Workers = 1
	legacy := load.Dist{Mean: 512, StdDev: 200, Normal: true}
	var all []request
	for s := range uint64(3) {
		w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 10, duration: 80 * time.Second, seed: 100 + s}
		reqs := w.generate(cfg.Profile)
		rng := rand.New(rand.NewPCG(s, 7))
		for i := range reqs {
			reqs[i].prompt, reqs[i].out = legacy.Sample(rng), 128
		}
		f, err := newFleet(cfg, runSpec{policy: RR, requests: reqs, until: w.duration + drain, seed: 100 + s})
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.run()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range res.requests {
			if q.arrive >= 10*time.Second && q.arrive < 70*time.Second {
				all = append(all, q)
			}
		}
	}
	st := summarise(all, func(*request) bool { return true })
	for _, c := range []struct {
		name      string
		got, want time.Duration
		tol       float64
	}{
		{"TTFT P50", st.ttftP50, 324 * time.Millisecond, 0.15},
		{"TTFT P95", st.ttftP95, 621 * time.Millisecond, 0.20},
		{"TTFT P99", st.ttftP99, 792 * time.Millisecond, 0.30},
		{"E2E P95", st.e2eP95, 5700 * time.Millisecond, 0.10},
	} {
		if d := math.Abs(float64(c.got)/float64(c.want) - 1); d > c.tol {
			t.Errorf("%s = %v, want %v ± %.0f %%", c.name, c.got, c.want, 100*c.tol)
		}
	}
	t.Logf("paper-fit rr calibration: TTFT P50 %v P95 %v P99 %v, E2E P95 %v over %d requests", st.ttftP50, st.ttftP95, st.ttftP99, st.e2eP95, st.n)
}

// TestVerdict: a win or a loss is claimed only when every seed has a
// ratio and they all agree.
func TestVerdict(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		a    Agg
		want string
	}{
		{Agg{Median: f(1.1), Min: f(1.05), Max: f(1.2), N: 3}, "win"},
		{Agg{Median: f(0.8), Min: f(0.7), Max: f(0.9), N: 3}, "loss"},
		{Agg{Median: f(1.1), Min: f(0.98), Max: f(1.2), N: 3}, "mixed"},
		{Agg{Median: f(1), Min: f(1), Max: f(1), N: 3}, "mixed"},
		{Agg{Median: f(0), Min: f(0), Max: f(0), N: 1}, "undecided"},
		{Agg{}, "—"},
	} {
		if got := verdict(tc.a, 3); got != tc.want {
			t.Errorf("verdict(%+v) = %q, want %q", tc.a, got, tc.want)
		}
	}
	if a := aggregate([]float64{3, 1, 2, 10}); *a.Median != 2.5 || *a.Min != 1 || *a.Max != 10 || a.N != 4 {
		t.Errorf("aggregate = %+v", a)
	}
}

// TestPrefixPolicies runs multiturn at one rate with prefix caching on:
// the prefix-aware policies find more of the prompts cached than isobar
// without affinity; prefix-hash keeps every turn of a conversation on
// one cell; without prefix caching nothing is found.
func TestPrefixPolicies(t *testing.T) {
	cfg, err := PhysicsConfig()
	if err != nil {
		t.Fatal(err)
	}
	w := workload{mix: []mixPart{{class("multiturn"), 1}}, rps: 12, duration: 40 * time.Second, seed: 3}
	reqs := w.generate(cfg.Profile)
	hits := map[Policy]float64{}
	for _, p := range []Policy{Isobar, IsobarAffinity, PrefixHash, PrecisePrefix} {
		f, err := newFleet(cfg, runSpec{policy: p, requests: reqs, until: w.duration + drain, seed: 3, prefixCache: true})
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.run()
		if err != nil {
			t.Fatal(err)
		}
		hits[p] = deref(hitRate(res))
		if p == PrefixHash {
			// A turn that shares the hashed blocks (the first 128
			// tokens) with the previous one goes to its cell.
			cell, same := map[uint64]int{}, 0
			for _, q := range res.requests {
				if c, ok := cell[q.session]; ok && q.attempts == 1 && q.shared >= prefixHashBlocks*16 {
					if c != q.cell {
						t.Fatalf("prefix-hash: session %d moved from cell %d to %d", q.session, c, q.cell)
					}
					same++
				}
				cell[q.session] = q.cell
			}
			if same == 0 {
				t.Fatal("prefix-hash: no turn checked")
			}
		}
	}
	for _, p := range []Policy{IsobarAffinity, PrefixHash, PrecisePrefix} {
		if !(hits[p] > hits[Isobar]+0.2) {
			t.Errorf("%s hit rate %.3f, isobar's %.3f: want well above", p, hits[p], hits[Isobar])
		}
	}
	f, err := newFleet(cfg, runSpec{policy: IsobarAffinity, requests: reqs, until: w.duration + drain, seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.run()
	if err != nil {
		t.Fatal(err)
	}
	if res.prefixQueries != 0 || res.prefixHits != 0 {
		t.Fatalf("prefix caching off: %d queries, %d hits", res.prefixQueries, res.prefixHits)
	}
}
