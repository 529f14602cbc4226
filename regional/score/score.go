// Package score turns one cell's raw signal vector into normalised signal
// scores in [0,1] and a composite pressure in [0,1] (higher = more pressure).
//
// It is pure: no I/O, no logging, no metrics, no clock. InputFrom decides
// which signals are present from a Reading of the cell's sources (a source
// that is down contributes nothing; the data plane's error rate counts when
// it is the higher) and the scorer renormalises over what remains, so
// missing telemetry never drops a cell. The regional controller and
// bench/paper both build their Input with InputFrom. The formula of every
// signal is in README.md.
// Pressure explains, alerts and feeds the regional summary; it does not move
// endpoint weights (regional/projection derives those from slow signals).
//
// Concurrency: a Config is immutable after Validate; Score may be called from
// any goroutine.
package score

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Signal names one scored signal.
type Signal uint8

// The scored signals: four application, four hardware, two network, plus the
// thermal early-warning signal (temperature and clock-throttle reasons).
const (
	Queue Signal = iota
	TTFT
	ErrorRate
	KVCache
	GPUUtil
	VRAM
	SMActive
	DRAMActive
	RTT
	Jitter
	Thermal
	NumSignals
)

var signalNames = [NumSignals]string{
	"queue", "ttft", "error_rate", "kv_cache", "gpu_util", "vram", "sm_active",
	"dram_active", "rtt", "jitter", "thermal",
}

// String returns the snake_case name used in metrics and debug output.
func (s Signal) String() string {
	if s < NumSignals {
		return signalNames[s]
	}
	return fmt.Sprintf("signal(%d)", uint8(s))
}

// Source is where a signal comes from.
type Source uint8

// Signal sources.
const (
	SourceApp      Source = iota // the vLLM engine
	SourceHardware               // dcgm-exporter or NVML
	SourceNetwork                // the controller's own probes
)

// Source reports which telemetry source feeds s.
func (s Signal) Source() Source {
	switch s {
	case Queue, TTFT, ErrorRate, KVCache:
		return SourceApp
	case RTT, Jitter:
		return SourceNetwork
	default:
		return SourceHardware
	}
}

// Value is an optional measurement.
type Value struct {
	V  float64
	OK bool
}

// Some returns a present Value.
func Some(v float64) Value { return Value{V: v, OK: true} }

// Input is the raw signal vector of one cell. Absent values are not scored.
type Input struct {
	QueueDepth      Value // vllm:num_requests_waiting (count)
	Running         Value // vllm:num_requests_running (count)
	TTFTP95         Value // seconds
	ErrorRate       Value // fraction
	KVCache         Value // fraction
	GPUUtil         Value // fraction
	VRAM            Value // fraction
	SMActive        Value // fraction
	DRAMActive      Value // fraction
	TemperatureC    Value // degrees Celsius
	ThrottleReasons uint64
	ThrottleOK      bool          // ThrottleReasons was reported
	RTT             time.Duration // 0 with RTTOK false when unknown
	RTTOK           bool
	Jitter          time.Duration
	JitterOK        bool
}

// Throttle-reason bits (DCGM_CLOCKS_EVENT_REASON_*) that mean the GPU is
// slowing itself down because of heat or a power emergency.
const (
	ThrottleHWSlowdown   uint64 = 0x8
	ThrottleSWThermal    uint64 = 0x20
	ThrottleHWThermal    uint64 = 0x40
	ThrottleHWPowerBrake uint64 = 0x80

	throttleMask = ThrottleHWSlowdown | ThrottleSWThermal | ThrottleHWThermal | ThrottleHWPowerBrake
)

// Config holds the weights and normalisation constants. The zero value is
// not useful; start from DefaultConfig.
type Config struct {
	// Weights per signal; need not sum to 1 (the scorer divides by the sum
	// of the present signals' weights). Defaults in DefaultConfig.
	Weights [NumSignals]float64
	// QueueHalf: effective queue length at which the queue score is 0.5.
	// Default 4.
	QueueHalf float64
	// RunningWeight: how much one running sequence counts toward the
	// effective queue, relative to one waiting request. Default 0.25.
	RunningWeight float64
	// TTFTCeiling: TTFT P95 that scores 1. Default 3 s (twice the tier-2 SLO
	// of 1.5 s).
	TTFTCeiling time.Duration
	// ErrorCeiling: error rate that scores 1. Default 0.10.
	ErrorCeiling float64
	// RTTCeiling and JitterCeiling: network delay that scores 1.
	// Defaults 50 ms and 10 ms.
	RTTCeiling    time.Duration
	JitterCeiling time.Duration
	// ThermalStartC/ThermalMaxC: temperature range mapped linearly onto
	// [0,1]. Defaults 75 °C and 90 °C. Any throttle bit in throttleMask
	// scores 1 whatever the temperature.
	ThermalStartC float64
	ThermalMaxC   float64
}

// DefaultConfig returns the documented defaults (README.md).
func DefaultConfig() Config {
	var w [NumSignals]float64
	w[Queue] = 0.20
	w[TTFT] = 0.15
	w[ErrorRate] = 0.15
	w[KVCache] = 0.10
	w[GPUUtil] = 0.08
	w[VRAM] = 0.02
	w[SMActive] = 0.05
	w[DRAMActive] = 0.05
	w[RTT] = 0.08
	w[Jitter] = 0.05
	w[Thermal] = 0.07
	return Config{
		Weights:       w,
		QueueHalf:     4,
		RunningWeight: 0.25,
		TTFTCeiling:   3 * time.Second,
		ErrorCeiling:  0.10,
		RTTCeiling:    50 * time.Millisecond,
		JitterCeiling: 10 * time.Millisecond,
		ThermalStartC: 75,
		ThermalMaxC:   90,
	}
}

