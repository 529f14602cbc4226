package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// gatedUpstream answers every request with status, after holding first
// attempts until firstGate closes and retries until retryGate closes. It
// counts what it holds.
type gatedUpstream struct {
	status               int
	firstGate, retryGate chan struct{}
	firsts, retries      atomic.Int64 // arrived
	retriesHeld          atomic.Int64 // retries waiting now
	maxRetriesHeld       atomic.Int64
}

func (u *gatedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n, _ := strconv.Atoi(r.Header.Get(xdscontract.AttemptHeader))
	if n <= 1 {
		u.firsts.Add(1)
		<-u.firstGate
	} else {
		u.retries.Add(1)
		held := u.retriesHeld.Add(1)
		for {
			m := u.maxRetriesHeld.Load()
			if held <= m || u.maxRetriesHeld.CompareAndSwap(m, held) {
				break
			}
		}
		<-u.retryGate
		u.retriesHeld.Add(-1)
	}
	w.WriteHeader(u.status)
}

// startHTTP serves h on loopback until the test ends.
func startHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// Endpoints answering 503 cause no retry storm: concurrent retries stay
// within the cluster's budget (20 % of active requests, at least 3), and
// other models are still served meanwhile.
func TestRetryBudget(t *testing.T) {
	up := &gatedUpstream{status: http.StatusServiceUnavailable, firstGate: make(chan struct{}), retryGate: make(chan struct{})}
	var eps []xds.Endpoint
	for i := range 3 {
		eps = append(eps, endpointOf(t, "bad"+strconv.Itoa(i), startHTTP(t, up), 1, 0))
	}
	good := engine(t, "other", 4096, nil, 0)
	st := oneModel(model, eps...)
	st.Models = append(st.Models, oneModel("other", endpointOf(t, "good", good.Addr(), 1, 4096)).Models...)
	// Outlier detection out of the way: this test is about retries.
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{OutlierConsecutive5xx: 100000}, st)
	g := startGateway(t, ctrl, Config{}, Deps{})

	const clients = 50
	statuses := make(chan int, clients)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() { statuses <- g.completion(t, model, 10, nil).status })
	}
	eventually.True(t, testTimeout, "every first attempt to arrive", func() bool { return up.firsts.Load() == clients })
	close(up.firstGate)
	// Every first attempt failed with 503; each client's retry was either
	// admitted (and is now held upstream) or refused by the budget.
	decided := func() float64 {
		return g.metric(t, "isobar_gateway_retries_total", map[string]string{"model": model}) +
			g.metric(t, "isobar_gateway_retries_refused_total", map[string]string{"model": model})
	}
	eventually.True(t, testTimeout, "a retry decision for every client", func() bool { return decided() >= clients })
	admitted := int64(g.metric(t, "isobar_gateway_retries_total", map[string]string{"model": model}))
	eventually.True(t, testTimeout, "the admitted retries to reach the upstream", func() bool { return up.retriesHeld.Load() == admitted })
	t.Logf("%d clients failed at once: %d retries admitted, %d refused by the budget", clients, admitted, clients-admitted)
	// At most 20 % of the (at most 50) active requests, at least the
	// minimum of 3.
	if admitted > clients*20/100 || admitted < 3 {
		t.Errorf("%d concurrent retries admitted, want 3 to %d", admitted, clients*20/100)
	}
	// Other models are served while the retries hang.
	if r := g.completion(t, "other", 10, nil); r.status != http.StatusOK || r.endpoint != "good" {
		t.Errorf("other model during the storm: %d from %q", r.status, r.endpoint)
	}
	close(up.retryGate)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusServiceUnavailable {
			t.Errorf("client got %d, want the upstream's 503 relayed", s)
		}
	}
	total := up.retries.Load()
	if int64(g.metric(t, "isobar_gateway_retries_total", nil)) != total {
		t.Errorf("retry metric %v, upstream saw %d retries", g.metric(t, "isobar_gateway_retries_total", nil), total)
	}
	if up.maxRetriesHeld.Load() > clients*20/100 {
		t.Errorf("upstream saw %d concurrent retries", up.maxRetriesHeld.Load())
	}
	// No storm: without a budget 50 clients × 2 retries would send 100.
	if total > clients/2 {
		t.Errorf("%d retries sent for %d failing requests", total, clients)
	}
}

