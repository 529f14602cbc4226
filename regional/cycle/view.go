package cycle

import (
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
)

// CellView is one cell as the controller sees it.
//
// A cycle makes a new view of each cell with a new heartbeat (views are
// published and never modified), two thousand a cycle at 10,000 cells:
// the one-byte and four-byte fields come together so that a view packs
// into 504 bytes, the allocator's 512-byte class, not the 576-byte one
// its padding took (TestCellViewFitsItsSizeClass).
type CellView struct {
	ID          string
	Endpoint    string
	Model       string
	MaxModelLen uint32
	// MaxNumSeqs and PrefillTokensPerSecond (below) are the engine's
	// declared capacity from its heartbeat's capability (0: unknown).
	MaxNumSeqs uint32
	State      lifecycle.State
	RTTOK      bool
	// OperatorDrain: an operator asked for this cell to be drained.
	OperatorDrain bool
	// Fallback: a telemetry source is missing and scoring runs on the rest.
	Fallback bool
	// EndpointConflict: another live cell advertises the same endpoint;
	// this one is kept out of the load balancer.
	EndpointConflict bool
	// Suspect: the cell's heartbeat stream broke without a Terminated
	// report; it has weight 0 until it heartbeats again or the TTL fails it.
	Suspect bool
	// ClockSkewKnown: the last heartbeat carried sent_at (ClockSkew below);
	// ClockSkewed: its skew is beyond Limits.MaxClockSkew.
	ClockSkewKnown, ClockSkewed bool
	StateSince                  time.Time
	Reason                      string
	LastSeen                    time.Time
	Incarnation                 string
	Sequence                    uint64
	// Signals as last reported (shared with the registry; read only).
	Signals *isobarpb.Signals
	VLLM    SourceView
	DCGM    SourceView
	RTT     time.Duration
	Jitter  time.Duration
	Score   score.Result
	Weight  projection.Weight
	// ClockSkew is the last heartbeat's sent_at minus its receive time.
	ClockSkew              time.Duration
	PrefillTokensPerSecond float64
}

// ScoreReading is the score.Reading of the cell as v shows it: its last
// heartbeat's signals and sources and the probe's RTT and jitter. The data
// plane's error rate, which the registry also scores, is not in the view.
func (v CellView) ScoreReading() score.Reading {
	return Reading(v.Signals, v.VLLM.OK, v.DCGM.OK, v.RTT, v.Jitter, v.RTTOK)
}

// SourceView is one telemetry source's health as last reported.
type SourceView struct {
	OK          bool
	Error       string
	LastSuccess time.Time
}

// Reading is the score.Reading of a heartbeat's signals s (a field is
// present when it is set; nil s sets none), with the health of its
// sources and the probe's RTT and jitter.
func Reading(s *isobarpb.Signals, vllmOK, dcgmOK bool, rtt, jitter time.Duration, rttOK bool) score.Reading {
	opt := func(p *float64) score.Value {
		if p == nil {
			return score.Value{}
		}
		return score.Some(*p)
	}
	r := score.Reading{AppOK: vllmOK, HardwareOK: dcgmOK, RTT: rtt, Jitter: jitter, RTTOK: rttOK}
	if s == nil {
		return r
	}
	r.QueueDepth, r.Running, r.TTFTP95, r.ErrorRate, r.KVCache = opt(s.QueueDepth), opt(s.Running), opt(s.TtftP95Seconds), opt(s.ErrorRate), opt(s.KvCacheUsage)
	r.GPUUtil, r.VRAM, r.SMActive, r.DRAMActive = opt(s.GpuUtil), opt(s.VramUsed), opt(s.SmActive), opt(s.DramActive)
	r.TemperatureC = opt(s.TemperatureCelsius)
	if s.ClockThrottleReasons != nil {
		r.ThrottleReasons, r.ThrottleOK = *s.ClockThrottleReasons, true
	}
	return r
}
