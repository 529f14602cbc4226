package global

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
)

type metrics struct {
	summaries    prometheus.Counter
	rejected     *prometheus.CounterVec
	streams      prometheus.Gauge
	leader       prometheus.Gauge
	epoch        prometheus.Gauge
	regions      *prometheus.GaugeVec
	solve        prometheus.Histogram
	planWrites   *prometheus.CounterVec
	planSequence prometheus.Gauge
	// unknownAllowed counts allowed-region names of demand slices that
	// named no live region.
	unknownAllowed prometheus.Counter
}

// newMetrics builds the member's instruments, unregistered: register
// them with (*metrics).register.
func newMetrics() *metrics {
	m := &metrics{
		summaries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_global_summaries_total", Help: "Region summaries accepted.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_global_summaries_rejected_total", Help: "Region summaries refused, by reason.",
		}, []string{"reason"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_global_sync_streams", Help: "Open Sync streams from regions.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_global_leader", Help: "1 while this member leads.",
		}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_global_plan_epoch", Help: "Fencing epoch of the plans this member publishes (0 when standby).",
		}),
		regions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_global_regions", Help: "Regions by summary freshness (live or stale) at the last cycle.",
		}, []string{"state"}),
		solve: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "isobar_global_plan_duration_seconds", Help: "Time to plan every model in one cycle.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 3, 12),
		}),
		planWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_global_plan_writes_total", Help: "Fenced plan writes to etcd, by result (ok, fenced, error).",
		}, []string{"result"}),
		planSequence: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_global_plan_sequence", Help: "Sequence of the last plan published in this epoch.",
		}),
		unknownAllowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_global_slice_regions_unknown_total",
			Help: "Allowed regions of demand slices that named no live region, per planned model and cycle: dropped from the slice, which stays within the rest (with none left it is shed whole, never spilled).",
		}),
	}
	return m
}

// register registers the instruments with reg (nil: none), returning the
// first registration error (a name another collector holds) rather than
// panicking.
func (m *metrics) register(reg prometheus.Registerer) error {
	return registerAll(reg, m.summaries, m.rejected, m.streams, m.leader, m.epoch, m.regions, m.solve, m.planWrites, m.planSequence, m.unknownAllowed)
}

// registerAll registers cs with reg in order and stops at the first error.
// A nil reg registers nothing.
func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	if err := promreg.Register(reg, cs...); err != nil {
		return fmt.Errorf("global: register metrics: %w", err)
	}
	return nil
}
