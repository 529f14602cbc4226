package sim

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestOwnMetricsLint runs promlint over the isobar_sim_* metrics.
func TestOwnMetricsLint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e, err := NewEngine(EngineConfig{}, Deps{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewAdminHandler(AdminConfig{Token: testToken}, Deps{Registerer: reg}, e, nil); err != nil {
		t.Fatal(err)
	}
	e.m.kills.Inc()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	if n, _ := testutil.GatherAndCount(reg, "isobar_sim_engine_kills_total"); n != 1 {
		t.Fatalf("kills series = %d", n)
	}
}
