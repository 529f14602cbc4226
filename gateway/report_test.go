package gateway

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/reqclass"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// Reports carry per-endpoint deltas (requests, errors, rejections) and the
// client-originated demand per model with its shed count; Stop sends what
// is left.
func TestReportsDeltasAndFinalFlush(t *testing.T) {
	ok, bad := engine(t, model, 4096, nil, 0), engine(t, model, 4096, nil, 0)
	bad.SetErrorRate(1, http.StatusInternalServerError) // not retried
	st := oneModel(model, endpointOf(t, "ok", ok.Addr(), 1, 4096), endpointOf(t, "bad", bad.Addr(), 1, 4096))
	st.Models[0].Shed = 0.25
	// Outlier detection off, so that both cells keep receiving.
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{OutlierConsecutive5xx: 100000}, st)
	// One report per hour: only Stop's final report goes out.
	g := startGateway(t, ctrl, Config{ReportInterval: time.Hour, HopKey: testHopKey}, Deps{})
	_, client := g.spread(t, 200, 4, model, 10, nil)
	_, forwarded := g.spread(t, 50, 4, model, 10, provenHop(t, "r2"))
	// With a single model the catch-all takes any model name: the engine
	// refuses it (404), a rejection of that endpoint.
	rejected := uint64(0)
	if r := g.completion(t, "nope", 10, map[string]string{"x-isobar-model": "nope"}); r.status == http.StatusTooManyRequests {
		client[http.StatusTooManyRequests]++ // shed before reaching an engine
	} else if r.status == http.StatusNotFound {
		rejected = 1
	} else {
		t.Errorf("unknown model: %d, want the engine's 404", r.status)
	}
	if _, _, n := ctrl.dp.totals(); n != 0 {
		t.Fatalf("%d reports before the first interval", n)
	}
	g.Stop()
	eps, demand, n := ctrl.dp.totals()
	if n != 1 {
		t.Fatalf("%d reports after Stop, want the final one", n)
	}
	d := demand[model]
	if d == nil || d.GetRequests() != 201 || d.GetShed() != uint64(client[http.StatusTooManyRequests]) || len(demand) != 1 {
		t.Errorf("demand %v, want %s: 201 requests, %d shed (forwarded ones not counted)", demand, model, client[http.StatusTooManyRequests])
	}
	served := 201 - client[http.StatusTooManyRequests] + 50 // forwarded requests are never shed
	if got := eps["ok"].GetRequests() + eps["bad"].GetRequests(); int(got) != served {
		t.Errorf("endpoint requests %d, want %d", got, served)
	}
	if eps["ok"].GetRejected()+eps["bad"].GetRejected() != rejected ||
		eps["bad"].GetErrors() != eps["bad"].GetRequests()-eps["bad"].GetRejected() || eps["ok"].GetErrors() != 0 || eps["bad"].GetRequests() == 0 {
		t.Errorf("endpoint errors: ok %v, bad %v", eps["ok"], eps["bad"])
	}
	if eps["ok"].GetAddress() != ok.Addr() {
		t.Errorf("endpoint address %q, want %q", eps["ok"].GetAddress(), ok.Addr())
	}
	_ = forwarded
}

// Reports go out every interval on the injected clock, each covering the
// time since the previous one.
func TestReportsPeriodic(t *testing.T) {
	clock := clockwork.NewFakeClock()
	e := engine(t, model, 4096, nil, 0)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "a", e.Addr(), 1, 4096)))
	g := startGateway(t, ctrl, Config{ReportInterval: time.Second}, Deps{Clock: clock})
	for i := 1; i <= 3; i++ {
		g.spread(t, 10, 2, model, 10, nil)
		// The report ticker is the one timer waiting on the clock.
		ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
		err := clock.BlockUntilContext(ctx, 1)
		cancel()
		if err != nil {
			t.Fatalf("the report ticker never waited on the clock: %v", err)
		}
		clock.Advance(time.Second)
		eventually.True(t, testTimeout, fmt.Sprintf("report %d", i), func() bool { _, _, n := ctrl.dp.totals(); return n >= i })
	}
	ctrl.dp.mu.Lock()
	reps := append([]*isobarpb.DataPlaneReport(nil), ctrl.dp.reports...)
	ctrl.dp.mu.Unlock()
	for i, r := range reps {
		if r.GetIntervalSeconds() != 1 || r.GetNode() != "isobar-gateway-r1" || r.GetRegion() != "r1" {
			t.Errorf("report %d: interval %v node %q region %q", i, r.GetIntervalSeconds(), r.GetNode(), r.GetRegion())
		}
		if len(r.GetDemand()) != 1 || r.GetDemand()[0].GetRequests() != 10 {
			t.Errorf("report %d demand %v, want 10 requests", i, r.GetDemand())
		}
	}
}

