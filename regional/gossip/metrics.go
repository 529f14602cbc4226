package gossip

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
)

// Reasons a received summary is refused (bad input: worth an alert) ...
const (
	refusedOversized      = "oversized"
	refusedUndecodable    = "undecodable"
	refusedUnknownSender  = "unknown_sender"
	refusedNotRegional    = "not_regional"
	refusedRegionMismatch = "region_mismatch"
	refusedBadSignature   = "bad_signature"
	refusedInvalid        = "invalid"
	refusedFuture         = "future"
	refusedNoIdentity     = "no_identity"
	refusedBadIdentity    = "bad_identity"
)

// ... or ignored (routine: gossip delivers the same summary several times).
const (
	ignoredDuplicate = "duplicate"
	ignoredStale     = "stale"
	ignoredOwn       = "own"
)

var (
	refusalReasons = []string{
		refusedOversized, refusedUndecodable, refusedUnknownSender, refusedNotRegional,
		refusedRegionMismatch, refusedBadSignature, refusedInvalid, refusedFuture,
		refusedNoIdentity, refusedBadIdentity,
	}
	ignoreReasons = []string{ignoredDuplicate, ignoredStale, ignoredOwn}
)

// metrics are the node's counters. Per-member and per-region values (member
// counts, RTT, summary age) are read from the book at scrape time by
// bookCollector, so departed regions disappear.
type metrics struct {
	received    prometheus.Counter
	applied     prometheus.Counter
	refused     *prometheus.CounterVec
	ignored     *prometheus.CounterVec
	badMeta     prometheus.Counter
	joins       *prometheus.CounterVec
	directSends *prometheus.CounterVec
	// coordRefused counts probe acks whose coordinate was refused.
	coordRefused *prometheus.CounterVec
}

// newMetrics builds the node's instruments and registers them on reg
// unless it is nil. It fails when one is already registered there (two
// nodes on one registry).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_gossip_summaries_received_total",
			Help: "Region summaries received from peers (broadcasts, direct sends and push-pull entries), whatever their fate.",
		}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_gossip_summaries_applied_total",
			Help: "Received region summaries that replaced an older one.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gossip_summaries_refused_total",
			Help: "Received region summaries refused as bad input, by reason.",
		}, []string{"reason"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gossip_summaries_ignored_total",
			Help: "Received region summaries ignored as routine (duplicate, stale, our own), by reason.",
		}, []string{"reason"}),
		badMeta: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "isobar_gossip_member_meta_invalid_total",
			Help: "Alive messages refused because the member's metadata does not decode.",
		}),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gossip_join_attempts_total",
			Help: "Attempts to join the seeds, by result.",
		}, []string{"result"}),
		directSends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gossip_direct_sends_total",
			Help: "Local summaries sent to one member over TCP (to new members, and summaries too large for a UDP gossip packet), by result.",
		}, []string{"result"}),
		coordRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_gossip_coordinates_refused_total",
			Help: "Network coordinates in probe acks refused (undecodable, invalid: outside the summary's bounds, rejected: the Vivaldi update refused it), by reason.",
		}, []string{"reason"}),
	}
	for _, r := range coordRefusalReasons {
		m.coordRefused.WithLabelValues(r)
	}
	for _, r := range refusalReasons {
		m.refused.WithLabelValues(r)
	}
	for _, r := range ignoreReasons {
		m.ignored.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "failed"} {
		m.joins.WithLabelValues(r)
		m.directSends.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	if err := promreg.Register(reg, m.received, m.applied, m.refused, m.ignored, m.badMeta, m.joins, m.directSends, m.coordRefused); err != nil {
		return nil, fmt.Errorf("gossip: register metrics: %w", err)
	}
	return m, nil
}

// bookCollector exports the book's per-role and per-region gauges.
type bookCollector struct {
	b       *book
	members *prometheus.Desc
	rtt     *prometheus.Desc
	age     *prometheus.Desc
}

func newBookCollector(b *book) *bookCollector {
	return &bookCollector{
		b: b,
		members: prometheus.NewDesc("isobar_gossip_members",
			"Alive members (this node included), by role.", []string{"role"}, nil),
		rtt: prometheus.NewDesc("isobar_gossip_rtt_seconds",
			"Smoothed probe round-trip time to each remote region with an alive member.", []string{"region"}, nil),
		age: prometheus.NewDesc("isobar_gossip_summary_age_seconds",
			"Time since the latest summary of each remote region was received.", []string{"region"}, nil),
	}
}

func (c *bookCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.members
	ch <- c.rtt
	ch <- c.age
}

func (c *bookCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.b.clock.Now()
	roles := map[string]int{RoleRegional: 0, RoleGlobal: 0}
	for _, m := range c.b.members() {
		if m.Alive && m.Role != "" {
			roles[m.Role]++
		}
	}
	for role, n := range roles {
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(n), role)
	}
	for region, d := range c.b.rtts() {
		ch <- prometheus.MustNewConstMetric(c.rtt, prometheus.GaugeValue, d.Seconds(), region)
	}
	for region, s := range c.b.summaries(false) {
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, now.Sub(s.ReceivedAt).Seconds(), region)
	}
}