// Consecutive failures eject an endpoint for the base ejection time; it
// gets no traffic meanwhile and is re-admitted after. max_ejection_percent
// keeps a second failing endpoint in.
func TestOutlierEjectionAndReadmission(t *testing.T) {
	clock := clockwork.NewFakeClock()
	a, b, c := engine(t, model, 4096, nil, 0), engine(t, model, 4096, nil, 0), engine(t, model, 4096, nil, 0)
	// Envoy's enforcing_consecutive_5xx (isobar's clusters default to 0:
	// the controller owns 5xx ejection).
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{OutlierEnforcing5xx: 100}, oneModel(model,
		endpointOf(t, "a", a.Addr(), 1, 4096), endpointOf(t, "b", b.Addr(), 1, 4096), endpointOf(t, "c", c.Addr(), 1, 4096)))
	g := startGateway(t, ctrl, Config{}, Deps{Clock: clock})
	// 500 is not retried (the routes retry 503), so every failure reaches
	// the client and the outlier detector counts exactly those.
	a.SetErrorRate(1, http.StatusInternalServerError)
	sent := 0
	for g.metric(t, "isobar_gateway_ejections_total", map[string]string{"endpoint": "a"}) == 0 {
		if sent++; sent > 500 {
			t.Fatal("a was never ejected")
		}
		g.completion(t, model, 10, nil)
	}
	if fails := g.metric(t, "isobar_gateway_upstream_errors_total", map[string]string{"endpoint": "a", "reason": "5xx"}); fails != 5 {
		t.Errorf("a ejected after %v failures, want 5 (consecutive_5xx)", fails)
	}
	if g.metric(t, "isobar_gateway_endpoint_ejected", map[string]string{"endpoint": "a"}) != 1 {
		t.Error("ejected gauge of a is not 1")
	}
	byEP, byStatus := g.spread(t, 300, 4, model, 10, nil)
	if byEP["a"] != 0 || byStatus[http.StatusOK] != 300 {
		t.Errorf("while a is ejected: %v %v", byEP, byStatus)
	}
	// b fails too, but ejecting it would eject 2 of 3 (67 % > 50 %).
	b.SetErrorRate(1, http.StatusInternalServerError)
	for range 60 {
		g.completion(t, model, 10, nil)
	}
	if g.metric(t, "isobar_gateway_upstream_errors_total", map[string]string{"endpoint": "b"}) < 10 ||
		g.metric(t, "isobar_gateway_ejections_total", map[string]string{"endpoint": "b"}) != 0 {
		t.Errorf("b: %v failures, %v ejections; want many failures and no ejection (max_ejection_percent 50)",
			g.metric(t, "isobar_gateway_upstream_errors_total", map[string]string{"endpoint": "b"}),
			g.metric(t, "isobar_gateway_ejections_total", map[string]string{"endpoint": "b"}))
	}
	b.ClearFaults()
	a.ClearFaults()
	// Base ejection time 10 s (the xds default) later, a is back.
	clock.Advance(10*time.Second + time.Millisecond)
	byEP, _ = g.spread(t, 300, 4, model, 10, nil)
	if byEP["a"] == 0 {
		t.Errorf("a not re-admitted after the ejection time: %v", byEP)
	}
}

