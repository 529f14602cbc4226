package global

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/summary"
)

// Limits bound what regions can make a global member hold.
type Limits struct {
	// MaxRegions caps the regions whose summaries are held. A summary from
	// a new region beyond it ends the stream with ResourceExhausted and is
	// counted (isobar_global_summaries_rejected_total{reason=
	// "too_many_regions"}), unless a held region has been silent for
	// RegionForgetAfter, which is then forgotten to make room. Default
	// 1024.
	MaxRegions int
	// RegionForgetAfter: a region silent this long (receive time) may be
	// forgotten to admit a new one. Default 10 min.
	RegionForgetAfter time.Duration
	// MaxRecvMsgBytes is the gRPC server's receive limit. Default 1 MiB
	// (a summary is bounded by models and regions, see summary.MaxModels).
	MaxRecvMsgBytes int
	// MaxClockSkew: a summary whose time differs from this member's clock
	// at receipt by more than this flags its region (clock_skew_seconds and
	// clock_skewed in /debug/regions, isobar_global_clock_skewed_summaries_total,
	// one log line when the flag is raised). Freshness always runs on the
	// receive time. Default 5 s.
	MaxClockSkew time.Duration
	// MaxSyncStreams caps the Sync streams open at once, all connections
	// together; one more is refused with ResourceExhausted
	// (isobar_global_summaries_rejected_total{reason="too_many_streams"}).
	// Default 2 x MaxRegions (a region reconnecting while its old stream
	// drains holds two).
	MaxSyncStreams int
	// FirstSummaryTimeout closes a Sync stream that has sent no summary
	// this long after it opened (DeadlineExceeded, reason
	// "first_summary_timeout"), so silent streams cannot hold the cap.
	// Default 10 s (regions send one at once, then every summary
	// interval).
	FirstSummaryTimeout time.Duration
}

func (l *Limits) withDefaults() {
	if l.MaxRegions == 0 {
		l.MaxRegions = 1024
	}
	if l.RegionForgetAfter == 0 {
		l.RegionForgetAfter = 10 * time.Minute
	}
	if l.MaxRecvMsgBytes == 0 {
		l.MaxRecvMsgBytes = 1 << 20
	}
	if l.MaxClockSkew == 0 {
		l.MaxClockSkew = 5 * time.Second
	}
	if l.MaxSyncStreams == 0 {
		l.MaxSyncStreams = 2 * l.MaxRegions
	}
	if l.FirstSummaryTimeout == 0 {
		l.FirstSummaryTimeout = 10 * time.Second
	}
}

func (l Limits) validate() error {
	switch {
	case l.MaxRegions < 1 || l.MaxRegions > summary.MaxRegions:
		return fmt.Errorf("%w: max regions %d: want 1-%d", ErrInvalidConfig, l.MaxRegions, summary.MaxRegions)
	case l.RegionForgetAfter <= 0:
		return fmt.Errorf("%w: region forget-after %v: want > 0", ErrInvalidConfig, l.RegionForgetAfter)
	case l.MaxRecvMsgBytes < 4096:
		return fmt.Errorf("%w: max gRPC message size %d: want at least 4096 bytes", ErrInvalidConfig, l.MaxRecvMsgBytes)
	case l.MaxClockSkew <= 0:
		return fmt.Errorf("%w: max clock skew %v: want > 0", ErrInvalidConfig, l.MaxClockSkew)
	case l.MaxSyncStreams < 1:
		return fmt.Errorf("%w: max sync streams %d: want at least 1", ErrInvalidConfig, l.MaxSyncStreams)
	case l.FirstSummaryTimeout <= 0:
		return fmt.Errorf("%w: first summary timeout %v: want > 0", ErrInvalidConfig, l.FirstSummaryTimeout)
	}
	return nil
}

// ErrTooManyRegions: Limits.MaxRegions regions are held and a summary
// came from a new one. A reason label (too_many_regions) of
// isobar_global_summaries_rejected_total; test with errors.Is.
var ErrTooManyRegions = errors.New("global: region limit reached")

