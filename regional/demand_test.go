package regional

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// Poisson noise: a 3 rps demand measured over 10 s windows swings by
// about ±0.55 rps per window; the smoothed figure stays much closer.
func TestDemandSmootherPoissonNoise(t *testing.T) {
	const rate, window = 3.0, 10 * time.Second
	d := newDemandSmoother(30*time.Second, window)
	rng := rand.New(rand.NewPCG(1, 2))
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Arrivals per second, windowed like the data plane's.
	var perSec []int
	var rawMax, estMax, estMin float64
	estMin = math.Inf(1)
	for s := range 600 {
		n := 0
		for tt := rng.ExpFloat64() / rate; tt < 1; tt += rng.ExpFloat64() / rate {
			n++
		}
		perSec = append(perSec, n)
		if len(perSec) < 10 {
			continue
		}
		sum := 0
		for _, v := range perSec[len(perSec)-10:] {
			sum += v
		}
		raw := float64(sum) / window.Seconds()
		est := d.update(at.Add(time.Duration(s)*time.Second), map[string]float64{"m": raw})["m"]
		if s < 60 {
			continue // warm-up
		}
		rawMax, estMax, estMin = max(rawMax, raw), max(estMax, est), min(estMin, est)
	}
	t.Logf("raw window max %.2f; smoothed %.2f..%.2f", rawMax, estMin, estMax)
	if estMax-rate > 0.6*(rawMax-rate) {
		t.Errorf("smoothed max %.2f is not much below the raw max %.2f (rate %v)", estMax, rawMax, rate)
	}
	if estMin < 2.2 || estMax > 3.8 {
		t.Errorf("smoothed range %.2f..%.2f strays from %v", estMin, estMax, rate)
	}
}

// A one-window burst moves the estimate by a bounded step; a sustained
// rise is followed once it has held for a window; a fall is followed; a model that disappears decays
// and is dropped; bad samples are ignored.
func TestDemandSmootherBurstsAndSteps(t *testing.T) {
	d := newDemandSmoother(10*time.Second, 10*time.Second)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	step := func(v float64) float64 {
		at = at.Add(time.Second)
		return d.update(at, map[string]float64{"m": v})["m"]
	}
	if got := step(10); got != 10 {
		t.Fatalf("first sample: %v, want it as is", got)
	}
	for range 30 {
		step(10)
	}
	burst := step(1000)
	upper := 10 + 3*math.Sqrt(10.0/10) + 0.5
	if burst > 10+(upper-10)*(1-math.Exp(-0.1))+1e-9 {
		t.Errorf("one burst window moved 10 to %v", burst)
	}
	// A sustained step from 10 to 40 rps is followed once it has held for
	// a window (10 s), within seconds after that.
	var v float64
	for range 9 {
		v = step(40)
	}
	if v > 15 {
		t.Errorf("9 s after a step to 40 rps the estimate is already %v: a rise within one window is not yet real", v)
	}
	for range 11 {
		v = step(40)
	}
	if v < 35 {
		t.Errorf("20 s after a step to 40 rps the estimate is %v", v)
	}
	for range 60 {
		v = step(40)
	}
	if math.Abs(v-40) > 0.5 {
		t.Errorf("after a minute at 40: %v", v)
	}
	for range 60 {
		v = step(5)
	}
	if math.Abs(v-5) > 0.1 {
		t.Errorf("after 1 min at 5: %v", v)
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1), -3} {
		if got := step(bad); math.Abs(got-5) > 0.1 {
			t.Errorf("bad sample %v moved the estimate to %v", bad, got)
		}
	}
	var out map[string]float64
	for range 200 {
		at = at.Add(time.Second)
		out = d.update(at, nil)
	}
	if out != nil {
		t.Errorf("a model gone for 200 s is still reported: %v", out)
	}
	// Off: samples pass through.
	off := newDemandSmoother(-1, 10*time.Second)
	if got := off.update(at, map[string]float64{"m": 7})["m"]; got != 7 {
		t.Errorf("smoothing off: %v", got)
	}
}
