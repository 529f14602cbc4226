package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/gateway/flowcontrol"
	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// heldUpstream records each request's tenant and criticality on arrival
// and holds it until released, one release per request.
type heldUpstream struct {
	mu      sync.Mutex
	order   []string
	release chan struct{}
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.order = append(u.order, r.Header.Get(xdscontract.TenantHeader)+"/"+r.Header.Get(xdscontract.CriticalityHeader))
	u.mu.Unlock()
	<-u.release
	_, _ = w.Write([]byte(`{"choices":[{"text":"ok"}]}`))
}

func (u *heldUpstream) arrived() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.order...)
}

// flowRig is a gateway whose one endpoint takes one request at a time.
type flowRig struct {
	t     *testing.T
	g     *testGateway
	up    *heldUpstream
	clock *clockwork.FakeClock
	wg    sync.WaitGroup
	mu    sync.Mutex
	codes map[string]*httptest.ResponseRecorder
}

func newFlowRig(t *testing.T, q flowcontrol.Config) *flowRig {
	return newFlowRigWith(t, Config{MaxInflightPerEndpoint: 1, Queue: q}, nil)
}

// newFlowRigWith is newFlowRig with cfg (its trusted sources set) and the
// endpoint as ep makes it (nil: as it is).
func newFlowRigWith(t *testing.T, cfg Config, ep func(*xds.Endpoint)) *flowRig {
	up := &heldUpstream{release: make(chan struct{})}
	addr := startHTTP(t, up)
	clock := clockwork.NewFakeClock()
	cfg.TrustedSources = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	r := &flowRig{t: t, g: unitGateway(t, cfg, Deps{Clock: clock}), up: up, clock: clock, codes: map[string]*httptest.ResponseRecorder{}}
	e := endpointOf(t, "a", addr, 1, 0)
	if ep != nil {
		ep(&e)
	}
	applyState(t, r.g, oneModel(model, e), nil)
	t.Cleanup(func() {
		close(up.release)
		r.wg.Wait()
	})
	return r
}

// send starts a request named name from remote with tenant and
// criticality; its answer is kept under name.
func (r *flowRig) send(name, remote, tenant, crit string) {
	r.wg.Go(func() {
		rec := r.g.serve(model, remote, map[string]string{xdscontract.TenantHeader: tenant, xdscontract.CriticalityHeader: crit})
		r.mu.Lock()
		r.codes[name] = rec
		r.mu.Unlock()
	})
}

func (r *flowRig) answer(name string) *httptest.ResponseRecorder {
	var rec *httptest.ResponseRecorder
	eventually.True(r.t, testTimeout, name+" answered", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		rec = r.codes[name]
		return rec != nil
	})
	return rec
}

func (r *flowRig) waiting(c reqclass.Criticality, n int) {
	eventually.True(r.t, testTimeout, "queue length", func() bool { return r.g.QueueState()[c].Waiting == n })
}

func (r *flowRig) arrivals(n int) []string {
	var got []string
	eventually.True(r.t, testTimeout, "upstream arrivals", func() bool { got = r.up.arrived(); return len(got) >= n })
	return got
}

