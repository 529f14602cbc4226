package regional

import (
	"errors"
	"fmt"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// Limits bound what outside input can make the controller hold or do.
// Every refusal is counted in isobar_regional_heartbeats_rejected_total
// (or isobar_regional_dataplane_reports_total) under a fixed reason label,
// so no label value ever comes from a peer.
type Limits struct {
	// MaxCells caps the cells the registry holds, in any state (Failed and
	// Terminated cells count until ForgetAfter). The first heartbeat of a
	// new cell beyond it ends its stream with ResourceExhausted (reason
	// too_many_cells); cells already known are never refused. Default
	// xdscontract.DefaultMaxCells (10,000). It also sizes the gRPC send
	// limit (xdscontract.MaxXDSMessageBytes), which data planes match
	// (isobar gateway/picker --xds-max-cells).
	MaxCells int
	// MaxRecvMsgBytes is the gRPC server's receive limit for every RPC
	// (heartbeats, data-plane reports, xDS requests). Default 4 MiB.
	MaxRecvMsgBytes int
	// MaxHeartbeatStreams caps the heartbeat streams open at once, over
	// all connections; one more is refused with ResourceExhausted (reason
	// too_many_streams). Each agent holds one, and a reconnecting agent's
	// old stream may linger up to a TTL. Default 2 × MaxCells.
	MaxHeartbeatStreams int
	// HeartbeatRate and HeartbeatBurst are each heartbeat stream's token
	// bucket (heartbeats/s, bucket size). A heartbeat beyond it is dropped
	// unacked (reason rate_limited). A stream whose drops go on for the
	// bucket's refill time (HeartbeatBurst / HeartbeatRate: 2 s), never
	// pausing that long, with at least HeartbeatBurst of them — one
	// sending above the rate for that long — is closed with
	// ResourceExhausted. A backlog the
	// controller reads at once after a stall of its own (under overload)
	// is dropped down to the bucket, never a reason to close: the cell
	// sent at its pace, and closing would turn the controller's lag into
	// reconnections. Defaults 20/s and 40: an agent sends 2/s at the
	// default interval, plus one at once per state change.
	HeartbeatRate  float64
	HeartbeatBurst int
	// MaxClockSkew: a heartbeat whose sent_at differs from this
	// controller's clock by more than this flags its cell (clock_skewed in
	// /debug/cells, isobar_regional_clock_skewed_heartbeats_total, one log
	// line when the flag is raised). Skew never refuses a heartbeat: TTLs
	// and staleness run on the receive time. Default 5 s.
	MaxClockSkew time.Duration
	// MaxDemandKeys caps the (data plane node, model) demand windows kept
	// from DataPlane reports; a report naming a new pair beyond it has that
	// pair ignored and counted (result demand_overflow). Default 4096.
	MaxDemandKeys int
}

// maxSendMsgBytes is the gRPC server's send limit: the largest xDS
// response a region of MaxCells cells needs, the size data planes' receive
// limit is derived from too.
func (l Limits) maxSendMsgBytes() int { return xdscontract.MaxXDSMessageBytes(l.MaxCells) }

func (l *Limits) withDefaults() {
	if l.MaxCells == 0 {
		l.MaxCells = xdscontract.DefaultMaxCells
	}
	if l.MaxHeartbeatStreams == 0 {
		l.MaxHeartbeatStreams = 2 * l.MaxCells
	}
	if l.MaxRecvMsgBytes == 0 {
		l.MaxRecvMsgBytes = 4 << 20
	}
	if l.HeartbeatRate == 0 {
		l.HeartbeatRate = 20
	}
	if l.HeartbeatBurst == 0 {
		l.HeartbeatBurst = 40
	}
	if l.MaxClockSkew == 0 {
		l.MaxClockSkew = 5 * time.Second
	}
	if l.MaxDemandKeys == 0 {
		l.MaxDemandKeys = 4096
	}
}

func (l Limits) validate() error {
	switch {
	case l.MaxCells < 1:
		return fmt.Errorf("%w: max cells %d: want >= 1", ErrInvalidConfig, l.MaxCells)
	case l.MaxHeartbeatStreams < 1:
		return fmt.Errorf("%w: max heartbeat streams %d: want >= 1", ErrInvalidConfig, l.MaxHeartbeatStreams)
	case l.MaxRecvMsgBytes < 4096:
		return fmt.Errorf("%w: max gRPC message size %d: want at least 4096 bytes", ErrInvalidConfig, l.MaxRecvMsgBytes)
	case !(l.HeartbeatRate > 0) || l.HeartbeatBurst < 1:
		return fmt.Errorf("%w: heartbeat rate %v burst %d: want rate > 0 and burst >= 1", ErrInvalidConfig, l.HeartbeatRate, l.HeartbeatBurst)
	case l.MaxClockSkew <= 0:
		return fmt.Errorf("%w: max clock skew %v: want > 0", ErrInvalidConfig, l.MaxClockSkew)
	case l.MaxDemandKeys < 1:
		return fmt.Errorf("%w: max demand keys %d: want >= 1", ErrInvalidConfig, l.MaxDemandKeys)
	}
	return nil
}

// maxWindowSamples bounds one data-plane window (a cell's errors, a data
// plane's demand for a model): reports arrive at the data plane's pace, so
// a flood within the window keeps only the newest samples.
const maxWindowSamples = 1024

// Limit refusals; each is a reason label of
// isobar_regional_heartbeats_rejected_total. Test with errors.Is.
var (
	// ErrTooManyCells: the registry holds Limits.MaxCells cells and the
	// heartbeat is for a new one.
	ErrTooManyCells = errors.New("regional: cell limit reached")
	// ErrRateLimited: the stream sends heartbeats faster than
	// Limits.HeartbeatRate allows.
	ErrRateLimited = errors.New("regional: heartbeat rate limit exceeded")
)

// tokenBucket is a heartbeat stream's rate limit, driven by the injected
// clock. Owned by the stream's handler goroutine.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
	// dropped counts the drops of the current episode: drops none of
	// which came a refill time (burst/rate) or more after the one before;
	// dropFrom and lastDrop are its first and last.
	dropped            int
	dropFrom, lastDrop time.Time
}

