// Package promreg is the one way isobar registers Prometheus collectors:
// every collector or an error, never a panic (client_golang's
// MustRegister panics; its Register takes one collector). It holds no
// state; its functions are safe for concurrent use as the registry is.
package promreg

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Register registers each of cs with reg. When one fails it unregisters
// those it had registered and returns that error, so a caller that gives
// up (or retries with another registry) leaves reg as it found it. A nil
// reg registers nothing.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}

// NewRuntime returns a fresh registry holding the Go runtime and process
// collectors: what a process serves on /metrics when its caller gave no
// registry.
func NewRuntime() (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	if err := Register(reg, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	return reg, nil
}