// The reporter keeps what does not fit a report, and what a failed send
// took, for the next one.
func TestReporterCapsAndUndo(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m, err := newMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newReporter(Config{NodeID: "n", Region: "r", ReportInterval: time.Second}.withDefaults(), clock, testLogger(t), m)
	for i := range maxReportEndpoints + 10 {
		h := &hostRT{ep: xdsclient.Endpoint{Cell: fmt.Sprintf("c%05d", i), Address: "10.0.0.1:1"}}
		r.addEndpoint(h, i%2 == 0, false)
	}
	for i := range maxReportModels + 3 {
		r.addDemand(fmt.Sprintf("m%03d", i), nil)
	}
	clock.Advance(2 * time.Second)
	rep, undo := r.take()
	if len(rep.GetEndpoints()) != maxReportEndpoints || len(rep.GetDemand()) != maxReportModels || rep.GetIntervalSeconds() != 2 {
		t.Fatalf("first report: %d endpoints, %d models, interval %v", len(rep.GetEndpoints()), len(rep.GetDemand()), rep.GetIntervalSeconds())
	}
	undo() // the send failed
	clock.Advance(time.Second)
	rep, _ = r.take()
	if len(rep.GetEndpoints()) != maxReportEndpoints || rep.GetIntervalSeconds() != 3 || rep.GetEndpoints()[0].GetErrors() != 1 {
		t.Fatalf("after undo: %d endpoints, interval %v, first %v", len(rep.GetEndpoints()), rep.GetIntervalSeconds(), rep.GetEndpoints()[0])
	}
	rep, _ = r.take()
	if len(rep.GetEndpoints()) != 10 || len(rep.GetDemand()) != 3 || rep.GetIntervalSeconds() != 0 {
		t.Fatalf("remainder: %d endpoints, %d models", len(rep.GetEndpoints()), len(rep.GetDemand()))
	}
}

// A model's demand is reported by (criticality, residency set), the
// slices adding up to the model's requests, at most maxReportSlices per
// model (pinned ones past the bound counted in their criticality's
// unpinned slice), and a failed send puts the slices back.
func TestReporterSlices(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m, err := newMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newReporter(Config{NodeID: "n", Region: "r", ReportInterval: time.Second}.withDefaults(), clock, testLogger(t), m)
	r.addDemand("m", &classOf{crit: reqclass.Critical, set: "eu"})
	r.addDemand("m", &classOf{crit: reqclass.Critical, set: "eu"})
	r.addShed("m", &classOf{crit: reqclass.Critical, set: "eu"})
	r.addDemand("m", &classOf{crit: reqclass.Sheddable})
	r.addShed("m", &classOf{crit: reqclass.Sheddable})
	r.addDemand("m", nil)
	for i := range 100 {
		r.addDemand("m", &classOf{crit: reqclass.Standard, set: fmt.Sprintf("s%03d", i)})
	}
	rep, undo := r.take()
	check := func(rep *isobarpb.DataPlaneReport) {
		t.Helper()
		d := rep.GetDemand()[0]
		if len(d.GetSlices()) > maxReportSlices {
			t.Fatalf("%d slices", len(d.GetSlices()))
		}
		var sum, shed uint64
		for _, s := range d.GetSlices() {
			sum += s.GetRequests()
			shed += s.GetShed()
		}
		if sum != d.GetRequests() || d.GetRequests() != 104 || shed != d.GetShed() || shed != 2 {
			t.Fatalf("slices add to %d/%d, model %d/%d", sum, shed, d.GetRequests(), d.GetShed())
		}
		first := d.GetSlices()[0]
		if first.GetCriticality() != isobarpb.Criticality_CRITICALITY_CRITICAL || first.GetResidency() != "eu" || first.GetRequests() != 2 || first.GetShed() != 1 {
			t.Fatalf("first slice %v", first)
		}
	}
	check(rep)
	undo()
	rep, _ = r.take()
	check(rep)
}