// When every endpoint is at its in-flight cap the gateway without flow
// control (NoQueue) answers 429 at once, and serves again when one frees
// up.
func TestSaturationAnswers429(t *testing.T) {
	up := &gatedUpstream{status: http.StatusOK, firstGate: make(chan struct{}), retryGate: make(chan struct{})}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "slow", startHTTP(t, up), 1, 0)))
	g := startGateway(t, ctrl, Config{MaxInflightPerEndpoint: 2, NoQueue: true}, Deps{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if r := g.completion(t, model, 10, nil); r.status != http.StatusOK {
				t.Errorf("held request: %d", r.status)
			}
		})
	}
	eventually.True(t, testTimeout, "two requests held upstream", func() bool { return up.firsts.Load() == 2 })
	r := g.completion(t, model, 10, nil)
	var eb errorBody
	if r.status != http.StatusTooManyRequests || json.Unmarshal([]byte(r.body), &eb) != nil || eb.Error.Code != 429 {
		t.Errorf("third request: %d %q, want a JSON 429", r.status, r.body)
	}
	if g.metric(t, "isobar_gateway_shed_total", map[string]string{"reason": "saturated"}) != 1 {
		t.Error("saturation shed not counted")
	}
	if g.metric(t, "isobar_gateway_upstream_inflight_requests", map[string]string{"endpoint": "slow"}) != 2 {
		t.Error("in-flight gauge of the endpoint is not 2")
	}
	close(up.firstGate)
	wg.Wait()
	if r := g.completion(t, model, 10, nil); r.status != http.StatusOK {
		t.Errorf("after the held requests: %d", r.status)
	}
}

// Without its controller the gateway keeps routing on its last
// configuration, and follows the controller again when it is back.
func TestLastConfigRetention(t *testing.T) {
	a, b := engine(t, model, 4096, nil, 0), engine(t, model, 4096, nil, 0)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096)))
	g := startGateway(t, ctrl, Config{}, Deps{})
	ctrl.stop()
	eventually.True(t, testTimeout, "the xDS streams to drop", func() bool { return g.metric(t, "isobar_gateway_xds_connected", nil) == 0 })
	byEP, byStatus := g.spread(t, 50, 2, model, 10, nil)
	if byStatus[http.StatusOK] != 50 || byEP["a"] != 50 {
		t.Errorf("controller gone: %v %v, want all served by a", byEP, byStatus)
	}
	ctrl2 := startControl(t, ctrl.addr, xds.Config{}, oneModel(model, endpointOf(t, "b", b.Addr(), 1, 4096)))
	g.waitTable(t, "the new controller's assignment", func(tb *xdsclient.Table) bool {
		eps := tb.Clusters[xdscontract.ClusterName(model)].Endpoints
		return len(eps) == 1 && eps[0].Cell == "b"
	})
	byEP, _ = g.spread(t, 50, 2, model, 10, nil)
	if byEP["b"] != 50 {
		t.Errorf("after reconnect: %v, want all on b", byEP)
	}
	_ = ctrl2
}

// Stop lets a request in flight finish, refuses new connections, and
// returns once everything has exited.
func TestGracefulStop(t *testing.T) {
	up := &gatedUpstream{status: http.StatusOK, firstGate: make(chan struct{}), retryGate: make(chan struct{})}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "slow", startHTTP(t, up), 1, 0)))
	g := startGateway(t, ctrl, Config{}, Deps{})
	got := make(chan result, 1)
	go func() { got <- g.completion(t, model, 10, nil) }()
	eventually.True(t, testTimeout, "the request upstream", func() bool { return up.firsts.Load() == 1 })
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		g.Stop()
	}()
	eventually.True(t, testTimeout, "the listener to close", func() bool {
		resp, err := (&http.Client{}).Get(g.url + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err != nil
	})
	select {
	case <-stopped:
		t.Fatal("Stop returned with a request in flight")
	default:
	}
	close(up.firstGate)
	if r := <-got; r.status != http.StatusOK {
		t.Errorf("in-flight request finished with %d", r.status)
	}
	<-stopped
	g.Stop() // idempotent
	if err := g.Start(context.Background(), listen(t, "127.0.0.1:0")); err != ErrStopped {
		t.Errorf("Start after Stop = %v, want ErrStopped", err)
	}
}

