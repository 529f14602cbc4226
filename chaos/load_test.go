package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// TestLoadRecordsEnd: every outcome carries its end, after its start, and
// the stream's TTFT between the two — the phase split (in flight at the
// injection or not) depends on it.
func TestLoadRecordsEnd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	l := StartLoad(context.Background(), LoadConfig{RPS: 200, Model: "m", MaxRequests: 5},
		[]Ingress{{Region: "a", Addr: strings.TrimPrefix(srv.URL, "http://")}}, nil)
	// The count is checked below, after Stop.
	eventually.Wait(10*time.Second, func() bool { done, _ := l.Progress(); return done == 5 })
	os, _ := l.Stop()
	if len(os) != 5 {
		t.Fatalf("%d outcomes, want 5", len(os))
	}
	for _, o := range os {
		if !o.OK || o.End.IsZero() || o.End.Before(o.Start) || o.TTFT <= 0 || o.Start.Add(o.TTFT).After(o.End) {
			t.Errorf("outcome %+v: want OK with start <= start+TTFT <= end", o)
		}
	}
}

// TestLoadTenantsAndRegionRPS: a load with tenants names each request's
// tenant in its header (drawn by share, the rest naming none), and a
// region's own rate overrides RPS (0: its clients send nothing).
func TestLoadTenantsAndRegionRPS(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get(xdscontract.TenantHeader)]++
		mu.Unlock()
		fmt.Fprint(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	const n = 200
	l := StartLoad(context.Background(), LoadConfig{RPS: 2000, Model: "m", MaxRequests: n, Tenants: map[string]float64{"acme-eu": 0.5},
		RegionRPS: map[string]float64{"b": 0}}, []Ingress{{Region: "a", Addr: addr}, {Region: "b", Addr: addr}}, nil)
	eventually.Wait(10*time.Second, func() bool { done, _ := l.Progress(); return done == n })
	os, _ := l.Stop()
	if len(os) != n {
		t.Fatalf("%d outcomes, want %d", len(os), n)
	}
	byTenant := map[string]int{}
	for _, o := range os {
		if o.Home != "a" {
			t.Fatalf("a request of region %s's clients, whose rate is 0", o.Home)
		}
		byTenant[o.Tenant]++
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["acme-eu"] != byTenant["acme-eu"] || seen[""] != byTenant[""] {
		t.Errorf("server saw tenants %v, outcomes say %v", seen, byTenant)
	}
	if f := float64(byTenant["acme-eu"]) / n; f < 0.35 || f > 0.65 {
		t.Errorf("%.2f of the requests named the tenant, want about 0.5", f)
	}
}