func newTokenBucket(rate float64, burst int) tokenBucket {
	return tokenBucket{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

// allow takes one token at now, if there is one.
func (b *tokenBucket) allow(now time.Time) bool {
	if !b.last.IsZero() {
		if d := now.Sub(b.last); d > 0 {
			b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		}
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if b.dropped == 0 || now.Sub(b.lastDrop).Seconds()*b.rate >= b.burst {
		b.dropped, b.dropFrom = 0, now // a new episode
	}
	b.dropped++
	if now.After(b.lastDrop) {
		b.lastDrop = now
	}
	return false
}

// abusive reports whether the current episode of drops is a sender above
// the rate, not a backlog read at once: at least a bucket's worth of
// drops, going on for at least the time the bucket takes to refill.
func (b *tokenBucket) abusive() bool {
	return b.dropped >= int(b.burst) && b.lastDrop.Sub(b.dropFrom).Seconds()*b.rate >= b.burst
}

// admitRate applies the stream's token bucket. drop: the heartbeat is
// counted and dropped unacked; a non-nil error (wrapping ErrRateLimited)
// ends the stream with ResourceExhausted.
func (s *heartbeatService) admitRate(st *streamState) (drop bool, err error) {
	if st.bucket.allow(s.clock.Now()) {
		return false, nil
	}
	s.metrics.rejected.WithLabelValues(rejectReason(ErrRateLimited)).Inc()
	if b := &st.bucket; b.abusive() {
		return true, fmt.Errorf("%w: %d heartbeats dropped over %v without a pause (limit %v/s, burst %v); closing the stream",
			ErrRateLimited, b.dropped, b.lastDrop.Sub(b.dropFrom).Round(time.Millisecond), b.rate, b.burst)
	}
	return true, nil
}

// admitCell decides whether a stream may claim cell id, which no stream
// holds. The caller holds s.mu. Cells the registry knows are always
// admitted; a new one only while both the registry and the claimed
// streams are below the limit.
func (s *heartbeatService) admitCell(id string) error {
	v := s.sink.View()
	if _, known := v.Cell(id); known {
		return nil
	}
	if n := max(len(v.Cells), len(s.owners)); n >= s.limits.MaxCells {
		return fmt.Errorf("%w: %d cells, limit %d; refusing new cell %s", ErrTooManyCells, n, s.limits.MaxCells, id)
	}
	return nil
}

// admitNewCell is the registry's own bound on its cell map, behind the
// heartbeat service's check (which works from a view that may lag by a
// cycle). It reports whether a record for a new cell may be created.
func (r *Registry) admitNewCell(hb *isobarpb.CellHeartbeat) bool {
	if len(r.cells) < r.cfg.Limits.MaxCells {
		return true
	}
	r.metrics.rejected.WithLabelValues(rejectReason(ErrTooManyCells)).Inc()
	r.log.Warn("heartbeat for a new cell dropped: cell limit reached", "cell", trunc(hb.GetCellId()), "limit", r.cfg.Limits.MaxCells)
	return false
}

// noteSkew records how far the heartbeat's sent_at is from the
// controller's clock at receipt and flags the cell beyond MaxClockSkew.
// It logs once when the flag is raised and once when it clears. A
// heartbeat without sent_at leaves the skew unknown (never flagged).
func (r *Registry) noteSkew(now time.Time, c *cell, hb *isobarpb.CellHeartbeat) {
	ts := hb.GetSentAt()
	if ts == nil || ts.CheckValid() != nil {
		c.skew, c.skewKnown = 0, false
		return
	}
	c.skew, c.skewKnown = ts.AsTime().Sub(now), true
	skewed := c.skew > r.cfg.Limits.MaxClockSkew || -c.skew > r.cfg.Limits.MaxClockSkew
	if skewed {
		r.metrics.skewed.Inc()
	}
	if skewed != c.skewed {
		if skewed {
			r.log.Warn("cell clock skew beyond the bound; liveness uses this controller's receive time",
				"cell", c.id, "skew", c.skew.Round(time.Millisecond), "bound", r.cfg.Limits.MaxClockSkew)
		} else {
			r.log.Info("cell clock skew back within the bound", "cell", c.id, "skew", c.skew.Round(time.Millisecond))
		}
		c.skewed = skewed
	}
}

// admitDemandKey reports whether the demand window for key may be
// created.
func (r *Registry) admitDemandKey(key string) bool {
	if _, ok := r.dpDemand[key]; ok || len(r.dpDemand) < r.cfg.Limits.MaxDemandKeys {
		return true
	}
	r.metrics.reports.WithLabelValues("demand_overflow").Inc()
	return false
}
