package wan

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Directions (label direction): forward is from the accepting side towards
// Target, reverse is Target's answers back.
const (
	dirForward = "forward"
	dirReverse = "reverse"
)

// Protocols (label proto).
const (
	protoTCP = "tcp"
	protoUDP = "udp"
)

// Reasons a UDP datagram is dropped (label reason).
const (
	dropPartition = "partition"
	dropQueueFull = "queue_full"
	dropReset     = "reset" // Reset or Stop
	dropIdle      = "idle"
	dropError     = "write_error"
)

// Results of a TCP connection or UDP session (label result).
const (
	connAccepted   = "accepted"
	connDialFailed = "dial_failed"
)

// metrics are the isobar_wan_* instruments. Proxies sharing a registry
// share the vectors (the second registration adopts the first's) and keep
// apart by their path and proto labels.
type metrics struct {
	bytes       *prometheus.CounterVec
	packets     *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	conns       *prometheus.CounterVec
	open        *prometheus.GaugeVec
	buffered    *prometheus.GaugeVec
	resets      *prometheus.CounterVec
	partitioned *prometheus.GaugeVec
	delay       *prometheus.GaugeVec
	jitter      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_wan_bytes_total",
			Help: "Bytes delivered through an emulated WAN path (TCP stream bytes, UDP payload bytes), by direction.",
		}, []string{"path", "proto", "direction"}),
		packets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_wan_packets_total",
			Help: "UDP datagrams delivered through an emulated WAN path, by direction.",
		}, []string{"path", "proto", "direction"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_wan_packets_dropped_total",
			Help: "UDP datagrams an emulated WAN path dropped, by direction and reason (partition, queue_full, reset, idle, write_error).",
		}, []string{"path", "proto", "direction", "reason"}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_wan_connections_total",
			Help: "TCP connections accepted (UDP client sessions opened) by an emulated WAN path, and dials of the target that failed.",
		}, []string{"path", "proto", "result"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_wan_connections_open",
			Help: "TCP connections (UDP client sessions) open through an emulated WAN path.",
		}, []string{"path", "proto"}),
		buffered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_wan_buffered_bytes",
			Help: "Bytes read and held in an emulated WAN path's delay line, not yet delivered, by direction.",
		}, []string{"path", "proto", "direction"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "isobar_wan_resets_total",
			Help: "Reset calls on an emulated WAN path (every open connection closed).",
		}, []string{"path", "proto"}),
		partitioned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_wan_partitioned",
			Help: "1 while an emulated WAN path is cut, else 0.",
		}, []string{"path", "proto"}),
		delay: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_wan_delay_seconds",
			Help: "One-way delay an emulated WAN path adds per direction.",
		}, []string{"path", "proto"}),
		jitter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isobar_wan_jitter_seconds",
			Help: "Half-width of the uniform jitter an emulated WAN path adds to its delay.",
		}, []string{"path", "proto"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.bytes, err = register(reg, m.bytes); err != nil {
		return nil, err
	}
	if m.packets, err = register(reg, m.packets); err != nil {
		return nil, err
	}
	if m.dropped, err = register(reg, m.dropped); err != nil {
		return nil, err
	}
	if m.conns, err = register(reg, m.conns); err != nil {
		return nil, err
	}
	if m.open, err = register(reg, m.open); err != nil {
		return nil, err
	}
	if m.buffered, err = register(reg, m.buffered); err != nil {
		return nil, err
	}
	if m.resets, err = register(reg, m.resets); err != nil {
		return nil, err
	}
	if m.partitioned, err = register(reg, m.partitioned); err != nil {
		return nil, err
	}
	if m.delay, err = register(reg, m.delay); err != nil {
		return nil, err
	}
	if m.jitter, err = register(reg, m.jitter); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector of the same description
// that another proxy registered before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if prev, ok := are.ExistingCollector.(C); ok {
			return prev, nil
		}
	}
	var zero C
	return zero, fmt.Errorf("wan: register metrics: %w", err)
}

// pathMetrics are one proxy's series.
type pathMetrics struct {
	conns, dialFailed       prometheus.Counter
	open                    prometheus.Gauge
	resets                  prometheus.Counter
	partitioned, delay, jit prometheus.Gauge
	m                       *metrics
	path, proto             string
}

// dirMetrics are one direction's series of a proxy.
type dirMetrics struct {
	bytes    prometheus.Counter
	packets  prometheus.Counter
	buffered prometheus.Gauge
	dropped  func(reason string) prometheus.Counter
}

func (m *metrics) forPath(path, proto string) *pathMetrics {
	return &pathMetrics{
		conns:       m.conns.WithLabelValues(path, proto, connAccepted),
		dialFailed:  m.conns.WithLabelValues(path, proto, connDialFailed),
		open:        m.open.WithLabelValues(path, proto),
		resets:      m.resets.WithLabelValues(path, proto),
		partitioned: m.partitioned.WithLabelValues(path, proto),
		delay:       m.delay.WithLabelValues(path, proto),
		jit:         m.jitter.WithLabelValues(path, proto),
		m:           m, path: path, proto: proto,
	}
}

func (pm *pathMetrics) dir(direction string) dirMetrics {
	d := dirMetrics{
		bytes:    pm.m.bytes.WithLabelValues(pm.path, pm.proto, direction),
		buffered: pm.m.buffered.WithLabelValues(pm.path, pm.proto, direction),
	}
	if pm.proto == protoUDP {
		d.packets = pm.m.packets.WithLabelValues(pm.path, pm.proto, direction)
		dropped := pm.m.dropped
		path, proto := pm.path, pm.proto
		d.dropped = func(reason string) prometheus.Counter {
			return dropped.WithLabelValues(path, proto, direction, reason)
		}
	}
	return d
}
