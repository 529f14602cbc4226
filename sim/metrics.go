package sim

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
)

// Reasons a request body is refused, the values of
// isobar_sim_bad_requests_total's reason label.
const (
	reasonMalformed    = "malformed"
	reasonTooLarge     = "body_too_large"
	reasonUnknownModel = "unknown_model"
	reasonContextLen   = "context_too_long"
)

// metrics are the simulator's own metrics (isobar_sim_*), registered in
// Deps.Registerer with a const label engine=<EngineConfig.Name>. They are not
// part of the vLLM-compatible /metrics.
type metrics struct {
	badRequests    *prometheus.CounterVec
	injectedErrors prometheus.Counter
	kills          prometheus.Counter
	restarts       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		badRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_sim_bad_requests_total",
			Help: "Requests the simulated engine refused for bad input, by reason.",
		}, []string{"reason"}),
		injectedErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_sim_injected_errors_total",
			Help: "Completion requests failed on purpose by the errors fault.",
		}),
		kills: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_sim_engine_kills_total",
			Help: "Times the simulated engine was killed.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_sim_engine_restarts_total",
			Help: "Times the simulated engine was restarted after a kill.",
		}),
	}
	for _, r := range []string{reasonMalformed, reasonTooLarge, reasonUnknownModel, reasonContextLen} {
		m.badRequests.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	if err := promreg.Register(reg, m.badRequests, m.injectedErrors, m.kills, m.restarts); err != nil {
		return nil, err
	}
	return m, nil
}
