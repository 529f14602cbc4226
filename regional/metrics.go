package regional

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/score"
)

// metrics are the controller's own instruments. Per-cell values are not
// kept here: cellCollector reads them from the current View at scrape time,
// so forgotten cells disappear from /metrics.
type metrics struct {
	heartbeats         prometheus.Counter
	suspects           prometheus.Counter
	massExpiries       prometheus.Counter
	ttlHeld            prometheus.Gauge
	ttlFailures        prometheus.Counter
	ingestLag          prometheus.Gauge
	rejected           *prometheus.CounterVec
	streams            prometheus.Gauge
	transitions        *prometheus.CounterVec
	refusedTransitions prometheus.Counter
	unknownCells       prometheus.Counter
	projection         prometheus.Histogram
	failover           prometheus.Histogram
	streamLoss         prometheus.Histogram
	penaltyTrips       prometheus.Counter
	penaltyKept        prometheus.Gauge
	probes             *prometheus.CounterVec
	plans              *prometheus.CounterVec
	planEpoch          prometheus.Gauge
	routeSource        *prometheus.GaugeVec
	reports            *prometheus.CounterVec
	skewed             prometheus.Counter
	planPeerRefused    *prometheus.CounterVec
	capacityRejected   prometheus.Counter
	capacityRPS        *prometheus.GaugeVec
	capacityConfidence *prometheus.GaugeVec
	retryBudget        *prometheus.GaugeVec
	slicesFolded       *prometheus.CounterVec
	residencyUnseen    prometheus.Gauge
	signalsClamped     *prometheus.CounterVec
}

// newMetrics builds the controller's instruments and registers them on
// reg unless it is nil. It fails when one is already registered there (two
// controllers on one registry).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}
	m.addCellMetrics()
	m.addLivenessMetrics()
	m.addRoutingMetrics()
	if reg == nil {
		return m, nil
	}
	if err := promreg.Register(reg, m.capacityRejected, m.capacityRPS, m.retryBudget, m.slicesFolded, m.residencyUnseen, m.capacityConfidence, m.heartbeats, m.rejected, m.streams, m.transitions, m.refusedTransitions, m.unknownCells, m.projection, m.failover, m.streamLoss, m.penaltyTrips, m.penaltyKept, m.probes, m.plans, m.planEpoch, m.routeSource, m.reports, m.planPeerRefused, m.skewed, m.suspects, m.massExpiries, m.ttlHeld, m.ttlFailures, m.ingestLag, m.signalsClamped); err != nil {
		return nil, fmt.Errorf("regional: register metrics: %w", err)
	}
	return m, nil
}

// addCellMetrics builds the instruments of heartbeats, cells and their
// lifecycle.
func (m *metrics) addCellMetrics() {
	m.heartbeats = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_heartbeats_total",
		Help: "Heartbeats accepted into the registry.",
	})
	m.skewed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_clock_skewed_heartbeats_total",
		Help: "Heartbeats whose sent_at was further from this controller's clock than the skew bound (accepted; liveness uses the receive time).",
	})
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_heartbeats_rejected_total",
		Help: "Heartbeats refused, by reason.",
	}, []string{"reason"})
	m.streams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "isobar_regional_heartbeat_streams",
		Help: "Open heartbeat streams.",
	})
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_lifecycle_transitions_total",
		Help: "Cell lifecycle transitions.",
	}, []string{"from", "to"})
	m.refusedTransitions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_lifecycle_refused_total",
		Help: "Reported states that the lifecycle refused (e.g. Draining after Terminated).",
	})
	m.unknownCells = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_unknown_cell_requests_total",
		Help: "Requests naming a cell the registry does not know.",
	})
	m.projection = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "isobar_regional_projection_duration_seconds",
		Help:    "Time to score every cell and project weights, per cycle.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 12),
	})
	m.failover = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "isobar_regional_failover_seconds",
		Help:    "From a serving cell's failure detection to the xDS push that removed it.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
	m.streamLoss = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "isobar_regional_stream_loss_seconds",
		Help:    "From a heartbeat stream's break, as its handler saw it, to the registry making the cell suspect: the loss's wait for the registry loop and, when it overtook the heartbeat it names, for that heartbeat (streamloss.go).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
	m.penaltyTrips = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_penalty_trips_total",
		Help: "Error-rate outlier penalties tripped.",
	})
	m.penaltyKept = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "isobar_regional_penalty_kept_cells",
		Help: "Cells above the error-rate threshold kept in the load balancer at the last cycle because the rest of their model's cells could not carry its load (projection MaxLoadAfterHold).",
	})
	m.probes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_probes_total",
		Help: "RTT probes of cells, by result.",
	}, []string{"result"})
	m.signalsClamped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_signals_clamped_total",
		Help: "Heartbeat signals above their bound (summary/bounds.go) capped at it, by signal; the cell's heartbeat is kept.",
	}, []string{"field"})
}

