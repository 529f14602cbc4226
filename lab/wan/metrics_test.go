package wan

import (
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestMetricsGolden runs one TCP and one UDP exchange through two paths
// sharing a registry, then compares the exposition with
// testdata/metrics.txt and lints it.
func TestMetricsGolden(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	srv := startEcho(t)
	e := startUDPEcho(t)
	p := newProxy(t, Config{Path: "a-b", Target: srv.addr()}, Deps{Registerer: reg})
	u := newUDPProxy(t, Config{Path: "a-b", Listen: p.Addr(), Target: e.addr()}, Deps{Registerer: reg})
	c := dial(t, p.Addr())
	roundTrip(t, c, []byte("hello"))
	_ = c.Close()
	eventually(t, "connection closed", func() bool { return p.OpenConns() == 0 })
	uc := dialUDP(t, u.Addr())
	udpRoundTrip(t, uc, []byte("abc"))
	eventually(t, "echo counted", func() bool { return value(u.revM.packets) == 1 })
	u.Partition(true)
	if _, err := uc.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "drop counted", func() bool { return value(u.fwdM.dropped(dropPartition)) == 1 })
	if err := p.SetDelay(20*time.Millisecond, 5*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	p.Reset()

	f, err := os.Open("testdata/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("promlint: %s: %s", pr.Metric, pr.Text)
	}
}
