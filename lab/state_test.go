package lab

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/completion"
	"github.com/isobar-mesh/isobar/sim"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// TestStateCountsTenantsAtEngines: the fleet state lists the residency
// config's pins and, per region, the requests that reached its engines by
// tenant, as the engines count them.
func TestStateCountsTenantsAtEngines(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet")
	}
	res := []byte(`{"sets": {"home": ["a"]}, "tenants": {"acme": "home"}}`)
	l, err := Start(context.Background(), Config{Regions: []string{"a"}, Cells: 2, TimeScale: 0.05, Fast: true, MaxTokens: 4,
		NoTraffic: true, ResidencyData: res}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	st := l.State()
	if !slices.Equal(st.Pinned["acme"], []string{"a"}) || len(st.Pinned) != 1 {
		t.Errorf("pinned %v: want acme → [a]", st.Pinned)
	}
	if n := st.Regions[0].TenantRequests["acme"]; n != 0 {
		t.Errorf("acme's requests before any: %d", n)
	}
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	c := completion.Client{HTTP: hc, Clock: clockwork.NewRealClock()}
	body, _ := json.Marshal(map[string]any{"model": sim.DefaultModel, "prompt": "abcd", "max_tokens": 2, "stream": true})
	for i, tenant := range []string{"acme", "acme", "beta", ""} {
		r := c.Send(context.Background(), completion.Request{URL: "http://" + l.Regions()[0].Gateway.Addr() + "/v1/completions", Body: body,
			Header: http.Header{xdscontract.TenantHeader: {tenant}}})
		if !r.OK {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	got := l.State().Regions[0].TenantRequests
	if got["acme"] != 2 || got["beta"] != 1 || len(got) != 2 {
		t.Errorf("tenant requests at region a's engines %v: want acme 2, beta 1", got)
	}
}