// addRoutingMetrics builds the instruments of cross-region routing:
// plans, the route source, data-plane reports and capacity estimates.
// addLivenessMetrics makes the metrics of how cells are judged missing:
// broken streams, TTL failures, mass expiries and the read lag.
func (m *metrics) addLivenessMetrics() {
	m.suspects = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_suspect_cells_total",
		Help: "Cells made suspect (weight 0) because their heartbeat stream broke without a Terminated report.",
	})
	m.massExpiries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_mass_ttl_expiries_total",
		Help: "Times most live cells passed their TTL at once and the controller held them rather than failing them (Config.MassExpiry).",
	})
	m.ttlHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "isobar_regional_ttl_held_cells",
		Help: "Live cells past their TTL that the last sweep held rather than failed, a mass expiry being in progress (0: none).",
	})
	m.ttlFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_ttl_failures_total",
		Help: "Live cells failed because no heartbeat of theirs was read for their TTL (widened by isobar_regional_ingest_lag_seconds).",
	})
	m.ingestLag = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "isobar_regional_ingest_lag_seconds",
		Help: "This controller's read lag over the last heartbeat interval: the 90th percentile of how much later than its cell's usual delay (receive time minus sent_at) a heartbeat was read. The TTL is widened by it, at most by the mass expiry hold (--mass-expiry-hold).",
	})
}

func (m *metrics) addRoutingMetrics() {
	m.plans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_plans_total",
		Help: "Routing plans received from the global leader, by result (applied, stale, expired, invalid, residency: a pinned slice routed outside its regions).",
	}, []string{"result"})
	m.planEpoch = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "isobar_regional_plan_epoch",
		Help: "Fencing epoch of the routing plan applied.",
	})
	m.routeSource = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "isobar_regional_route_source",
		Help: "1 for the source of the cross-region routing in force: plan, fallback or local.",
	}, []string{"source"})
	m.reports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_dataplane_reports_total",
		Help: "Data-plane reports received, by result (accepted, invalid; out_of_range: a count above the shared rate bound over its interval; forbidden: a report stream refused because its certificate is not a gateway of this region).",
	}, []string{"result"})
	m.planPeerRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_plan_sources_refused_total",
		Help: "Sync sessions closed because the server dialled as the global leader is not a global identity, by reason (not_mtls, not_global).",
	}, []string{"reason"})
	m.capacityRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "isobar_regional_capacity_samples_rejected_total",
		Help: "Heartbeat signals the capacity estimator ignored as bad input (NaN, negative, absurd, out of order).",
	})
	m.capacityRPS = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "isobar_regional_capacity_rps",
		Help: "Estimated capacity at SLO of the Ready cells (requests/s), as put in the last summary, by model.",
	}, []string{"model"})
	m.capacityConfidence = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "isobar_regional_capacity_confidence",
		Help: "Confidence in [0,1] that the capacity in the last summary is measured rather than the prior, by model.",
	}, []string{"model"})
	m.addResidencyMetrics()
}

// addResidencyMetrics builds the instruments of issue 25: the retry
// budget, demand slices folded and residency regions not yet seen.
func (m *metrics) addResidencyMetrics() {
	m.retryBudget = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "isobar_regional_retry_budget_percent",
		Help: "Retry budget of each model's clusters in the last pushed xDS state, in percent of their active requests (falls from the static budget as the region's utilisation nears saturation).",
	}, []string{"model"})
	m.slicesFolded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "isobar_regional_demand_slices_folded_total",
		Help: "Data-plane demand slices not taken as reported, by reason (unknown_set: a residency set this controller's config does not define, folded into standard unpinned demand; unknown_criticality: counted as standard; summary_bound: a pinned slice beyond the summary's 32, folded into the unpinned slice of its criticality).",
	}, []string{"reason"})
	m.residencyUnseen = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "isobar_regional_residency_unseen_regions",
		Help: "Regions named by the residency config that are neither this region, nor in --fleet-regions, nor seen in a plan or gossip (a likely typo).",
	})
}

