package cellagent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
)

// Label values of the source label.
const (
	srcVLLM   = "vllm"
	srcModels = "vllm_models"
	srcHealth = "health"
	srcDCGM   = "dcgm"
)

// metrics are the agent's Prometheus instruments. When several agents share
// one registry, wrap it per agent, e.g.
// prometheus.WrapRegistererWith(prometheus.Labels{"cell": id}, reg).
type metrics struct {
	scrapes        *prometheus.CounterVec
	scrapeDuration *prometheus.HistogramVec
	invalidValues  *prometheus.CounterVec
	sourceUp       *prometheus.GaugeVec
	windowRestarts prometheus.Counter
	heartbeatsSent prometheus.Counter
	refused        prometheus.Counter
	reconnects     prometheus.Counter
	commands       *prometheus.CounterVec
	engineEvents   *prometheus.CounterVec
	healthTimeouts prometheus.Counter
	state          *prometheus.GaugeVec
}

// newMetrics builds the instruments and registers them on reg unless it is
// nil. It fails when one is already registered there (two agents on one
// registry that does not tell them apart).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_cellagent_scrapes_total",
			Help: "Scrapes by source (vllm, vllm_models, health, dcgm) and result (ok, error).",
		}, []string{"source", "result"}),
		scrapeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "isobar_cellagent_scrape_duration_seconds",
			Help:    "Duration of scrapes by source.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"source"}),
		invalidValues: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_cellagent_invalid_values_total",
			Help: "Values dropped as invalid (NaN, infinite, negative, out of range) by source.",
		}, []string{"source"}),
		sourceUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_cellagent_source_up",
			Help: "1 when the last read of the source succeeded, else 0.",
		}, []string{"source"}),
		windowRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_cellagent_window_restarts_total",
			Help: "Signal windows restarted because vLLM counters went backwards (engine restarts).",
		}),
		heartbeatsSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_cellagent_heartbeats_sent_total",
			Help: "Heartbeats written to the controller stream.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_cellagent_heartbeats_refused_total",
			Help: "Heartbeats the controller refused (acks carrying an error).",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_cellagent_stream_reconnects_total",
			Help: "Heartbeat streams that ended and were opened again.",
		}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_cellagent_commands_total",
			Help: "Commands received from the controller.",
		}, []string{"command"}),
		engineEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_cellagent_engine_watch_events_total",
			Help: "Events of the persistent engine connection (closed, reset, dial_failed) that triggered an immediate health probe.",
		}, []string{"event"}),
		healthTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_cellagent_health_timeouts_tolerated_total",
			Help: "Engine /health probes that timed out while the engine still counted as up (fewer in a row than --health-timeouts).",
		}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_cellagent_lifecycle_state",
			Help: "1 for the lifecycle state the agent reports, 0 for the others.",
		}, []string{"state"}),
	}
	for _, s := range []string{srcVLLM, srcDCGM} {
		m.sourceUp.WithLabelValues(s)
	}
	if reg == nil {
		return m, nil
	}
	if err := promreg.Register(reg, m.scrapes, m.scrapeDuration, m.invalidValues, m.sourceUp, m.windowRestarts, m.heartbeatsSent, m.refused, m.reconnects, m.commands, m.engineEvents, m.healthTimeouts, m.state); err != nil {
		return nil, fmt.Errorf("cellagent: register metrics: %w", err)
	}
	return m, nil
}

func resultLabel(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
