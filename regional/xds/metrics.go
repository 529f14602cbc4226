package xds

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
	"github.com/isobar-mesh/isobar/xdscontract"
)

type metrics struct {
	acks          *prometheus.CounterVec
	nacks         *prometheus.CounterVec
	requests      *prometheus.CounterVec
	responses     *prometheus.CounterVec
	streams       prometheus.Gauge
	buildDuration prometheus.Histogram
	pushes        prometheus.Counter
	pushErrors    prometheus.Counter
	refused       prometheus.Counter
	// staleNonces and unknownNames count bad client input that is ignored
	// (logged once per stream, type and version).
	staleNonces  *prometheus.CounterVec
	unknownNames *prometheus.CounterVec
}

// newMetrics builds the metrics and registers them on reg unless it is nil.
// It fails if a metric is already registered there (two servers on one
// registry).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_xds_acks_total",
			Help: "xDS responses acknowledged by clients, by resource type.",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_xds_nacks_total",
			Help: "xDS responses rejected by clients, by resource type.",
		}, []string{"type"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_xds_requests_total",
			Help: "xDS discovery requests received, by resource type (other: a type this server does not serve).",
		}, []string{"type"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_xds_responses_total",
			Help: "xDS discovery responses sent, by resource type.",
		}, []string{"type"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_regional_xds_connected_streams",
			Help: "Open xDS streams.",
		}),
		buildDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "isobar_regional_xds_build_duration_seconds",
			Help:    "Time to build and validate the snapshots of one Push.",
			Buckets: []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1},
		}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_regional_xds_pushes_total",
			Help: "Push calls whose state was accepted (including those that changed nothing).",
		}),
		pushErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_regional_xds_push_errors_total",
			Help: "Push calls refused; the previous snapshot stayed in place.",
		}),
		staleNonces: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_xds_stale_nonces_total",
			Help: "xDS requests whose response_nonce is not the last one sent on their stream for that type (stale, or made up), by resource type; they are ignored.",
		}, []string{"type"}),
		unknownNames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_regional_xds_unknown_resource_requests_total",
			Help: "xDS requests naming a resource the client's snapshot does not hold, by resource type; the server answers with the resources it has.",
		}, []string{"type"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_regional_xds_streams_refused_total",
			Help: "xDS streams and fetches refused by Deps.Authorize (PermissionDenied): the client's identity may not read this controller's configuration.",
		}),
	}
	labels := []string{typeLabel(xdscontract.LbEndpointType)}
	for t := range numTypes {
		labels = append(labels, t.label())
	}
	for _, l := range labels {
		m.acks.WithLabelValues(l)
		m.nacks.WithLabelValues(l)
		m.responses.WithLabelValues(l)
		m.staleNonces.WithLabelValues(l)
		m.unknownNames.WithLabelValues(l)
	}
	if reg != nil {
		if err := promreg.Register(reg, m.acks, m.nacks, m.requests, m.responses, m.streams, m.buildDuration, m.pushes, m.pushErrors, m.refused, m.staleNonces, m.unknownNames); err != nil {
			return nil, fmt.Errorf("xds: register metrics: %w", err)
		}
	}
	return m, nil
}