// A connect failure is retried on another endpoint: the client never sees
// it, and the dead endpoint is ejected after consecutive_local_origin_failure
// refusals in a row (split from upstream 5xx): 1 by the controller's
// default, 5 when configured so.
func TestRetryOnConnectFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after uint32
	}{{"default: eject on the first refusal", 0}, {"eject after 5", 5}} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.after
			if want == 0 {
				want = 1
			}
			dead := listen(t, "127.0.0.1:0")
			deadAddr := dead.Addr().String()
			dead.Close() // nothing listens there any more: connections are refused
			good := engine(t, model, 4096, nil, 0)
			ctrl := startControl(t, "127.0.0.1:0", xds.Config{OutlierConsecutiveLocalOrigin: tc.after}, oneModel(model,
				endpointOf(t, "dead", deadAddr, 1, 4096), endpointOf(t, "good", good.Addr(), 1, 4096)))
			g := startGateway(t, ctrl, Config{}, Deps{})
			byEP, byStatus := g.spread(t, 100, 2, model, 10, nil)
			if byStatus[http.StatusOK] != 100 || byEP["good"] != 100 {
				t.Errorf("%v %v, want every request served by good", byEP, byStatus)
			}
			connects := g.metric(t, "isobar_gateway_upstream_errors_total", map[string]string{"endpoint": "dead", "reason": "connect"})
			if connects < 1 || g.metric(t, "isobar_gateway_retries_total", nil) != connects {
				t.Errorf("%v connect failures, %v retries; want each failure retried", connects, g.metric(t, "isobar_gateway_retries_total", nil))
			}
			// Two requests in flight: one more failure may land after the last.
			ej := g.metric(t, "isobar_gateway_ejections_total", map[string]string{"endpoint": "dead"})
			if ej != 1 || connects < float64(want) || connects > float64(want)+1 {
				t.Errorf("dead endpoint: %v connect failures, %v ejections; want ejected after %d", connects, ej, want)
			}
		})
	}
}

// The route's timeout bounds a request: a silent endpoint yields 504, and
// a client that gives up is not held against the endpoint.
func TestRouteTimeoutAndClientCancel(t *testing.T) {
	clock := clockwork.NewFakeClock()
	up := &gatedUpstream{status: http.StatusOK, firstGate: make(chan struct{}), retryGate: make(chan struct{})}
	defer close(up.firstGate)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{RouteTimeout: 3 * time.Second}, oneModel(model, endpointOf(t, "silent", startHTTP(t, up), 1, 0)))
	g := startGateway(t, ctrl, Config{}, Deps{Clock: clock})
	got := make(chan result, 1)
	go func() { got <- g.completion(t, model, 10, nil) }()
	eventually.True(t, testTimeout, "the request upstream", func() bool { return up.firsts.Load() == 1 })
	clock.Advance(3 * time.Second)
	if r := <-got; r.status != http.StatusGatewayTimeout || r.endpoint != "silent" {
		t.Errorf("silent endpoint: %d from %q, want 504", r.status, r.endpoint)
	}
	if g.metric(t, "isobar_gateway_upstream_errors_total", map[string]string{"endpoint": "silent", "reason": "timeout"}) != 1 {
		t.Error("timeout not counted against the endpoint")
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x"}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := g.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	eventually.True(t, testTimeout, "the second request upstream", func() bool { return up.firsts.Load() == 2 })
	cancel()
	if err := <-errc; err == nil {
		t.Error("canceled request succeeded")
	}
	eventually.True(t, testTimeout, "the gateway to finish the canceled request", func() bool {
		return g.metric(t, "isobar_gateway_requests_total", map[string]string{"code": "4xx"}) == 1
	})
	if n := g.metric(t, "isobar_gateway_upstream_errors_total", nil); n != 1 {
		t.Errorf("%v upstream errors, want only the timeout", n)
	}
}
