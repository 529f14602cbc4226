package gateway

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/internal/promreg"
)

type metrics struct {
	requests         *prometheus.CounterVec   // model, code
	upstreamRequests *prometheus.CounterVec   // endpoint, code
	upstreamErrors   *prometheus.CounterVec   // endpoint, reason
	ttft             *prometheus.HistogramVec // model
	duration         *prometheus.HistogramVec // model
	retries          *prometheus.CounterVec   // model
	retriesRefused   *prometheus.CounterVec   // model
	ejections        *prometheus.CounterVec   // endpoint
	shed             *prometheus.CounterVec   // model, reason
	inflight         prometheus.Gauge
	badRequests      *prometheus.CounterVec // reason
	xdsUpdates       *prometheus.CounterVec // type
	xdsNacks         *prometheus.CounterVec // type
	xdsConnected     *prometheus.GaugeVec   // type
	reports          *prometheus.CounterVec // result
	lbFallbacks      prometheus.Counter
	untrustedHops    *prometheus.CounterVec // reason
	overloadRefused  prometheus.Counter
	xdsRespBytes     *prometheus.GaugeVec // type
	xdsRespLimit     prometheus.Gauge
	xdsNearLimit     *prometheus.CounterVec // type
	xdsTooLarge      *prometheus.CounterVec // type
	class            *classMetrics
	flow             *flowMetrics
}

// xdsNearLimitFraction is the share of Config.MaxXDSMessageBytes above
// which an accepted response is counted (and warned about) as near the
// limit: the region is growing towards what its data planes can take.
const xdsNearLimitFraction = 0.75

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// newMetrics builds the metrics and registers them, with collector (the
// scrape-time per-endpoint and per-type gauges), on reg unless it is nil.
// A registration failure (a name taken) is returned, never panicked.
func newMetrics(reg prometheus.Registerer, collector prometheus.Collector) (*metrics, error) {
	m := newProxyMetrics()
	m.addXDSMetrics()
	m.class, m.flow = newClassMetrics(), newFlowMetrics()
	for _, r := range hopReasons {
		m.untrustedHops.WithLabelValues(r)
	}
	for _, t := range xdsclient.TypeLabels {
		m.xdsNearLimit.WithLabelValues(t)
		m.xdsTooLarge.WithLabelValues(t)
		m.xdsUpdates.WithLabelValues(t)
		m.xdsNacks.WithLabelValues(t)
		m.xdsConnected.WithLabelValues(t)
	}
	for _, r := range []string{"sent", "failed", "refused"} {
		m.reports.WithLabelValues(r)
	}
	if reg != nil {
		cs := append([]prometheus.Collector{m.requests, m.upstreamRequests, m.upstreamErrors, m.ttft, m.duration, m.retries, m.retriesRefused, m.ejections, m.shed, m.inflight, m.badRequests, m.xdsUpdates, m.xdsNacks, m.xdsConnected, m.reports, m.lbFallbacks, m.untrustedHops, m.overloadRefused, m.xdsRespBytes, m.xdsRespLimit, m.xdsNearLimit, m.xdsTooLarge, collector}, m.class.collectors()...)
		cs = append(cs, m.flow.collectors()...)
		if err := promreg.Register(reg, cs...); err != nil {
			return nil, fmt.Errorf("gateway: register metrics: %w", err)
		}
	}
	return m, nil
}

// newProxyMetrics builds the metrics of the client requests and of the
// upstream attempts.
func newProxyMetrics() *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_requests_total",
			Help: "Client requests answered, by model (\"unknown\" when no route matched) and status class (2xx..5xx).",
		}, []string{"model", "code"}),
		upstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_upstream_requests_total",
			Help: "Upstream attempts (retries included) by endpoint (cell id or address) and outcome (2xx..5xx, or error).",
		}, []string{"endpoint", "code"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_upstream_errors_total",
			Help: "Upstream failures by endpoint and reason: connect, reset, timeout, 5xx.",
		}, []string{"endpoint", "reason"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "isobar_gateway_ttft_seconds",
			Help:    "Time from a request's arrival to the first response body byte relayed, by model.",
			Buckets: latencyBuckets,
		}, []string{"model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "isobar_gateway_request_duration_seconds",
			Help:    "Time from a request's arrival to its last response byte, by model.",
			Buckets: latencyBuckets,
		}, []string{"model"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_retries_total",
			Help: "Retries sent, by model.",
		}, []string{"model"}),
		retriesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_retries_refused_total",
			Help: "Retries not sent because the cluster's retry budget was spent, by model.",
		}, []string{"model"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_ejections_total",
			Help: "Passive outlier ejections, by endpoint.",
		}, []string{"endpoint"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_shed_total",
			Help: "Requests refused with 429, by model and reason: fault (the route's shed share) or saturated (every endpoint at its in-flight cap).",
		}, []string{"model", "reason"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_gateway_inflight_requests",
			Help: "Client requests in progress.",
		}),
		badRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gateway_bad_requests_total",
			Help: "Client requests refused before routing, by reason: too_large, unreadable, timeout (body not received within the read timeout), malformed.",
		}, []string{"reason"}),
	}
	m.untrustedHops = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_gateway_untrusted_hop_headers_total",
		Help: "Requests carrying the hop header or its proof without a valid proof, served as client traffic with both removed, by reason: no_key (this data plane has no hop key), missing, malformed, bad_signature, stale.",
	}, []string{"reason"})
	m.overloadRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_gateway_overload_refused_total",
		Help: "Completion requests answered 503 on arrival because the gateway held MaxInflightRequests (--max-inflight) already.",
	})
	return m
}

