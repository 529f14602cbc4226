package regional

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// Every metric the controller exposes — its own, the xDS server's and the
// per-cell collector's — passes promlint and follows isobar_regional_*.
func TestMetricsLint(t *testing.T) {
	c, prom := startController(t, nil)
	cl := dialController(t, c.Addr(), nil)
	s := openStream(t, cl)
	if err := s.Send(heartbeat("lint", "127.0.0.1:4001", 2, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if !eventually.Wait(5*time.Second, func() bool { _, ok := c.Registry().View().Cell("lint"); return ok }) {
		t.Fatal("cell never reached the view")
	}
	mfs, err := prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		if !strings.HasPrefix(mf.GetName(), "isobar_regional_") {
			t.Errorf("metric %s outside isobar_regional_", mf.GetName())
		}
	}
	for _, want := range []string{
		"isobar_regional_projection_duration_seconds", "isobar_regional_xds_build_duration_seconds",
		"isobar_regional_heartbeats_total", "isobar_regional_cell_pressure", "isobar_regional_cell_weight",
		"isobar_regional_cell_heartbeat_staleness_seconds", "isobar_regional_cells",
	} {
		if !names[want] {
			t.Errorf("metric %s missing", want)
		}
	}
}

// A second set of instruments on one registry is an error, not a panic.
func TestNewMetricsRefusesADoubleRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(reg); err == nil {
		t.Fatal("second registration on one registry: no error")
	}
}
