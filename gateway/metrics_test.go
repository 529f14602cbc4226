package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// Every exposed metric passes promlint and is named isobar_gateway_*, and
// /metrics and /health answer on the gateway's listener.
func TestMetricsAndHealth(t *testing.T) {
	a := engine(t, model, 4096, nil, 0)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096)))
	g := startGateway(t, ctrl, Config{}, Deps{})
	g.spread(t, 20, 2, model, 10, nil)
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		if !strings.HasPrefix(mf.GetName(), "isobar_gateway_") {
			t.Errorf("metric %s is not isobar_gateway_*", mf.GetName())
		}
	}
	for _, want := range []string{"isobar_gateway_requests_total", "isobar_gateway_upstream_requests_total", "isobar_gateway_ttft_seconds",
		"isobar_gateway_upstream_inflight_requests", "isobar_gateway_endpoint_ejected", "isobar_gateway_xds_config_version",
		"isobar_gateway_xds_config_age_seconds", "isobar_gateway_xds_connected", "isobar_gateway_reports_total"} {
		if !names[want] {
			t.Errorf("metric %s not exposed", want)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	if v := g.metric(t, "isobar_gateway_xds_connected", nil); v != 3 {
		t.Errorf("xds_connected sums to %v, want 3 streams up", v)
	}
	for path, want := range map[string]string{"/metrics": "isobar_gateway_requests_total", "/health": `"ok"`} {
		resp, err := g.client.Get(g.url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d %.200q", path, resp.StatusCode, b)
		}
	}
	// Chat completions go through too, the model taken from the body.
	resp, err := g.client.Post(g.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"chat.completion"`) || resp.Header.Get(xdscontract.EndpointHeader) != "a" {
		t.Errorf("chat completion: %d %q from %q", resp.StatusCode, b, resp.Header.Get(xdscontract.EndpointHeader))
	}
	// Bad bodies are refused before routing, with a reason.
	for _, body := range []string{`{"model":`, `{"model":7}`} {
		resp, err := g.client.Post(g.url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("body %q: %d, want 400", body, resp.StatusCode)
		}
	}
	if v := g.metric(t, "isobar_gateway_bad_requests_total", map[string]string{"reason": "malformed"}); v != 2 {
		t.Errorf("bad requests counted %v, want 2", v)
	}
}

// Before any configuration /health is 503 and requests get 503.
func TestHealthBeforeConfiguration(t *testing.T) {
	reg := prometheus.NewRegistry()
	g, err := New(Config{Controller: "127.0.0.1:1", Region: "r1", MaxBodyBytes: 64}, Deps{DialOptions: insecureDial, Logger: testLogger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background(), listen(t, "127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	if err := g.Start(context.Background(), listen(t, "127.0.0.1:0")); err != ErrAlreadyStarted {
		t.Errorf("second Start = %v", err)
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + g.Addr() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/health before configuration: %d", resp.StatusCode)
	}
	resp, err = c.Post("http://"+g.Addr()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("request before configuration: %d", resp.StatusCode)
	}
	resp, err = c.Post("http://"+g.Addr()+"/v1/completions", "application/json", strings.NewReader(strings.Repeat("x", 100)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d, want 413", resp.StatusCode)
	}
}
