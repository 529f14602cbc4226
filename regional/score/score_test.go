package score

import (
	"errors"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestScoreTable(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	full := Input{
		QueueDepth: Some(4), Running: Some(0), TTFTP95: Some(1.5), ErrorRate: Some(0.05),
		KVCache: Some(0.5), GPUUtil: Some(0.5), VRAM: Some(0.5), SMActive: Some(0.5), DRAMActive: Some(0.5),
		TemperatureC: Some(82.5), ThrottleOK: true,
		RTT: 25 * time.Millisecond, RTTOK: true, Jitter: 5 * time.Millisecond, JitterOK: true,
	}
	tests := []struct {
		name         string
		in           Input
		wantPressure float64
		wantFallback bool
		wantPresent  int
	}{
		{name: "every signal at one half", in: full, wantPressure: 0.5, wantPresent: int(NumSignals)},
		{name: "nothing present is neutral", in: Input{}, wantPressure: NeutralPressure, wantFallback: true},
		{
			name:         "idle cell",
			in:           Input{QueueDepth: Some(0), Running: Some(0), KVCache: Some(0), GPUUtil: Some(0), ThrottleOK: true},
			wantPressure: 0, wantPresent: 4,
		},
		{
			name: "throttle bit saturates thermal",
			in:   Input{TemperatureC: Some(40), ThrottleReasons: ThrottleHWThermal, ThrottleOK: true, QueueDepth: Some(0)},
			// thermal 1 (w .07), queue 0 (w .20)
			wantPressure: 0.07 / 0.27, wantPresent: 2,
		},
		{
			name: "hardware missing renormalises over the application signals",
			in:   Input{QueueDepth: Some(4), KVCache: Some(0.5), TTFTP95: Some(1.5), ErrorRate: Some(0.05)},
			// every present score is 0.5 → pressure 0.5 whatever the weights.
			wantPressure: 0.5, wantFallback: true, wantPresent: 4,
		},
		{
			name:         "NaN and Inf are absent, not poison",
			in:           Input{QueueDepth: Some(math.NaN()), KVCache: Some(math.Inf(1)), GPUUtil: Some(1)},
			wantPressure: 1, wantFallback: true, wantPresent: 1,
		},
		{
			name:         "out of range values are clamped",
			in:           Input{KVCache: Some(7), GPUUtil: Some(-3)},
			wantPressure: (0.10*1 + 0.08*0) / 0.18, wantPresent: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := cfg.Score(tc.in)
			if math.Abs(r.Pressure-tc.wantPressure) > 1e-9 {
				t.Errorf("pressure = %v, want %v", r.Pressure, tc.wantPressure)
			}
			if r.Fallback != tc.wantFallback {
				t.Errorf("fallback = %v, want %v", r.Fallback, tc.wantFallback)
			}
			n := 0
			var sum float64
			contrib := cfg.Contributions(r)
			for s := Signal(0); s < NumSignals; s++ {
				if r.Present[s] {
					n++
					sum += contrib[s]
				} else if contrib[s] != 0 {
					t.Errorf("absent %s contributes %v", s, contrib[s])
				}
			}
			if n != tc.wantPresent {
				t.Errorf("present signals = %d, want %d", n, tc.wantPresent)
			}
			if n > 0 && math.Abs(sum-r.Pressure) > 1e-9 {
				t.Errorf("contributions sum to %v, pressure is %v", sum, r.Pressure)
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	bad := map[string]func(*Config){
		"negative weight": func(c *Config) { c.Weights[Queue] = -1 },
		"NaN weight":      func(c *Config) { c.Weights[TTFT] = math.NaN() },
		"all zero":        func(c *Config) { c.Weights = [NumSignals]float64{} },
		"queue half":      func(c *Config) { c.QueueHalf = 0 },
		"error ceiling":   func(c *Config) { c.ErrorCeiling = 2 },
		"thermal range":   func(c *Config) { c.ThermalMaxC = c.ThermalStartC },
	}
	for name, mut := range bad {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			mut(&c)
			if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func genValue(t *rapid.T, name string) Value {
	if !rapid.Bool().Draw(t, name+"_ok") {
		return Value{}
	}
	return Some(rapid.OneOf(
		rapid.Float64Range(-10, 10),
		rapid.SampledFrom([]float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, 1}),
	).Draw(t, name))
}

func genInput(t *rapid.T) Input {
	return Input{
		QueueDepth: genValue(t, "queue"), Running: genValue(t, "running"), TTFTP95: genValue(t, "ttft"),
		ErrorRate: genValue(t, "err"), KVCache: genValue(t, "kv"), GPUUtil: genValue(t, "gpu"),
		VRAM: genValue(t, "vram"), SMActive: genValue(t, "sm"), DRAMActive: genValue(t, "dram"),
		TemperatureC:    genValue(t, "temp"),
		ThrottleReasons: rapid.Uint64().Draw(t, "throttle"), ThrottleOK: rapid.Bool().Draw(t, "throttle_ok"),
		RTT: time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "rtt")), RTTOK: rapid.Bool().Draw(t, "rtt_ok"),
	}
}

// Pressure is always a finite value in [0,1], whatever the input.
func TestPressureInRange(t *testing.T) {
	cfg := DefaultConfig()
	rapid.Check(t, func(t *rapid.T) {
		r := cfg.Score(genInput(t))
		if math.IsNaN(r.Pressure) || r.Pressure < 0 || r.Pressure > 1 {
			t.Fatalf("pressure %v out of [0,1]", r.Pressure)
		}
	})
}

// Raising one present signal never lowers pressure.
func TestPressureMonotone(t *testing.T) {
	cfg := DefaultConfig()
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t)
		in.KVCache = Some(rapid.Float64Range(0, 1).Draw(t, "kv0"))
		lo := cfg.Score(in).Pressure
		in.KVCache.V += rapid.Float64Range(0, 1).Draw(t, "dkv")
		hi := cfg.Score(in).Pressure
		if hi < lo-1e-12 {
			t.Fatalf("pressure fell from %v to %v when kv rose", lo, hi)
		}
	})
}

func BenchmarkScore(b *testing.B) {
	cfg := DefaultConfig()
	in := Input{QueueDepth: Some(3), Running: Some(8), TTFTP95: Some(0.4), ErrorRate: Some(0.01), KVCache: Some(0.3),
		GPUUtil: Some(0.8), VRAM: Some(0.9), SMActive: Some(0.6), DRAMActive: Some(0.4), TemperatureC: Some(70), ThrottleOK: true,
		RTT: time.Millisecond, RTTOK: true, Jitter: 100 * time.Microsecond, JitterOK: true}
	for b.Loop() {
		_ = cfg.Score(in)
	}
}

func TestRTTEstimate(t *testing.T) {
	var e RTTEstimate
	e.Add(10 * time.Millisecond)
	if e.RTT != 10*time.Millisecond || e.Jitter != 0 || e.N != 1 {
		t.Fatalf("first sample: %+v", e)
	}
	e.Add(30 * time.Millisecond)
	if e.RTT != 15*time.Millisecond || e.Jitter != 5*time.Millisecond {
		t.Fatalf("second sample: rtt %v jitter %v, want 15ms 5ms", e.RTT, e.Jitter)
	}
}
