package summary

import "time"

// The bounds below are the one contract between what a regional controller
// accepts from its cells and gateways and what it may publish: heartbeat
// signals (regional/validate.go), data-plane reports (regional/dataplane.go)
// and the summary itself (Aggregate, Validate) all use these constants, so
// a value the controller accepted can never make its region's summary fail
// Validate at the global controller or a gossip peer.
//
// Per-cell inputs are bounded where they arrive: the regional controller
// clamps a heartbeat signal above its bound to the bound (counted per field
// in isobar_regional_signals_clamped_total) and refuses a report whose
// counts imply more than MaxRateRPS. Sums over many cells or data planes
// can still exceed a bound; Aggregate saturates every aggregate at its
// bound, so the summary stays valid and says "at least this much".
const (
	// MaxRateRPS bounds every request rate: a cell's request_rate, its
	// estimated capacity, a model's load, capacity and demand in a summary
	// (requests/s). Far above any real region; beyond it is corruption or
	// an attack.
	MaxRateRPS = 1e9
	// MaxTTFTSeconds bounds a TTFT (P95 or learned at low load): a day.
	MaxTTFTSeconds = 86_400
	// MaxEngineLatencyMs is MaxTTFTSeconds in milliseconds, the bound of a
	// summary's engine_latency_ms.
	MaxEngineLatencyMs = MaxTTFTSeconds * 1000
	// MaxCells bounds a summary's cell counts (per model and context
	// class).
	MaxCells = 1 << 24
	// MaxRTTMs bounds an RTT to a peer region (milliseconds).
	MaxRTTMs = 60_000
	// MaxSignal bounds the heartbeat signals that are levels or counts and
	// not published as such (queue_depth, running, power_watts,
	// window_requests): 1e12.
	MaxSignal = 1e12
	// MaxFutureSkew is how far a summary's time may be ahead of the
	// receiver's clock. Regions' clocks are NTP-synchronised to well under
	// a second; 30 s leaves room for a badly kept clock while refusing a
	// summary dated ahead to win over its region's real ones (Newer
	// compares times across incarnations).
	MaxFutureSkew = 30 * time.Second
)

// saturate clamps a rate or level to [0, hi]; NaN and negative values
// become 0.
func saturate(v, hi float64) float64 {
	switch {
	case !isFinite(v) && v > 0:
		return hi
	case !isFinite(v) || v < 0:
		return 0
	case v > hi:
		return hi
	}
	return v
}
