package scale

import (
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/gossip"
)

// Metrics of a controller that a point reads.
const (
	metricHeartbeats = "isobar_regional_heartbeats_total"
	metricProjection = "isobar_regional_projection_duration_seconds"
	metricXDSBuild   = "isobar_regional_xds_build_duration_seconds"
	metricFailover   = "isobar_regional_failover_seconds"
	metricStreamLoss = "isobar_regional_stream_loss_seconds"
	metricProbes     = "isobar_regional_probes_total"
	metricTTLFailed  = "isobar_regional_ttl_failures_total"
	metricIngestLag  = "isobar_regional_ingest_lag_seconds"
	metricRejected   = "isobar_regional_heartbeats_rejected_total"
)

var tapped = []string{metricHeartbeats, metricProjection, metricXDSBuild, metricFailover, metricStreamLoss, metricProbes, metricTTLFailed, metricIngestLag, metricRejected}

// metricTap is a prometheus.Registerer that keeps the collectors of the few
// metrics a point reads and registers nothing: no registry gathers the
// per-cell series, so reading a figure costs one collector's Collect.
type metricTap struct {
	mu       sync.Mutex
	captured map[string]prometheus.Collector
}

func newMetricTap() *metricTap { return &metricTap{captured: map[string]prometheus.Collector{}} }

var _ prometheus.Registerer = (*metricTap)(nil)

// Register keeps c when it describes a metric the point reads.
func (t *metricTap) Register(c prometheus.Collector) error {
	descs := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(descs); close(descs) }()
	for d := range descs {
		for _, name := range tapped {
			if strings.Contains(d.String(), `fqName: "`+name+`"`) {
				t.mu.Lock()
				t.captured[name] = c
				t.mu.Unlock()
			}
		}
	}
	return nil
}

// MustRegister registers every collector.
func (t *metricTap) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = t.Register(c)
	}
}

// Unregister forgets nothing (nothing is registered).
func (t *metricTap) Unregister(prometheus.Collector) bool { return true }

// sample is a counter's or gauge's value, or a histogram's sum and count.
type sample struct{ value, sum, count float64 }

func (t *metricTap) read(name string) sample {
	t.mu.Lock()
	c := t.captured[name]
	t.mu.Unlock()
	var s sample
	if c == nil {
		return s
	}
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		switch {
		case pb.Counter != nil:
			s.value += pb.GetCounter().GetValue()
		case pb.Gauge != nil:
			s.value += pb.GetGauge().GetValue()
		case pb.Histogram != nil:
			s.sum += pb.GetHistogram().GetSampleSum()
			s.count += float64(pb.GetHistogram().GetSampleCount())
		}
	}
	return s
}

// summaryTap stands in for a controller's gossip member: it captures the
// summaries the controller's real summary loop builds, reports no peers
// (so routing stays local-first) and reports the RTT to every other region
// that a gossip member would have measured and a Vivaldi coordinate of
// the size a member reports (serf's 8 dimensions), so the summary carries
// what a real one carries (the builder keeps the RTTs of the nearest
// regions only, regional.GlobalConfig.NearestRTT).
type summaryTap struct {
	rtt   map[string]time.Duration
	coord *coordinate.Coordinate

	mu    sync.Mutex
	count int   // summaries captured
	bytes int64 // their total proto.Size
	last  *isobarpb.RegionSummary
}

func (s *summaryTap) SetLocalSummary(sm *isobarpb.RegionSummary) error {
	n := proto.Size(sm)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count++
	s.bytes += int64(n)
	s.last = sm
	return nil
}

func (s *summaryTap) Summaries() map[string]gossip.PeerSummary { return nil }

func (s *summaryTap) RTT() map[string]time.Duration { return s.rtt }

// Coordinate is the region's network coordinate: every component set, as
// a member's is once its probes have moved it.
func (s *summaryTap) Coordinate() *coordinate.Coordinate { return s.coord }

// tapCoordinate is a coordinate with every field non-zero (a zero field
// would not be encoded, understating the summary's size).
func tapCoordinate(seed int) *coordinate.Coordinate {
	c := coordinate.NewCoordinate(coordinate.DefaultConfig())
	for i := range c.Vec {
		c.Vec[i] = 0.001 * float64(1+(seed+i)%7)
	}
	c.Error, c.Adjustment, c.Height = 0.2, 0.0001, 0.00002
	return c
}

// totals are the summaries captured so far, their bytes and the latest.
func (s *summaryTap) totals() (int, int64, *isobarpb.RegionSummary) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count, s.bytes, s.last
}