// ErrInvalidConfig is wrapped by every Validate error; test with errors.Is.
var ErrInvalidConfig = errors.New("score: invalid config")

// Validate reports the first invalid field.
func (c Config) Validate() error {
	var sum float64
	for s := Signal(0); s < NumSignals; s++ {
		w := c.Weights[s]
		if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
			return fmt.Errorf("%w: weight of %s is %v; want a finite value >= 0", ErrInvalidConfig, s, w)
		}
		sum += w
	}
	if sum <= 0 {
		return fmt.Errorf("%w: all signal weights are 0; give at least one a positive weight", ErrInvalidConfig)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"QueueHalf must be > 0", c.QueueHalf > 0},
		{"RunningWeight must be >= 0", c.RunningWeight >= 0},
		{"TTFTCeiling must be > 0", c.TTFTCeiling > 0},
		{"ErrorCeiling must be in (0,1]", c.ErrorCeiling > 0 && c.ErrorCeiling <= 1},
		{"RTTCeiling must be > 0", c.RTTCeiling > 0},
		{"JitterCeiling must be > 0", c.JitterCeiling > 0},
		{"ThermalMaxC must be > ThermalStartC", c.ThermalMaxC > c.ThermalStartC},
	}
	for _, ch := range checks {
		if !ch.ok {
			return fmt.Errorf("%w: %s", ErrInvalidConfig, ch.name)
		}
	}
	return nil
}

// Result is the scored cell.
type Result struct {
	// Normalised score per signal in [0,1]; meaningful where Present.
	// Each signal's share of Pressure is Config.Contributions: a result
	// is kept in every cell's published view, so it holds only what the
	// weights cannot give back.
	Normalized [NumSignals]float64
	Present    [NumSignals]bool
	// Pressure is the weighted mean of the present scores, in [0,1]. With
	// no signal present it is NeutralPressure.
	Pressure float64
	// Fallback is set when a whole telemetry source (application or
	// hardware) contributes nothing: scoring ran on what remained.
	Fallback bool
}

// NeutralPressure is used when a cell has no usable signal at all: the
// middle of the range, so such a cell is neither favoured nor starved.
const NeutralPressure = 0.5

// Score normalises in and returns the composite pressure. It never returns
// NaN: non-finite inputs are treated as absent.
func (c Config) Score(in Input) Result {
	var r Result
	set := func(s Signal, v float64, ok bool) {
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		r.Normalized[s] = clamp01(v)
		r.Present[s] = true
	}

	if in.QueueDepth.OK || in.Running.OK {
		q := 0.0
		if in.QueueDepth.OK {
			q += math.Max(0, in.QueueDepth.V)
		}
		if in.Running.OK {
			q += c.RunningWeight * math.Max(0, in.Running.V)
		}
		set(Queue, q/(q+c.QueueHalf), true)
	}
	set(TTFT, in.TTFTP95.V/c.TTFTCeiling.Seconds(), in.TTFTP95.OK)
	set(ErrorRate, in.ErrorRate.V/c.ErrorCeiling, in.ErrorRate.OK)
	set(KVCache, in.KVCache.V, in.KVCache.OK)
	set(GPUUtil, in.GPUUtil.V, in.GPUUtil.OK)
	set(VRAM, in.VRAM.V, in.VRAM.OK)
	set(SMActive, in.SMActive.V, in.SMActive.OK)
	set(DRAMActive, in.DRAMActive.V, in.DRAMActive.OK)
	set(RTT, in.RTT.Seconds()/c.RTTCeiling.Seconds(), in.RTTOK)
	set(Jitter, in.Jitter.Seconds()/c.JitterCeiling.Seconds(), in.JitterOK)
	if in.TemperatureC.OK || in.ThrottleOK {
		t := 0.0
		if in.TemperatureC.OK && !math.IsNaN(in.TemperatureC.V) {
			t = (in.TemperatureC.V - c.ThermalStartC) / (c.ThermalMaxC - c.ThermalStartC)
		}
		if in.ThrottleOK && in.ThrottleReasons&throttleMask != 0 {
			t = 1
		}
		set(Thermal, t, true)
	}

	var wsum, acc float64
	var appSeen, hwSeen bool
	for s := Signal(0); s < NumSignals; s++ {
		if !r.Present[s] {
			continue
		}
		switch s.Source() {
		case SourceApp:
			appSeen = true
		case SourceHardware:
			hwSeen = true
		}
		w := c.Weights[s]
		wsum += w
		acc += w * r.Normalized[s]
	}
	r.Fallback = !appSeen || !hwSeen
	if wsum <= 0 {
		r.Pressure = NeutralPressure
		return r
	}
	r.Pressure = clamp01(acc / wsum)
	return r
}

// Contributions is each signal's share of r.Pressure under c, the
// config r was scored with: weight × normalised score / the sum of the
// present signals' weights. They sum to r.Pressure; all are 0 when no
// present signal has weight (r.Pressure is then NeutralPressure).
func (c Config) Contributions(r Result) (out [NumSignals]float64) {
	var wsum float64
	for s := Signal(0); s < NumSignals; s++ {
		if r.Present[s] {
			wsum += c.Weights[s]
		}
	}
	if wsum <= 0 {
		return out
	}
	for s := Signal(0); s < NumSignals; s++ {
		if r.Present[s] {
			out[s] = c.Weights[s] * r.Normalized[s] / wsum
		}
	}
	return out
}

func clamp01(v float64) float64 {
	switch {
	case math.IsNaN(v), v < 0:
		return 0
	case v > 1:
		return 1
	default:
		return v
	}
}
