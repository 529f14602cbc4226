package xds

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata golden files")

// TestMetricsExposition runs a fixed scenario (one good push, one refused
// push, one ADS client that fetches and ACKs EDS) and compares the whole
// exposition with testdata/metrics.golden. The fake clock never advances,
// so the build histogram is deterministic.
func TestMetricsExposition(t *testing.T) {
	ts := startServer(t, testConfig())
	v, err := ts.xds.Push(State{Models: []Model{fleet("m", 2)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.xds.Push(State{Models: []Model{{Name: ""}}}); err == nil {
		t.Fatal("empty model name accepted")
	}
	eds := newADSClient(t, dial(t, ts.addr), &core.Node{Id: "gw", UserAgentName: "isobar-gateway"}, resource.EndpointType)
	eds.fetch()
	if err := eds.c.Ack(); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ts.xds, resource.EndpointType, v)

	mfs, err := ts.reg.Gather()
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
	var got bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&got, mf); err != nil {
			t.Fatal(err)
		}
	}
	golden := filepath.Join("testdata", "metrics.golden")
	if *updateGolden {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("exposition differs from %s:\n--- got\n%s\n--- want\n%s", golden, got.Bytes(), want)
	}
}
