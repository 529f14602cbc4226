package capacity

import (
	"errors"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func f(v float64) *float64 { return &v }

func mustNew(t *testing.T, cfg Config) *Estimator {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// feed sends n heartbeats of s to cell id, every step from start, and
// returns the time of the last.
func feed(e *Estimator, id string, start time.Time, step time.Duration, n int, s Sample) time.Time {
	at := start
	for i := range n {
		at = start.Add(time.Duration(i) * step)
		e.Observe(id, at, s)
	}
	return at
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Max(1, math.Abs(want)) }

func TestColdStartKeepsPrior(t *testing.T) {
	cases := map[string][]Sample{
		"never seen": nil,
		"no traffic": {{RequestRate: f(0), Running: f(0), Waiting: f(0), KVUsage: f(0), TTFTP95: nil}},
		"missing measurements": {
			{RequestRate: f(1)},               // a rate but neither TTFT nor KV
			{RequestRate: nil, Running: f(3)}, // no rate at all
			{},
		},
	}
	for name, samples := range cases {
		t.Run(name, func(t *testing.T) {
			e := mustNew(t, Config{PriorRPS: 2})
			at := t0
			for i := range 200 {
				for _, s := range samples {
					at = t0.Add(time.Duration(i) * time.Second)
					if !e.Observe("c", at, s) {
						t.Fatalf("sample %+v rejected", s)
					}
				}
			}
			got := e.Estimate("c", at, 1)
			if got.RPS != 2 || got.Confidence != 0 || got.MeasuredRPS != 0 {
				t.Fatalf("estimate = %+v, want the prior 2 with confidence 0", got)
			}
			if e.Rejected() != 0 {
				t.Fatalf("rejected %d, want 0", e.Rejected())
			}
		})
	}
}

// At the SLO point (TTFT P95 = SLO) the measurement is the throughput
// itself, and the cell runs at its limit, so the estimate converges there
// with full utilisation.
func TestConvergesAtTheSLOPoint(t *testing.T) {
	e := mustNew(t, Config{PriorRPS: 1, TTFTSLO: 2 * time.Second})
	// Low-load first, to learn T0 = 0.5 s.
	at := feed(e, "c", t0, time.Second, 20, Sample{RequestRate: f(0.2), TTFTP95: f(0.5)})
	// Then a long run at the SLO point: 3 rps with TTFT P95 = 2 s.
	at = feed(e, "c", at.Add(time.Second), time.Second, 600, Sample{RequestRate: f(3), TTFTP95: f(2), Running: f(10), KVUsage: f(0.3)})
	got := e.Estimate("c", at, 1)
	if !near(got.MeasuredRPS, 3, 0.01) {
		t.Errorf("measured = %v, want 3 (the throughput at the SLO)", got.MeasuredRPS)
	}
	if got.Confidence < 0.95 {
		t.Errorf("confidence = %v, want ≥ 0.95 after 1,800 requests at the SLO", got.Confidence)
	}
	if !near(got.RPS, 3, 0.05) {
		t.Errorf("capacity = %v, want ≈ 3 (the prior 1 replaced)", got.RPS)
	}
}

// The TTFT term: ρ = 1 − T0/T, ρ* = 1 − T0/SLO, m = λ·ρ*/ρ; u = ρ/ρ*.
func TestTTFTExtrapolation(t *testing.T) {
	cases := []struct {
		name         string
		lambda, ttft float64
		wantM, wantU float64
	}{
		// T0 = 0.5, SLO = 2: ρ* = 0.75.
		{"half way", 1, 1.0, 1 * 0.75 / 0.5, 0.5 / 0.75},
		{"beyond the SLO", 2, 4, 2 * 0.75 / 0.875, 1},
		{"at T0: extrapolation bounded by MinUtilisation", 1, 0.5, 1 * 0.75 / DefaultMinUtilisation, DefaultMinUtilisation / 0.75},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A very slow baseline keeps T0 at the first TTFT.
			e := mustNew(t, Config{PriorRPS: 1, TTFTSLO: 2 * time.Second, BaselineTau: 1e6 * time.Hour})
			e.Observe("c", t0, Sample{RequestRate: f(0.1), TTFTP95: f(0.5)}) // learns T0
			st := e.cells["c"]
			st.lambda, st.ttft = 0, 0 // restart the smoothing: the next sample is taken as is
			e.Observe("c", t0.Add(time.Second), Sample{RequestRate: f(tc.lambda), TTFTP95: f(tc.ttft)})
			if !near(st.measured, tc.wantM, 1e-3) || !near(st.util, tc.wantU, 1e-3) {
				t.Fatalf("m = %v, u = %v; want %v, %v", st.measured, st.util, tc.wantM, tc.wantU)
			}
		})
	}
}

