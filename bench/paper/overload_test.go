package paper

import (
	"cmp"
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/reqclass"
)

// TestOverloadClassDraws checks the overload stage's per-request draws:
// the criticality and tenant shares, the same sequence for the same seed
// at any rate (request i keeps its class), and another sequence at
// another seed.
func TestOverloadClassDraws(t *testing.T) {
	gen := func(rps float64, seed uint64) []request {
		w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: rps, duration: 400 * time.Second, seed: seed}
		reqs := w.generate(DefaultConfig().Profile)
		assignClasses(reqs, seed)
		return reqs
	}
	a, b := gen(20, 7), gen(20, 7)
	if classDigest(a) != classDigest(b) || digest(a) != digest(b) {
		t.Fatal("same seed, different draws")
	}
	if classDigest(gen(20, 8)) == classDigest(a) {
		t.Fatal("different seeds, same classes")
	}
	slow := gen(10, 7)
	for i := range slow {
		if slow[i].crit != a[i].crit || slow[i].tenant != a[i].tenant {
			t.Fatalf("request %d: class %v/%d at 10 RPS, %v/%d at 20 RPS", i, slow[i].crit, slow[i].tenant, a[i].crit, a[i].tenant)
		}
	}
	var byCrit [reqclass.Count]int
	quiet := 0
	for _, r := range a {
		byCrit[r.crit]++
		if r.tenant == tenantQuiet {
			quiet++
		}
	}
	n := float64(len(a))
	for c, want := range overloadMix {
		if got := float64(byCrit[c]) / n; math.Abs(got-want) > 0.03 {
			t.Errorf("%s share %.3f, want %.2f", reqclass.Criticality(c), got, want)
		}
	}
	if got := float64(quiet) / n; math.Abs(got-(1-loudShare)) > 0.03 {
		t.Errorf("quiet tenant share %.3f, want %.3f", got, 1-loudShare)
	}
}

// TestOverloadAndRetryStormStages runs both stages at smoke size on the
// paper-fit ground and checks that every policy has its figures, ran the
// same requests and classes, and that the figures hang together.
func TestOverloadAndRetryStormStages(t *testing.T) {
	rep, err := Run(context.Background(), []Config{DefaultConfig()},
		Options{Mode: Smoke, Seed: 3, Seeds: 1, Stages: []string{StageOverloadPriority, StageRetryStorm}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	gr := rep.Grounds[GroundPaperFit]
	for _, s := range []string{StageOverloadPriority, StageRetryStorm} {
		var first string
		for _, p := range stagePolicies(s) {
			d := gr.RequestDigests[s][string(p)]
			if d == "" || (first != "" && d != first) {
				t.Errorf("%s/%s: digest %q, first policy's %q", s, p, d, first)
			}
			if first == "" {
				first = d
			}
		}
	}
	med := func(s string, p Policy, k string) float64 {
		t.Helper()
		a := gr.Stages[s][string(p)][k]
		if a.Median == nil {
			t.Fatalf("%s/%s/%s missing", s, p, k)
		}
		return *a.Median
	}
	for _, p := range stagePolicies(StageOverloadPriority) {
		for _, k := range []string{"critical_success", "standard_ttft_p95_ms", "sheddable_goodput", "tenant_quiet_success", "tenant_loud_success", "goodput"} {
			if v := med(StageOverloadPriority, p, k); v < 0 || (k != "standard_ttft_p95_ms" && v > 1) {
				t.Errorf("overload/%s: %s = %v", p, k, v)
			}
		}
		if o, c := med(StageOverloadPriority, p, "offered_rps"), med(StageOverloadPriority, p, "capacity_rps"); math.Abs(o-overloadFactor*c) > 1e-9 || c <= 0 {
			t.Errorf("overload/%s: offered %v for capacity %v", p, o, c)
		}
	}
	// The stock-Envoy baselines have no in-flight cap: nothing is shed.
	if v := med(StageOverloadPriority, RR, "sheddable_success"); v < 0.99 {
		t.Errorf("rr shed %.3f of sheddable requests without a cap", 1-v)
	}
	if d, g := med(StageOverloadPriority, Isobar, "goodput_reduction_vs_nocrit"), med(StageOverloadPriority, IsobarNoCrit, "goodput"); math.Abs(d-(g-med(StageOverloadPriority, Isobar, "goodput"))) > 1e-9 {
		t.Errorf("goodput reduction %v against isobar-nocrit's %v", d, g)
	}
	for _, p := range stagePolicies(StageRetryStorm) {
		if v := med(StageRetryStorm, p, "attempts_per_request"); v < 1 || v > 2 {
			t.Errorf("retry storm/%s: %v attempts per request (one retry at most)", p, v)
		}
	}
	if v := med(StageRetryStorm, RR, "brownout_site_attempt_share"); math.Abs(v-1.0/3) > 0.05 {
		t.Errorf("rr sent %.3f of its attempts to the browned-out site, want about a third", v)
	}
	if st, dyn := med(StageRetryStorm, IsobarStaticBudget, "retry_budget_pct_mean"), med(StageRetryStorm, Isobar, "retry_budget_pct_mean"); st != 20 || dyn >= st {
		t.Errorf("retry budget: static %v %%, dynamic %v %% (want 20 and below)", st, dyn)
	}
}

// TestDynamicRetryBudget checks the fleet's dynamic budget against
// regional/xds's curve: the full budget with headroom, the floor at
// saturation, from the arrivals of the last signal window.
func TestDynamicRetryBudget(t *testing.T) {
	cases := []struct {
		name     string
		arrivals int // in the last 10 s window, capacity 10 RPS
		want     float64
	}{
		{"idle", 0, 20}, {"half", 50, 20}, {"saturated", 100, 1}, {"over", 150, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := newFleet(DefaultConfig(), runSpec{policy: Isobar, seed: 1, capacityRPS: 10, dynamicBudget: true})
			if err != nil {
				t.Fatal(err)
			}
			f.now = 30 * time.Second
			f.arrivals = append(f.arrivals, 5*time.Second, 19*time.Second) // before the window
			for k := range tc.arrivals {
				f.arrivals = append(f.arrivals, 20*time.Second+time.Duration(k+1)*time.Millisecond)
			}
			if got := f.dynamicBudgetPercent(f.utilisation()); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("budget %v %%, want %v", got, tc.want)
			}
			if len(f.arrivals) != tc.arrivals {
				t.Errorf("%d arrivals kept, want the window's %d", len(f.arrivals), tc.arrivals)
			}
		})
	}
}