// putLimited stores s received at at, like put, within the limits: a new
// region is admitted only below MaxRegions or by forgetting the region
// silent longest, if silent for RegionForgetAfter. A summary of a new
// incarnation replaces one whose latest arrived more than replaceAfter ago
// (receive time) even when its own time is earlier: a region whose clock
// ran ahead before a restart is not locked out until its clock catches up.
// Zero limits (a bare syncService in tests) mean no cap and no replacement.
func (st *store) putLimited(s *isobarpb.RegionSummary, at time.Time, l Limits, replaceAfter time.Duration) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	r := s.GetRegion()
	old, ok := st.sums[r]
	if ok {
		restarted := replaceAfter > 0 && old.s.GetIncarnation() != s.GetIncarnation() && at.Sub(old.at) > replaceAfter
		if !restarted && !summary.Newer(s, old.s) {
			return fmt.Errorf("%w: %s sequence %d", ErrStale, r, s.GetSequence())
		}
		st.sums[r] = received{s: s, at: at}
		return nil
	}
	if l.MaxRegions > 0 && len(st.sums) >= l.MaxRegions {
		oldest, oldestAt := "", at
		for name, rc := range st.sums {
			if rc.at.Before(oldestAt) {
				oldest, oldestAt = name, rc.at
			}
		}
		if oldest == "" || at.Sub(oldestAt) < l.RegionForgetAfter {
			return fmt.Errorf("%w: %d regions held, limit %d; refusing new region %s", ErrTooManyRegions, len(st.sums), l.MaxRegions, r)
		}
		delete(st.sums, oldest)
	}
	st.sums[r] = received{s: s, at: at}
	return nil
}

// skewOf is a summary's own time minus its receive time.
func skewOf(rc received) time.Duration { return rc.s.GetAt().AsTime().Sub(rc.at) }

// skewWatch flags regions whose summaries carry a time beyond the skew
// bound from this member's clock. Safe for concurrent use; its map holds
// at most MaxRegions entries (it is cleared when it grows past them, so a
// region may log its flag a second time).
type skewWatch struct {
	bound   time.Duration
	max     int
	log     *slog.Logger
	counter prometheus.Counter

	mu      sync.Mutex
	flagged map[string]bool
}

// newSkewWatch builds the watch; its counter is registered by the caller
// (Server registers it with the other instruments).
func newSkewWatch(l Limits, log *slog.Logger) *skewWatch {
	w := &skewWatch{
		bound: l.MaxClockSkew, max: l.MaxRegions, log: log, flagged: map[string]bool{},
		counter: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_global_clock_skewed_summaries_total",
			Help: "Summaries whose time was further from this member's clock than the skew bound (accepted; freshness uses the receive time).",
		}),
	}
	return w
}

// observe notes the skew of an accepted summary and logs when a region's
// flag is raised or cleared.
func (w *skewWatch) observe(region string, skew time.Duration) {
	skewed := skew > w.bound || -skew > w.bound
	if skewed {
		w.counter.Inc()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.flagged[region] == skewed {
		return
	}
	if skewed {
		if len(w.flagged) >= w.max {
			clear(w.flagged)
		}
		w.flagged[region] = true
		w.log.Warn("region clock skew beyond the bound; freshness uses this member's receive time",
			"region", region, "skew", skew.Round(time.Millisecond), "bound", w.bound)
		return
	}
	delete(w.flagged, region)
	w.log.Info("region clock skew back within the bound", "region", region, "skew", skew.Round(time.Millisecond))
}

// skewCollector exports each held region's clock skew from the store at
// scrape time (bounded by MaxRegions).
type skewCollector struct {
	store *store
	desc  *prometheus.Desc
}

func newSkewCollector(st *store) *skewCollector {
	return &skewCollector{store: st, desc: prometheus.NewDesc("isobar_global_region_clock_skew_seconds",
		"A region's latest summary time minus its receive time.", []string{"region"}, nil)}
}

func (c *skewCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *skewCollector) Collect(ch chan<- prometheus.Metric) {
	for r, rc := range c.store.snapshot() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, skewOf(rc).Seconds(), r)
	}
}
