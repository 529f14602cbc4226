package cellagent

import (
	"fmt"
	"math"
	"strings"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Signals is the raw signal vector of a cell (see isobarpb.Signals for units).
// A nil field is absent: its source is down, there was no traffic in the
// window, or the value read was invalid and dropped. Every set value is
// finite; fractions lie in [0,1]; counts, seconds and rates are >= 0.
type Signals struct {
	QueueDepth           *float64 `json:"queue_depth,omitempty"`
	Running              *float64 `json:"running,omitempty"`
	TTFTP95Seconds       *float64 `json:"ttft_p95_seconds,omitempty"`
	ErrorRate            *float64 `json:"error_rate,omitempty"`
	KVCacheUsage         *float64 `json:"kv_cache_usage,omitempty"`
	GPUUtil              *float64 `json:"gpu_util,omitempty"`
	VRAMUsed             *float64 `json:"vram_used,omitempty"`
	SMActive             *float64 `json:"sm_active,omitempty"`
	DRAMActive           *float64 `json:"dram_active,omitempty"`
	TemperatureCelsius   *float64 `json:"temperature_celsius,omitempty"`
	PowerWatts           *float64 `json:"power_watts,omitempty"`
	ClockThrottleReasons *uint64  `json:"clock_throttle_reasons,omitempty"`
	RequestRate          *float64 `json:"request_rate,omitempty"`
	WindowRequests       *float64 `json:"window_requests,omitempty"`
	PrefixCacheHitRate   *float64 `json:"prefix_cache_hit_rate,omitempty"`
}

// Proto returns the signals as the wire message.
func (s Signals) Proto() *isobarpb.Signals {
	return &isobarpb.Signals{
		QueueDepth:           s.QueueDepth,
		Running:              s.Running,
		TtftP95Seconds:       s.TTFTP95Seconds,
		ErrorRate:            s.ErrorRate,
		KvCacheUsage:         s.KVCacheUsage,
		GpuUtil:              s.GPUUtil,
		VramUsed:             s.VRAMUsed,
		SmActive:             s.SMActive,
		DramActive:           s.DRAMActive,
		TemperatureCelsius:   s.TemperatureCelsius,
		PowerWatts:           s.PowerWatts,
		ClockThrottleReasons: s.ClockThrottleReasons,
		RequestRate:          s.RequestRate,
		WindowRequests:       s.WindowRequests,
		PrefixCacheHitRate:   s.PrefixCacheHitRate,
	}
}

// mergeHardware returns s with the hardware fields taken from hw.
func (s Signals) mergeHardware(hw HardwareSample) Signals {
	s.GPUUtil = hw.GPUUtil
	s.VRAMUsed = hw.VRAMUsed
	s.SMActive = hw.SMActive
	s.DRAMActive = hw.DRAMActive
	s.TemperatureCelsius = hw.TemperatureCelsius
	s.PowerWatts = hw.PowerWatts
	s.ClockThrottleReasons = hw.ClockThrottleReasons
	return s
}

// fracTolerance is how far outside [0,1] a fraction may stray (float noise,
// a 101 % utilisation reading) and still be clamped rather than dropped.
const fracTolerance = 0.01

// maxThrottleMask bounds a clock-throttle bitmask: every defined reason bit
// lies far below 2^32, and float64 holds integers exactly up to 2^53.
const maxThrottleMask = 1 << 53

func ptr[T any](v T) *T { return &v }

// invalids collects the values a parser dropped.
type invalids []string

func (iv *invalids) add(name string, v float64, why string) {
	*iv = append(*iv, fmt.Sprintf("%s=%s (%s)", name, fmtFloat(v), why))
}

func (iv *invalids) addf(format string, args ...any) {
	*iv = append(*iv, fmt.Sprintf(format, args...))
}

// String summarises the dropped values for a source's reason.
func (iv invalids) String() string {
	if len(iv) == 0 {
		return ""
	}
	const max = 5
	shown := iv
	if len(shown) > max {
		shown = shown[:max]
	}
	s := "dropped invalid values: " + strings.Join(shown, ", ")
	if len(iv) > max {
		s += fmt.Sprintf(" and %d more", len(iv)-max)
	}
	return s
}

func fmtFloat(v float64) string {
	return fmt.Sprintf("%g", v)
}

// checkCount accepts a finite value >= 0.
func checkCount(v float64) (float64, string) {
	switch {
	case math.IsNaN(v):
		return 0, "NaN"
	case math.IsInf(v, 0):
		return 0, "infinite"
	case v < 0:
		return 0, "negative"
	}
	return v, ""
}

// checkFraction accepts a value in [0,1], clamping values within
// fracTolerance of it.
func checkFraction(v float64) (float64, string) {
	switch {
	case math.IsNaN(v):
		return 0, "NaN"
	case math.IsInf(v, 0):
		return 0, "infinite"
	case v < -fracTolerance || v > 1+fracTolerance:
		return 0, "outside [0,1]"
	}
	return min(max(v, 0), 1), ""
}

// checkRange accepts a finite value in [lo, hi].
func checkRange(v, lo, hi float64) (float64, string) {
	switch {
	case math.IsNaN(v):
		return 0, "NaN"
	case math.IsInf(v, 0):
		return 0, "infinite"
	case v < lo || v > hi:
		return 0, fmt.Sprintf("outside [%g,%g]", lo, hi)
	}
	return v, ""
}

// checkMask accepts a non-negative integral value that fits a bitmask.
func checkMask(v float64) (uint64, string) {
	switch {
	case math.IsNaN(v):
		return 0, "NaN"
	case math.IsInf(v, 0):
		return 0, "infinite"
	case v < 0:
		return 0, "negative"
	case v != math.Trunc(v):
		return 0, "not an integer"
	case v >= maxThrottleMask:
		return 0, "too large for a bitmask"
	}
	return uint64(v), ""
}