// Little's law on the KV cache: capKV = λ·KVTarget/K, and KV use near the
// target makes the utilisation high even when TTFT is not inflated.
func TestKVBound(t *testing.T) {
	e := mustNew(t, Config{PriorRPS: 1})
	at := feed(e, "c", t0, time.Second, 600, Sample{RequestRate: f(2), Running: f(40), KVUsage: f(0.6), TTFTP95: f(0.3)})
	got := e.Estimate("c", at, 1)
	if want := 2 * DefaultKVTarget / 0.6; !near(got.MeasuredRPS, want, 0.01) {
		t.Errorf("measured = %v, want the KV bound %v", got.MeasuredRPS, want)
	}
	if want := 0.6 / DefaultKVTarget; !near(e.cells["c"].util, want, 0.01) {
		t.Errorf("utilisation = %v, want K/KVTarget = %v", e.cells["c"].util, want)
	}
}

// Confidence grows with evidence and utilisation; the blend moves from the
// prior toward the measurement.
func TestConfidenceGrows(t *testing.T) {
	e := mustNew(t, Config{PriorRPS: 1, TTFTSLO: 2 * time.Second})
	at := feed(e, "c", t0, time.Second, 5, Sample{RequestRate: f(0.1), TTFTP95: f(0.5)})
	prev := e.Estimate("c", at, 1)
	for i := range 5 {
		at = feed(e, "c", at.Add(time.Second), time.Second, 30, Sample{RequestRate: f(2), TTFTP95: f(1.5)})
		got := e.Estimate("c", at, 1)
		if got.Confidence <= prev.Confidence {
			t.Fatalf("step %d: confidence %v did not grow from %v", i, got.Confidence, prev.Confidence)
		}
		if got.RPS < math.Min(1, got.MeasuredRPS)-1e-9 || got.RPS > math.Max(1, got.MeasuredRPS)+1e-9 {
			t.Fatalf("step %d: capacity %v outside [prior, measured %v]", i, got.RPS, got.MeasuredRPS)
		}
		prev = got
	}
	if prev.Confidence > 1 || prev.Confidence < 0.5 {
		t.Fatalf("confidence after 300 requests near the SLO = %v, want in [0.5, 1]", prev.Confidence)
	}
}

// A cell that stops showing traffic keeps its estimate (idle heartbeats
// change nothing) but its confidence decays back toward the prior.
func TestIdleCellDecaysToPrior(t *testing.T) {
	e := mustNew(t, Config{PriorRPS: 1, TTFTSLO: 2 * time.Second, StaleAfter: time.Minute})
	at := feed(e, "c", t0, time.Second, 20, Sample{RequestRate: f(0.1), TTFTP95: f(0.5)})
	at = feed(e, "c", at.Add(time.Second), time.Second, 300, Sample{RequestRate: f(3), TTFTP95: f(2)})
	busy := e.Estimate("c", at, 1)
	at = feed(e, "c", at.Add(time.Second), time.Second, 600, Sample{RequestRate: f(0), TTFTP95: nil, Running: f(0)})
	idle := e.Estimate("c", at, 1)
	if idle.MeasuredRPS != busy.MeasuredRPS {
		t.Errorf("idle heartbeats moved the measurement: %v → %v", busy.MeasuredRPS, idle.MeasuredRPS)
	}
	if idle.Confidence > busy.Confidence*math.Exp(-9) {
		t.Errorf("confidence after 10 idle minutes = %v, want decayed from %v", idle.Confidence, busy.Confidence)
	}
	if !near(idle.RPS, 1, 0.01) {
		t.Errorf("capacity after 10 idle minutes = %v, want back at the prior 1", idle.RPS)
	}
}

func TestBadInputIgnoredAndCounted(t *testing.T) {
	bad := map[string]Sample{
		"NaN rate":          {RequestRate: f(math.NaN()), TTFTP95: f(1)},
		"Inf TTFT":          {RequestRate: f(1), TTFTP95: f(math.Inf(1))},
		"negative running":  {RequestRate: f(1), Running: f(-1), TTFTP95: f(1)},
		"negative waiting":  {RequestRate: f(1), Waiting: f(-2), TTFTP95: f(1)},
		"KV above 1":        {RequestRate: f(1), KVUsage: f(1.5)},
		"absurd rate":       {RequestRate: f(1e9), TTFTP95: f(1)},
		"absurd running":    {RequestRate: f(1), Running: f(1e7), TTFTP95: f(1)},
		"TTFT over a day":   {RequestRate: f(1), TTFTP95: f(1e6)},
		"negative KV":       {RequestRate: f(1), KVUsage: f(-0.1)},
		"negative rate":     {RequestRate: f(-3), TTFTP95: f(1)},
		"NaN KV":            {RequestRate: f(1), KVUsage: f(math.NaN())},
		"negative infinity": {RequestRate: f(1), TTFTP95: f(math.Inf(-1))},
	}
	e := mustNew(t, Config{PriorRPS: 1.5})
	good := Sample{RequestRate: f(1), TTFTP95: f(0.6), KVUsage: f(0.2)}
	at := feed(e, "c", t0, time.Second, 100, good)
	before := e.Estimate("c", at, 1)
	n := 0
	for name, s := range bad {
		at = at.Add(time.Second)
		if e.Observe("c", at, s) {
			t.Errorf("%s: accepted", name)
		}
		n++
		if got := e.Rejected(); got != uint64(n) {
			t.Errorf("%s: rejected = %d, want %d", name, got, n)
		}
	}
	if e.Observe("c", at.Add(-time.Minute), good) {
		t.Error("out-of-order sample accepted")
	}
	if got := e.Estimate("c", at, 1); got.MeasuredRPS != before.MeasuredRPS || got.RPS <= 0 || math.IsNaN(got.RPS) {
		t.Errorf("bad input changed the estimate: %+v → %+v", before, got)
	}
	if got := e.Rejected(); got != uint64(len(bad)+1) {
		t.Errorf("rejected = %d, want %d", got, len(bad)+1)
	}
}

