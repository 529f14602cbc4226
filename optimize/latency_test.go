package optimize

import (
	"math"
	"testing"
)

func testServer(k float64) server {
	p := Problem{Headroom: 0.9, Beta: 0.1, K: k}
	return newServer(Region{Name: "x", CapacityRPS: 100, EngineLatencyMs: 300}, p)
}

// refLatency is the documented model, written out: L(u) = L0·(1 + β·u^k/(1−u)).
func refLatency(l0, beta, k, u float64) float64 {
	return l0 * (1 + beta*math.Pow(u, k)/(1-u))
}

func TestLatencyModel(t *testing.T) {
	for _, k := range []float64{1, 2, 4, 4.5, 17} {
		s := testServer(k)
		for _, u := range []float64{0, 0.1, 0.5, 0.8, 0.95, 0.999} {
			y := u * s.capEff
			if got, want := s.latency(y), refLatency(300, 0.1, k, u); math.Abs(got-want) > 1e-9*want {
				t.Errorf("k=%v u=%v: latency %v, want %v", k, u, got, want)
			}
			if got, want := s.total(y), y*refLatency(300, 0.1, k, u); math.Abs(got-want) > 1e-9*math.Max(want, 1) {
				t.Errorf("k=%v u=%v: total %v, want %v", k, u, got, want)
			}
		}
		if !math.IsInf(s.latency(s.capEff), 1) || !math.IsInf(s.latency(2*s.capEff), 1) {
			t.Errorf("k=%v: latency at or above capacity·headroom must be +Inf", k)
		}
	}
	// Flat at low load, a knee near capacity: at k = 4, half load adds
	// under 4 % and 95 % load more than doubles the latency.
	s := testServer(4)
	if r := s.latency(0.5*s.capEff) / s.latency(0); r > 1.04 {
		t.Errorf("latency at u=0.5 is %.3f× the idle latency, want < 1.04×", r)
	}
	if r := s.latency(0.95*s.capEff) / s.latency(0); r < 2 {
		t.Errorf("latency at u=0.95 is %.3f× the idle latency, want > 2×", r)
	}
}

// TestDerivatives checks G' and G” against central differences of G.
func TestDerivatives(t *testing.T) {
	for _, k := range []float64{1, 2, 4, 4.5} {
		s := testServer(k)
		for _, u := range []float64{0.05, 0.3, 0.7, 0.9, 0.97} {
			y := u * s.capEff
			hstep := 1e-4 * s.capEff * (1 - u)
			g, h := s.gh(y)
			numG := (s.total(y+hstep) - s.total(y-hstep)) / (2 * hstep)
			numH := (s.total(y+hstep) - 2*s.total(y) + s.total(y-hstep)) / (hstep * hstep)
			if math.Abs(g-numG) > 1e-5*g {
				t.Errorf("k=%v u=%v: G' = %v, numeric %v", k, u, g, numG)
			}
			if math.Abs(h-numH) > 1e-3*h {
				t.Errorf("k=%v u=%v: G'' = %v, numeric %v", k, u, h, numH)
			}
			if m := s.marginal(y); math.Abs(m-g) > 1e-12*g {
				t.Errorf("k=%v u=%v: marginal %v != gh %v", k, u, m, g)
			}
		}
	}
}

func TestLoadAt(t *testing.T) {
	s := testServer(4)
	if y, _ := s.loadAt(299, 10); y != 0 {
		t.Errorf("loadAt below L0 = %v, want 0", y)
	}
	for _, u := range []float64{1e-3, 0.2, 0.6, 0.9, 0.99, 0.99999} {
		want := u * s.capEff
		v := s.marginal(want)
		for _, guess := range []float64{0, want / 3, want, s.capEff} {
			y, h := s.loadAt(v, guess)
			// At tiny loads G' is flat to 1e-13, so the load itself is
			// ill-conditioned there; the marginal it gives is not.
			if g := s.marginal(y); math.Abs(g-v) > 1e-12*v {
				t.Errorf("u=%v guess=%v: marginal at loadAt = %v, want %v", u, guess, g, v)
			}
			if u >= 0.2 && math.Abs(y-want) > 1e-9*s.capEff {
				t.Errorf("u=%v guess=%v: loadAt = %v, want %v", u, guess, y, want)
			}
			if _, wantH := s.gh(y); h != wantH {
				t.Errorf("u=%v: curvature %v, want %v", u, h, wantH)
			}
		}
	}
	if y, _ := s.loadAt(math.Inf(1), 1); !(y < s.capEff) {
		t.Errorf("loadAt(+Inf) = %v, want below capacity %v", y, s.capEff)
	}
	// The load where marginal latency reaches the penalty sits just below
	// capacity·headroom.
	yP := s.loadAtMarginal(DefaultShedPenaltyMs)
	if g := s.marginal(yP); math.Abs(g-DefaultShedPenaltyMs) > 1e-6*DefaultShedPenaltyMs {
		t.Errorf("marginal at loadAtMarginal(P) = %v, want %v", g, DefaultShedPenaltyMs)
	}
	if u := yP / s.capEff; u < 0.9 || u >= 1 {
		t.Errorf("loadAtMarginal(P) at u = %v, want just below 1", u)
	}
}

func TestEngineLatency(t *testing.T) {
	p := threeRegions(0.9)
	if got, want := EngineLatency(p, 1, 45), refLatency(300, 0.1, 4, 0.5); math.Abs(got-want) > 1e-9 {
		t.Errorf("EngineLatency(b, 45 rps) = %v, want %v", got, want)
	}
	if got := EngineLatency(p, 1, 90); !math.IsInf(got, 1) {
		t.Errorf("EngineLatency at c·h = %v, want +Inf", got)
	}
	p.Regions[2].Down = true
	if got := EngineLatency(p, 2, 0); !math.IsInf(got, 1) {
		t.Errorf("EngineLatency of a down region = %v, want +Inf", got)
	}
}

// TestThirdDerivative checks ght against gh and G‴ against central
// differences of G″.
func TestThirdDerivative(t *testing.T) {
	for _, k := range []float64{1, 2, 3, 4, 4.5, 7} {
		s := testServer(k)
		for _, u := range []float64{0.05, 0.3, 0.7, 0.9, 0.97} {
			y := u * s.capEff
			hstep := 1e-5 * s.capEff * (1 - u)
			g, h, g3 := s.ght(y)
			wg, wh := s.gh(y)
			if math.Abs(g-wg) > 1e-13*wg || math.Abs(h-wh) > 1e-12*wh {
				t.Errorf("k=%v u=%v: ght (%v, %v), gh (%v, %v)", k, u, g, h, wg, wh)
			}
			_, hp := s.gh(y + hstep)
			_, hm := s.gh(y - hstep)
			if num := (hp - hm) / (2 * hstep); math.Abs(g3-num) > 1e-5*math.Abs(num) {
				t.Errorf("k=%v u=%v: G‴ = %v, numeric %v", k, u, g3, num)
			}
		}
		// At no load, f‴(0) = 6 for k = 1 (the u^(k−1) term) and k = 2
		// (the u^(k−2) term), and 0 for larger k.
		want := 0.0
		if k <= 2 {
			want = s.l0 * s.beta * 6 / (s.capEff * s.capEff)
		}
		if _, _, g3 := s.ght(0); math.Abs(g3-want) > 1e-15 {
			t.Errorf("k=%v: G‴(0) = %v, want %v", k, g3, want)
		}
	}
}
