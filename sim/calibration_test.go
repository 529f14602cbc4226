package sim

import (
	"math"
	"testing"
	"time"
)

// The default profile's calibration targets (see Profile70B): the published
// round-robin run at 10 RPS over 9 engines, prompts 512±200, 128 tokens out.
const (
	calibRPS        = 10.0 / 9
	calibTTFTP50    = 300 * time.Millisecond
	calibITL        = 40 * time.Millisecond
	calibE2EP95     = 5800 * time.Millisecond
	calibTolerance  = 0.25
	kneeSLO         = 1500 * time.Millisecond
	kneeLow, kneeHi = 1.3, 1.5
)

func baselineLoad(rps float64, seed int64) LoadSpec {
	return LoadSpec{
		RPS:          rps,
		Duration:     2 * time.Hour,
		Warmup:       5 * time.Minute,
		Prompt:       TokenDist{Mean: 512, StdDev: 200},
		OutputTokens: 128,
		Seed:         seed,
	}
}

func within(got, want time.Duration, tol float64) bool {
	return math.Abs(float64(got)/float64(want)-1) <= tol
}

func TestCalibration70BAtPaperLoad(t *testing.T) {
	t.Parallel()
	for _, seed := range []int64{1, 2} {
		st, err := SimulateLoad(Profile70B(), baselineLoad(calibRPS, seed))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seed %d at %.2f RPS: %v", seed, calibRPS, st)
		if st.Requests < 7000 {
			t.Fatalf("only %d requests measured", st.Requests)
		}
		for _, c := range []struct {
			name      string
			got, want time.Duration
		}{
			{"TTFT P50", st.TTFTP50, calibTTFTP50},
			{"inter-token latency", st.ITLMean, calibITL},
			{"E2E P95", st.E2EP95, calibE2EP95},
		} {
			if !within(c.got, c.want, calibTolerance) {
				t.Errorf("seed %d: %s = %v, want %v ±%.0f%%", seed, c.name, c.got, c.want, calibTolerance*100)
			}
		}
	}
}

func TestCalibration70BSaturationKnee(t *testing.T) {
	t.Parallel()
	// P95 TTFT must stay under the 1.5 s SLO at 1.3 RPS per engine and be
	// over it at 1.5, i.e. cross it between the two.
	for _, seed := range []int64{1, 2} {
		below, err := SimulateLoad(Profile70B(), baselineLoad(kneeLow, seed))
		if err != nil {
			t.Fatal(err)
		}
		above, err := SimulateLoad(Profile70B(), baselineLoad(kneeHi, seed))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seed %d: %.2f RPS: %v", seed, kneeLow, below)
		t.Logf("seed %d: %.2f RPS: %v", seed, kneeHi, above)
		if below.TTFTP95 >= kneeSLO {
			t.Errorf("seed %d: P95 TTFT at %.2f RPS = %v, want < %v", seed, kneeLow, below.TTFTP95, kneeSLO)
		}
		if above.TTFTP95 < kneeSLO {
			t.Errorf("seed %d: P95 TTFT at %.2f RPS = %v, want >= %v", seed, kneeHi, above.TTFTP95, kneeSLO)
		}
	}
}

func TestSimulateLoadMonotoneInLoad(t *testing.T) {
	t.Parallel()
	var prev LoadStats
	for i, rps := range []float64{0.3, 0.8, 1.2, 1.6} {
		st, err := SimulateLoad(Profile70B(), LoadSpec{RPS: rps, Duration: 30 * time.Minute,
			Prompt: TokenDist{Mean: 512, StdDev: 200}, OutputTokens: 128, Seed: 9})
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && (st.TTFTP95 < prev.TTFTP95 || st.ITLMean < prev.ITLMean || st.MeanRunning < prev.MeanRunning) {
			t.Fatalf("at %.1f RPS %v\nnot worse than at lower load %v", rps, st, prev)
		}
		prev = st
	}
}

func TestSimulateLoadDeterministic(t *testing.T) {
	t.Parallel()
	spec := baselineLoad(1.2, 5)
	spec.Duration = 20 * time.Minute
	a, err := SimulateLoad(Profile70B(), spec)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := SimulateLoad(Profile70B(), spec)
	if a != b {
		t.Fatalf("same seed, different results:\n%v\n%v", a, b)
	}
	spec.Seed = 6
	c, _ := SimulateLoad(Profile70B(), spec)
	if a == c {
		t.Fatal("different seeds gave identical results")
	}
}

// TestCalibration70BWorkloadClasses checks that the frozen profile also
// reproduces the published round-robin sustainable rates (P95 TTFT within
// the class SLO, 9 engines) of the long-prompt classes, within ±25 %.
func TestCalibration70BWorkloadClasses(t *testing.T) {
	if testing.Short() {
		t.Skip("bisection over load levels")
	}
	t.Parallel()
	for _, c := range []struct {
		name     string
		prompt   TokenDist
		out      int
		slo      time.Duration
		paperRPS float64
	}{
		{"code_heavy", TokenDist{Mean: 1024, StdDev: 512}, 192, 3 * time.Second, 10},
		{"rag_multidoc", TokenDist{Mean: 4000, StdDev: 800}, 128, 3 * time.Second, 13},
		{"long_context", TokenDist{Mean: 8000, StdDev: 1500}, 128, 3 * time.Second, 7},
		{"very_long", TokenDist{Mean: 16000, StdDev: 3000}, 128, 7 * time.Second, 4},
	} {
		// Bisect within ±40 % of the published rate: a result outside ±25 %
		// fails, one outside ±40 % converges to a bound and fails too.
		lo, hi := 0.6*c.paperRPS/9, 1.4*c.paperRPS/9
		for range 7 {
			mid := (lo + hi) / 2
			st, err := SimulateLoad(Profile70B(), LoadSpec{RPS: mid, Duration: time.Hour, Warmup: 5 * time.Minute,
				Prompt: c.prompt, OutputTokens: c.out, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			if st.TTFTP95 <= c.slo {
				lo = mid
			} else {
				hi = mid
			}
		}
		got := 9 * lo
		t.Logf("%s: sustainable %.1f RPS over 9 engines at P95 TTFT <= %v (published %.0f)", c.name, got, c.slo, c.paperRPS)
		if math.Abs(got/c.paperRPS-1) > calibTolerance {
			t.Errorf("%s: sustainable %.1f RPS, want %.0f ±25%%", c.name, got, c.paperRPS)
		}
	}
}
