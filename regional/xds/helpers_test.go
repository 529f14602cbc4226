package xds

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

func ep(cell, host string, port, weight uint32) Endpoint {
	return Endpoint{CellID: cell, Host: host, Port: port, Weight: weight, MaxModelLen: 8192}
}

func local(eps ...Endpoint) Locality {
	return Locality{Weight: 1, Endpoints: eps}
}

// fleet returns a model with n endpoints in one local locality.
func fleet(name string, n int) Model {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = Endpoint{
			CellID:      fmt.Sprintf("cell-%04d", i),
			Host:        fmt.Sprintf("10.%d.%d.%d", i/65536, (i/256)%256, i%256),
			Port:        8000,
			Weight:      uint32(1 + i%100),
			MaxModelLen: 32768,
		}
	}
	return Model{Name: name, Localities: []Locality{{Weight: 100, Endpoints: eps}}}
}

func testConfig() Config { return Config{Region: "us-east", Zone: "us-east-1a"} }

// tLogHandler sends log records to t.Log and counts them by message.
type tLogHandler struct {
	t      testing.TB
	counts chan string
	attrs  []slog.Attr
}

func newTLogger(t testing.TB) (*slog.Logger, <-chan string) {
	ch := make(chan string, 1024)
	return slog.New(&tLogHandler{t: t, counts: ch}), ch
}

func (h *tLogHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *tLogHandler) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	h.t.Log(r.Level.String(), msg)
	select {
	case h.counts <- r.Message:
	default:
	}
	return nil
}

func (h *tLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &tLogHandler{t: h.t, counts: h.counts, attrs: append(h.attrs, as...)}
}

func (h *tLogHandler) WithGroup(string) slog.Handler { return h }

// metricValue reads a counter or gauge.
func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.GetCounter().GetValue()
	case d.Gauge != nil:
		return d.GetGauge().GetValue()
	}
	t.Fatalf("metric %v is neither a counter nor a gauge", m.Desc())
	return 0
}

// waitFor polls cond until it holds, failing the test after testTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, testTimeout, what, cond)
}