// A cell that shows a terrible measurement (very high TTFT at little
// traffic) is floored, never planned at zero.
func TestNeverZero(t *testing.T) {
	e := mustNew(t, Config{PriorRPS: 2})
	at := feed(e, "c", t0, time.Second, 5, Sample{RequestRate: f(0.01), TTFTP95: f(0.2)})
	at = feed(e, "c", at.Add(time.Second), time.Second, 3000, Sample{RequestRate: f(0.001), TTFTP95: f(60), KVUsage: f(1)})
	got := e.Estimate("c", at, 1)
	if got.RPS < DefaultMinFraction*2-1e-9 {
		t.Fatalf("capacity = %v, want at least MinFraction·prior = %v", got.RPS, DefaultMinFraction*2)
	}
	if d := e.Estimate("c", at, math.NaN()); d.RPS != got.RPS {
		t.Errorf("NaN derate: %v, want it ignored (%v)", d.RPS, got.RPS)
	}
	if d := e.Estimate("c", at, 0.5); !near(d.RPS, got.RPS/2, 1e-9) {
		t.Errorf("derate 0.5: %v, want %v", d.RPS, got.RPS/2)
	}
}

func TestForget(t *testing.T) {
	e := mustNew(t, Config{PriorRPS: 1})
	at := feed(e, "c", t0, time.Second, 100, Sample{RequestRate: f(2), TTFTP95: f(1.4)})
	if e.Estimate("c", at, 1).Confidence == 0 {
		t.Fatal("no confidence after 100 heartbeats with traffic")
	}
	e.Forget("c")
	if got := e.Estimate("c", at, 1); got.RPS != 1 || got.Confidence != 0 {
		t.Fatalf("after Forget: %+v, want the prior", got)
	}
	if len(e.Cells()) != 0 {
		t.Fatalf("cells = %v after Forget", e.Cells())
	}
}

func TestConfigValidate(t *testing.T) {
	bad := map[string]Config{
		"negative prior":    {PriorRPS: -1},
		"NaN prior":         {PriorRPS: math.NaN()},
		"absurd prior":      {PriorRPS: 1e12},
		"negative SLO":      {TTFTSLO: -time.Second},
		"KV target above 1": {KVTarget: 1.5},
		"negative tau":      {Tau: -time.Second},
		"utilisation 1":     {MinUtilisation: 1},
		"NaN evidence":      {EvidenceRequests: math.NaN()},
	}
	for name, c := range bad {
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: New = %v, want ErrConfig", name, err)
		}
	}
	if _, err := New(Config{}); err != nil {
		t.Errorf("zero config: %v", err)
	}
}

// Noisy windows do not bias the measurement: the inputs are smoothed
// before the (convex) TTFT inversion, so TTFT P95 alternating 0.6/1.4 s
// measures like a steady 1.0 s.
func TestNoiseDoesNotBiasUp(t *testing.T) {
	measure := func(ttft func(i int) float64) float64 {
		e := mustNew(t, Config{PriorRPS: 1, TTFTSLO: 2 * time.Second})
		e.Observe("c", t0, Sample{RequestRate: f(0.1), TTFTP95: f(0.5)})
		at := t0
		for i := range 600 {
			at = t0.Add(time.Duration(i+1) * time.Second)
			e.Observe("c", at, Sample{RequestRate: f(1), TTFTP95: f(ttft(i))})
		}
		return e.Estimate("c", at, 1).MeasuredRPS
	}
	steady := measure(func(int) float64 { return 1 })
	noisy := measure(func(i int) float64 { return []float64{0.6, 1.4}[i%2] })
	if !near(noisy, steady, 0.1) {
		t.Fatalf("noisy windows measure %v, steady %v: want within 10 %%", noisy, steady)
	}
}