// TestQueueTenantFairness: under saturation a tenant queueing five times
// as much as another gets one dispatch per round, like it.
func TestQueueTenantFairness(t *testing.T) {
	r := newFlowRig(t, flowcontrol.Config{})
	r.send("held", "", "noisy", "standard")
	r.arrivals(1)
	for i := range 5 {
		r.send("noisy"+string(rune('0'+i)), "", "noisy", "standard")
		r.waiting(reqclass.Standard, i+1)
	}
	r.send("quiet", "", "quiet", "standard")
	r.waiting(reqclass.Standard, 6)
	rec := httptest.NewRecorder()
	r.g.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/queue", nil))
	var view struct{ Bands []QueueBand }
	if err := json.Unmarshal(rec.Body.Bytes(), &view); err != nil || len(view.Bands) != reqclass.Count {
		t.Fatalf("/debug/queue: %v %s", err, rec.Body)
	}
	if b := view.Bands[reqclass.Standard]; b.Criticality != "standard" || b.Waiting != 6 || b.Tenants != 2 || b.MaxLen != 256 {
		t.Fatalf("/debug/queue standard band %+v", b)
	}
	if r.g.metric(t, "isobar_gateway_queue_requests", map[string]string{"criticality": "standard"}) != 6 {
		t.Error("queue gauge is not 6")
	}
	for i := range 6 {
		r.up.release <- struct{}{}
		r.arrivals(i + 2)
	}
	got := r.arrivals(7)
	if got[1] != "noisy/standard" || got[2] != "quiet/standard" {
		t.Fatalf("dispatch order %v: the quiet tenant must be served on its round-robin turn (second)", got)
	}
	r.up.release <- struct{}{}
	for _, n := range []string{"held", "noisy0", "quiet", "noisy4"} {
		if c := r.answer(n).Code; c != http.StatusOK {
			t.Errorf("%s: %d", n, c)
		}
	}
	if n := r.g.metric(t, "isobar_gateway_queue_outcomes_total", map[string]string{"criticality": "standard", "outcome": "dispatched"}); n != 6 {
		t.Errorf("dispatched counted %v, want 6", n)
	}
}

// TestQueueBoundsEvictionExpiry: a full band refuses (queue_full), a
// critical arrival into a full queue evicts the oldest sheddable
// (queue_evicted), dispatch takes critical first, and a request past its
// class's max age is answered queue_expired; each a 429 with Retry-After.
func TestQueueBoundsEvictionExpiry(t *testing.T) {
	q := flowcontrol.Config{MaxLen: [reqclass.Count]int{2, 2, 2}, MaxTotal: 3, MaxAge: [reqclass.Count]time.Duration{time.Second, time.Second, time.Second}}
	r := newFlowRig(t, q)
	const trusted, untrusted = "192.0.2.1:1", "203.0.113.9:1"
	r.send("held", "", "a", "standard")
	r.arrivals(1)
	r.send("shed1", "", "a", "sheddable")
	r.waiting(reqclass.Sheddable, 1)
	r.send("shed2", "", "b", "sheddable")
	r.waiting(reqclass.Sheddable, 2)
	r.send("shed3", "", "a", "sheddable")
	shed := func(name, cause string) {
		t.Helper()
		rec := r.answer(name)
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || rec.Header().Get(xdscontract.ShedHeader) != cause {
			t.Errorf("%s: %d retry-after %q shed %q, want 429 %s", name, rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get(xdscontract.ShedHeader), cause)
		}
	}
	shed("shed3", shedQueueFull)
	r.send("std", untrusted, "c", "critical") // untrusted: standard
	r.waiting(reqclass.Standard, 1)
	r.send("crit", trusted, "c", "critical") // the queue is full: evicts shed1
	r.waiting(reqclass.Critical, 1)
	shed("shed1", shedQueueEvicted)
	if r.g.QueueState()[reqclass.Sheddable].Waiting != 1 {
		t.Fatalf("queue %+v", r.g.QueueState())
	}
	// The held request ends: critical goes first.
	r.up.release <- struct{}{}
	if got := r.arrivals(2); got[1] != "c/critical" {
		t.Fatalf("arrivals %v: critical must be dispatched first", got)
	}
	// Past the max age the standard and sheddable waiters expire.
	r.clock.Advance(time.Second)
	r.send("late", "", "d", "sheddable") // its push also expires them, whichever comes first
	shed("std", shedQueueExpired)
	shed("shed2", shedQueueExpired)
	r.up.release <- struct{}{}
	r.up.release <- struct{}{}
	if c := r.answer("crit").Code; c != http.StatusOK {
		t.Errorf("critical: %d", c)
	}
	if c := r.answer("late").Code; c != http.StatusOK {
		t.Errorf("late: %d", c)
	}
	for _, o := range []struct{ crit, outcome string }{{"sheddable", "full"}, {"sheddable", "evicted"}, {"sheddable", "expired"}, {"standard", "expired"}} {
		if r.g.metric(t, "isobar_gateway_queue_outcomes_total", map[string]string{"criticality": o.crit, "outcome": o.outcome}) != 1 {
			t.Errorf("%s %s not counted once", o.crit, o.outcome)
		}
	}
}