// TestFlowControlInFleet drives the gateway's flow-control queue in the
// fleet: a burst saturates every endpoint at an in-flight cap of 1.
// isobar queues the excess, dispatches the critical requests first and
// loses none of them; isobar-nocrit answers the excess 429 whatever its
// criticality.
func TestFlowControlInFleet(t *testing.T) {
	cfg := DefaultConfig()
	w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 1000, duration: 40 * time.Millisecond, seed: 5}
	reqs := w.generate(cfg.Profile)
	assignClasses(reqs, 5)
	if len(reqs) < 2*cfg.Topology.Cells() {
		t.Fatalf("%d requests: too few to saturate %d cells", len(reqs), cfg.Topology.Cells())
	}
	run := func(p Policy) []request {
		t.Helper()
		f, err := newFleet(cfg, runSpec{policy: p, requests: reqs, until: 300 * time.Second, seed: 5, inflightCap: 1, flowControl: p == Isobar})
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.run()
		if err != nil {
			t.Fatal(err)
		}
		return res.requests
	}
	iso, queued := run(Isobar), 0
	for i, r := range iso {
		if r.queued {
			queued++
		}
		if r.crit == reqclass.Critical && r.status != statusOK {
			t.Errorf("isobar: critical request %d ended %d", i, r.status)
		}
		// Strict priority: a queued critical request waiting when a
		// less important one was dispatched went out before it.
		for j, c := range iso {
			if r.queued && c.queued && r.status == statusOK && c.crit < r.crit && c.arrive < r.sentAt && c.sentAt > r.sentAt {
				t.Errorf("isobar: %s request %d dispatched at %v before waiting %s request %d (dispatched at %v)", r.crit, i, r.sentAt, c.crit, j, c.sentAt)
			}
		}
	}
	if queued == 0 {
		t.Error("isobar: nothing waited in the queue")
	}
	critShed := 0
	for _, r := range run(IsobarNoCrit) {
		if r.queued {
			t.Fatal("isobar-nocrit queued a request")
		}
		if r.crit == reqclass.Critical && r.status == statusShed {
			critShed++
		}
	}
	if critShed == 0 {
		t.Error("isobar-nocrit: no critical request was answered 429 at saturation")
	}
}

// TestEndpointCapInFleet: with the per-endpoint cap (batchCap) a burst
// never holds more than an engine's batch in flight on one cell on the
// paper-fit ground (max_num_seqs 9; its round trips are far too short
// against its replies to send one early), and the rest waits in the
// gateway's queue; with the configured cap alone (64) the burst piles onto
// the engines.
func TestEndpointCapInFleet(t *testing.T) {
	cfg := DefaultConfig()
	w := workload{mix: []mixPart{{class("baseline_mixed"), 1}}, rps: 1000, duration: 200 * time.Millisecond, seed: 5}
	reqs := w.generate(cfg.Profile)
	assignClasses(reqs, 5)
	peak := func(batchCap bool) (int, int) {
		t.Helper()
		f, err := newFleet(cfg, runSpec{policy: Isobar, requests: reqs, until: 300 * time.Second, seed: 5,
			inflightCap: 64, flowControl: true, batchCap: batchCap})
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.run()
		if err != nil {
			t.Fatal(err)
		}
		// In flight per cell: the single-attempt requests from send to end.
		type edge struct {
			at time.Duration
			d  int
		}
		by := map[int][]edge{}
		queued := 0
		for _, r := range res.requests {
			if r.queued {
				queued++
			}
			if r.attempts == 1 && r.status == statusOK {
				by[r.cell] = append(by[r.cell], edge{r.sentAt, 1}, edge{r.end, -1})
			}
		}
		most := 0
		for _, es := range by {
			slices.SortFunc(es, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.d, b.d)) })
			n := 0
			for _, e := range es {
				n += e.d
				most = max(most, n)
			}
		}
		return most, queued
	}
	if most, queued := peak(true); most > cfg.Profile.MaxNumSeqs || queued == 0 {
		t.Errorf("per-endpoint cap: %d in flight on one cell (batch %d), %d queued", most, cfg.Profile.MaxNumSeqs, queued)
	}
	if most, _ := peak(false); most <= cfg.Profile.MaxNumSeqs {
		t.Errorf("configured cap alone: only %d in flight on one cell, the burst should pile up", most)
	}
}