// addXDSMetrics builds the metrics of the xDS streams and the reports.
func (m *metrics) addXDSMetrics() {
	m.xdsUpdates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_gateway_xds_updates_total",
		Help: "xDS responses accepted (ACKed), by type.",
	}, []string{"type"})
	m.xdsNacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_gateway_xds_nacks_total",
		Help: "xDS responses refused (NACKed), by type; the previous resources stay in use.",
	}, []string{"type"})
	m.xdsConnected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "isobar_gateway_xds_connected",
		Help: "1 while the xDS stream of a type is up.",
	}, []string{"type"})
	m.reports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_gateway_reports_total",
		Help: "DataPlane reports by result: sent, failed (not sent; the counts roll into the next), refused (the controller's ack named an error).",
	}, []string{"result"})
	m.lbFallbacks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_gateway_lb_policy_fallbacks_total",
		Help: "Clusters whose pushed load-balancing policy the gateway does not know, replaced by ROUND_ROBIN (Envoy's default); counted per cluster per accepted CDS update.",
	})
	m.xdsRespBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "isobar_gateway_xds_response_bytes",
		Help: "Size of the last xDS response received, by type; alert when it nears isobar_gateway_xds_response_limit_bytes.",
	}, []string{"type"})
	m.xdsRespLimit = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "isobar_gateway_xds_response_limit_bytes",
		Help: "Largest xDS response the gateway receives (MaxXDSMessageBytes); a larger one breaks the stream.",
	})
	m.xdsNearLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_gateway_xds_responses_near_limit_total",
		Help: "xDS responses received above 75% of the receive limit, by type: raise --xds-max-cells (and the controller's --max-cells) before the region grows past it.",
	}, []string{"type"})
	m.xdsTooLarge = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_gateway_xds_responses_too_large_total",
		Help: "xDS streams broken by a response above the receive limit, by type; the gateway keeps its last configuration. Set --xds-max-cells to the controller's --max-cells.",
	}, []string{"type"})
}

// forgetEndpoint drops the per-endpoint series of an endpoint no longer
// configured.
func (m *metrics) forgetEndpoint(label string) {
	l := prometheus.Labels{"endpoint": label}
	m.upstreamRequests.DeletePartialMatch(l)
	m.upstreamErrors.DeletePartialMatch(l)
	m.ejections.DeletePartialMatch(l)
}

func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "error"
	}
	return strconv.Itoa(status/100) + "xx"
}

// stateCollector exports, at scrape time, the per-endpoint in-flight counts
// and ejection flags of the current table and the age and version of each
// resource type, so removed endpoints disappear with the table.
type stateCollector struct {
	g        *Gateway
	inflight *prometheus.Desc
	pending  *prometheus.Desc
	ejected  *prometheus.Desc
	version  *prometheus.Desc
	age      *prometheus.Desc
}

func newStateCollector(g *Gateway) *stateCollector {
	return &stateCollector{
		g: g,
		inflight: prometheus.NewDesc("isobar_gateway_upstream_inflight_requests",
			"Upstream attempts in flight, by endpoint.", []string{"endpoint"}, nil),
		pending: prometheus.NewDesc("isobar_gateway_upstream_pending_prompt_tokens",
			"Prompt tokens sent to an endpoint whose first response byte has not arrived, by endpoint (what --lb isobar counts).", []string{"endpoint"}, nil),
		ejected: prometheus.NewDesc("isobar_gateway_endpoint_ejected",
			"1 while an endpoint is ejected by passive outlier detection.", []string{"endpoint"}, nil),
		version: prometheus.NewDesc("isobar_gateway_xds_config_version",
			"Version of the resources in use, by type, when the control plane's version is a number.", []string{"type"}, nil),
		age: prometheus.NewDesc("isobar_gateway_xds_config_age_seconds",
			"Time since the resources in use of a type were received.", []string{"type"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inflight
	ch <- c.pending
	ch <- c.ejected
	ch <- c.version
	ch <- c.age
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.g.tbl.Load()
	if t == nil {
		return
	}
	now := c.g.clock.Now()
	seen := make(map[string]bool)
	for _, cl := range t.clusters {
		for _, h := range cl.all {
			if seen[h.label] {
				continue
			}
			seen[h.label] = true
			ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(h.st.inflight.Load()), h.label)
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(h.st.pending.Load()), h.label)
			ej := 0.0
			if h.st.ejected(now.UnixNano()) {
				ej = 1
			}
			ch <- prometheus.MustNewConstMetric(c.ejected, prometheus.GaugeValue, ej, h.label)
		}
	}
	for _, typ := range xdsclient.TypeLabels {
		version, at := t.view.Version(typ)
		if at.IsZero() {
			continue
		}
		if n, err := strconv.ParseFloat(version, 64); err == nil {
			ch <- prometheus.MustNewConstMetric(c.version, prometheus.GaugeValue, n, typ)
		}
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, now.Sub(at).Seconds(), typ)
	}
}