// cellCollector exports per-cell gauges from the current view.
type cellCollector struct {
	view func() *View
	now  func() float64 // unix seconds, from the injected clock

	pressure, weight, staleness, fallback, signal, state, penalty, rtt *prometheus.Desc
	cells, skew                                                        *prometheus.Desc
}

func newCellCollector(view func() *View, now func() float64) *cellCollector {
	return &cellCollector{
		view: view, now: now,
		pressure:  prometheus.NewDesc("isobar_regional_cell_pressure", "Composite pressure of a cell in [0,1].", []string{"cell"}, nil),
		weight:    prometheus.NewDesc("isobar_regional_cell_weight", "Endpoint weight published for a cell (0 = not in the load balancer).", []string{"cell"}, nil),
		staleness: prometheus.NewDesc("isobar_regional_cell_heartbeat_staleness_seconds", "Time since a cell's last heartbeat.", []string{"cell"}, nil),
		fallback:  prometheus.NewDesc("isobar_regional_cell_fallback", "1 when a telemetry source of the cell is missing and scoring runs on the rest.", []string{"cell", "source"}, nil),
		signal:    prometheus.NewDesc("isobar_regional_cell_signal_score", "Normalised score of one signal of a cell in [0,1].", []string{"cell", "signal"}, nil),
		state:     prometheus.NewDesc("isobar_regional_cell_state", "1 for a cell's current lifecycle state.", []string{"cell", "state"}, nil),
		penalty:   prometheus.NewDesc("isobar_regional_cell_penalty", "Error-rate outlier penalty level of a cell in [0,1].", []string{"cell"}, nil),
		rtt:       prometheus.NewDesc("isobar_regional_cell_rtt_seconds", "Probed RTT from the controller to a cell.", []string{"cell"}, nil),
		cells:     prometheus.NewDesc("isobar_regional_cells", "Cells per lifecycle state.", []string{"state"}, nil),
		skew:      prometheus.NewDesc("isobar_regional_cell_clock_skew_seconds", "A cell's last heartbeat sent_at minus its receive time (absent without sent_at).", []string{"cell"}, nil),
	}
}

func (c *cellCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pressure, c.weight, c.staleness, c.fallback, c.signal, c.state, c.penalty, c.rtt, c.cells, c.skew} {
		ch <- d
	}
}

func (c *cellCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.view()
	now := c.now()
	counts := map[lifecycle.State]int{}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, cv := range v.Cells {
		counts[cv.State]++
		ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue, cv.Score.Pressure, cv.ID)
		ch <- prometheus.MustNewConstMetric(c.weight, prometheus.GaugeValue, float64(cv.Weight.Published), cv.ID)
		ch <- prometheus.MustNewConstMetric(c.staleness, prometheus.GaugeValue, now-float64(cv.LastSeen.UnixNano())/1e9, cv.ID)
		ch <- prometheus.MustNewConstMetric(c.fallback, prometheus.GaugeValue, b2f(!cv.DCGM.OK), cv.ID, "dcgm")
		ch <- prometheus.MustNewConstMetric(c.fallback, prometheus.GaugeValue, b2f(!cv.VLLM.OK), cv.ID, "vllm")
		ch <- prometheus.MustNewConstMetric(c.penalty, prometheus.GaugeValue, cv.Weight.Penalty, cv.ID)
		if cv.RTTOK {
			ch <- prometheus.MustNewConstMetric(c.rtt, prometheus.GaugeValue, cv.RTT.Seconds(), cv.ID)
		}
		if cv.ClockSkewKnown {
			ch <- prometheus.MustNewConstMetric(c.skew, prometheus.GaugeValue, cv.ClockSkew.Seconds(), cv.ID)
		}
		for _, st := range lifecycle.States() {
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, b2f(cv.State == st), cv.ID, st.String())
		}
		for s := score.Signal(0); s < score.NumSignals; s++ {
			if cv.Score.Present[s] {
				ch <- prometheus.MustNewConstMetric(c.signal, prometheus.GaugeValue, cv.Score.Normalized[s], cv.ID, s.String())
			}
		}
	}
	for _, st := range lifecycle.States() {
		ch <- prometheus.MustNewConstMetric(c.cells, prometheus.GaugeValue, float64(counts[st]), st.String())
	}
}
