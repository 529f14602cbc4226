package election

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
)

// metrics are a candidate's instruments. FencedPut and FencedTxn reach them
// through the Leadership they are given.
type metrics struct {
	isLeader         prometheus.Gauge
	terms            prometheus.Counter
	leaderChanges    prometheus.Counter
	fencedRefused    prometheus.Counter
	campaignFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "isobar_election_is_leader",
			Help: "1 while this candidate holds a term of office, else 0.",
		}),
		terms: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_election_terms_total",
			Help: "Terms of office this candidate has won.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_election_leader_changes_total",
			Help: "Changes of the election's leader (identity or epoch, including to no leader) seen by this candidate while Run runs.",
		}),
		fencedRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_election_fenced_writes_refused_total",
			Help: "Fenced writes refused because the writer no longer led.",
		}),
		campaignFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_election_campaign_failures_total",
			Help: "Campaigns that ended in an error other than the caller's cancellation.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	// promreg unregisters what it registered when one fails.
	if err := promreg.Register(reg, m.isLeader, m.terms, m.leaderChanges, m.fencedRefused, m.campaignFailures); err != nil {
		return nil, fmt.Errorf("election: register metrics (one registry per candidate): %w", err)
	}
	return m, nil
}
