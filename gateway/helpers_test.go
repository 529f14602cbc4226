package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/sim"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// testTimeout bounds every wait on a condition.
const testTimeout = 20 * time.Second

// tWriter sends log lines to t.Log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

var insecureDial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// fakeDataPlane is the controller's DataPlane service as the tests see it:
// it records every report and checks the stream's invariants.
type fakeDataPlane struct {
	isobarpb.UnimplementedDataPlaneServer
	t       testing.TB
	mu      sync.Mutex
	reports []*isobarpb.DataPlaneReport
	changed chan struct{}
}

func newFakeDataPlane(t testing.TB) *fakeDataPlane {
	return &fakeDataPlane{t: t, changed: make(chan struct{})}
}

func (f *fakeDataPlane) Report(s grpc.BidiStreamingServer[isobarpb.DataPlaneReport, isobarpb.DataPlaneAck]) error {
	for {
		rep, err := s.Recv()
		if err != nil {
			return nil
		}
		if rep.GetNode() == "" || rep.GetRegion() == "" || rep.GetAt() == nil || rep.GetIntervalSeconds() < 0 ||
			len(rep.GetEndpoints()) > maxReportEndpoints || len(rep.GetDemand()) > maxReportModels {
			f.t.Errorf("malformed report %v", rep)
		}
		f.mu.Lock()
		f.reports = append(f.reports, rep)
		close(f.changed)
		f.changed = make(chan struct{})
		f.mu.Unlock()
		if err := s.Send(&isobarpb.DataPlaneAck{}); err != nil {
			return nil
		}
	}
}

// totals sums the reports: endpoint counts by cell and demand by model.
func (f *fakeDataPlane) totals() (eps map[string]*isobarpb.EndpointStats, demand map[string]*isobarpb.ModelDemand, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	eps = map[string]*isobarpb.EndpointStats{}
	demand = map[string]*isobarpb.ModelDemand{}
	for _, r := range f.reports {
		for _, e := range r.GetEndpoints() {
			x := eps[e.GetCellId()]
			if x == nil {
				x = &isobarpb.EndpointStats{CellId: e.GetCellId(), Address: e.GetAddress()}
				eps[e.GetCellId()] = x
			}
			x.Requests += e.GetRequests()
			x.Errors += e.GetErrors()
			x.Rejected += e.GetRejected()
		}
		for _, d := range r.GetDemand() {
			x := demand[d.GetModel()]
			if x == nil {
				x = &isobarpb.ModelDemand{Model: d.GetModel()}
				demand[d.GetModel()] = x
			}
			x.Requests += d.GetRequests()
			x.Shed += d.GetShed()
		}
	}
	return eps, demand, len(f.reports)
}

// control is a regional controller stand-in: the real xds.Server and a
// fake DataPlane service on one gRPC server.
type control struct {
	t    testing.TB
	addr string
	xds  *xds.Server
	gs   *grpc.Server
	dp   *fakeDataPlane
	once sync.Once
	done chan struct{}
}

// startControl serves cfg on addr ("127.0.0.1:0" for a new port) and pushes
// st. It stops with the test.
func startControl(t testing.TB, addr string, cfg xds.Config, st xds.State) *control {
	t.Helper()
	if cfg.Region == "" {
		cfg.Region = "r1"
	}
	ln := listen(t, addr)
	xs, err := xds.NewServer(cfg, xds.Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c := &control{t: t, addr: ln.Addr().String(), xds: xs, gs: grpc.NewServer(), dp: newFakeDataPlane(t), done: make(chan struct{})}
	xs.Register(c.gs)
	isobarpb.RegisterDataPlaneServer(c.gs, c.dp)
	go func() {
		defer close(c.done)
		_ = c.gs.Serve(ln)
	}()
	if _, err := xs.Push(st); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	return c
}

func (c *control) stop() {
	c.once.Do(func() {
		c.xds.Stop()
		c.gs.Stop()
		<-c.done
	})
}

// push pushes st and waits until a client (the gateway) acknowledged it for
// clusters, endpoints and routes: the gateway applies a response before
// acknowledging it, so its table holds st afterwards.
func (c *control) push(st xds.State) {
	c.t.Helper()
	v, err := c.xds.Push(st)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.RouteType} {
		if err := c.xds.WaitForAck(ctx, typ, v); err != nil {
			c.t.Fatalf("version %s of %s not acknowledged: %v", v, typ, err)
		}
	}
}

// testGateway is a started gateway with its registry and an HTTP client.
type testGateway struct {
	*Gateway
	reg    *prometheus.Registry
	client *http.Client
	url    string
}

// startGateway starts a gateway against ctrl and waits until its table
// holds routes and the assignments of every cluster.
func startGateway(t testing.TB, ctrl *control, cfg Config, deps Deps) *testGateway {
	t.Helper()
	return startGatewayOn(t, ctrl, cfg, deps, listen(t, "127.0.0.1:0"))
}

// startGatewayOn is startGateway serving on ln.
func startGatewayOn(t testing.TB, ctrl *control, cfg Config, deps Deps, ln net.Listener) *testGateway {
	t.Helper()
	tg := launchGateway(t, ctrl, cfg, deps, ln)
	tg.waitTable(t, "initial configuration", func(tb *xdsclient.Table) bool { return tb.Ready() })
	return tg
}

// launchGateway starts a gateway against ctrl on ln, not waiting for its
// configuration.
func launchGateway(t testing.TB, ctrl *control, cfg Config, deps Deps, ln net.Listener) *testGateway {
	t.Helper()
	cfg.Controller = ctrl.addr
	if cfg.Region == "" {
		cfg.Region = "r1"
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 5 * time.Second // a failing test does not wait 30 s
	}
	reg := prometheus.NewRegistry()
	deps.Registerer, deps.Gatherer = reg, reg
	if deps.Logger == nil {
		deps.Logger = testLogger(t)
	}
	deps.DialOptions = insecureDial
	g, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background(), ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	t.Cleanup(tr.CloseIdleConnections)
	return &testGateway{Gateway: g, reg: reg, client: &http.Client{Transport: tr}, url: "http://" + g.Addr()}
}

func (g *testGateway) waitTable(t testing.TB, what string, cond func(*xdsclient.Table) bool) *xdsclient.Table {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	tb, err := g.WaitForTable(ctx, cond)
	if err != nil {
		t.Fatalf("gateway table: %s not reached: %v", what, err)
	}
	return tb
}

// result is one response as a test sees it.
type result struct {
	status   int
	endpoint string
	region   string
	body     string
	header   http.Header
}

// completion sends a non-streaming completion with a prompt of promptBytes
// bytes and the given extra headers.
func (g *testGateway) completion(t testing.TB, model string, promptBytes int, headers map[string]string) result {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, strings.Repeat("a", promptBytes))
	req, err := http.NewRequest(http.MethodPost, g.url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := g.client.Do(req)
	if err != nil {
		t.Errorf("POST /v1/completions: %v", err)
		return result{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("read response: %v", err)
	}
	return result{status: resp.StatusCode, endpoint: resp.Header.Get(xdscontract.EndpointHeader), region: resp.Header.Get(xdscontract.RegionHeader),
		body: string(b), header: resp.Header}
}

// spread sends n completions with conc workers and counts the responses by
// endpoint header and by status.
func (g *testGateway) spread(t testing.TB, n, conc int, model string, promptBytes int, headers map[string]string) (byEndpoint map[string]int, byStatus map[int]int) {
	t.Helper()
	byEndpoint, byStatus = map[string]int{}, map[int]int{}
	var mu sync.Mutex
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for range jobs {
				r := g.completion(t, model, promptBytes, headers)
				mu.Lock()
				byStatus[r.status]++
				if r.status == http.StatusOK {
					byEndpoint[r.endpoint]++
				}
				mu.Unlock()
			}
		})
	}
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	return byEndpoint, byStatus
}

// metric sums the samples of a metric family whose labels include want.
func (g *testGateway) metric(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue next
				}
			}
			sum += metricValue(m)
		}
	}
	return sum
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// engine starts a fast simulated vLLM engine (tiny profile, 100x faster
// than real time) serving model with maxLen context, stopped with the test.
func engine(t testing.TB, model string, maxLen int, prof *sim.Profile, scale float64) *sim.Engine {
	t.Helper()
	if scale == 0 {
		scale = 0.01
	}
	e, err := sim.NewEngine(sim.EngineConfig{Model: model, MaxModelLen: maxLen, Profile: sim.ProfileTiny, CustomProfile: prof,
		TimeScale: scale, Seed: 1}, sim.Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(listen(t, "127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := e.Stop(ctx); err != nil {
			t.Errorf("engine Stop: %v", err)
		}
	})
	return e
}

// endpointOf turns a started engine (or any host:port) into an xds
// endpoint.
func endpointOf(t testing.TB, cell, addr string, weight, maxLen uint32) xds.Endpoint {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var p uint32
	if _, err := fmt.Sscan(port, &p); err != nil {
		t.Fatal(err)
	}
	return xds.Endpoint{CellID: cell, Host: host, Port: p, Weight: weight, MaxModelLen: maxLen}
}

// oneModel is a state with one model whose local locality holds eps.
func oneModel(model string, eps ...xds.Endpoint) xds.State {
	return xds.State{Models: []xds.Model{{Name: model, Localities: []xds.Locality{{Region: "r1", Zone: "z1", Weight: 1000, Endpoints: eps}}}}}
}

// share is n/total as a fraction.
func share(n, total int) float64 { return float64(n) / float64(total) }

// sseEvents reads "data: " lines of an SSE body, calling fn for each until
// it returns false.
func sseEvents(r io.Reader, fn func(data string) bool) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && !fn(d) {
			return nil
		}
	}
	return sc.Err()
}

// fakeIngress stands in for another region's ingress gateway: it answers
// every completion itself and records the hop header it was sent.
type fakeIngress struct {
	srv    *http.Server
	addr   string
	mu     sync.Mutex
	n      int
	hops   map[string]int
	proofs []string
	done   chan struct{}
}

func startIngress(t testing.TB) *fakeIngress {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	f := &fakeIngress{addr: ln.Addr().String(), hops: map[string]int{}, done: make(chan struct{})}
	f.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		f.mu.Lock()
		f.n++
		f.hops[r.Header.Get("x-isobar-hop")]++
		f.proofs = append(f.proofs, r.Header.Values(xdscontract.HopAuthHeader)...)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(xdscontract.EndpointHeader, "far-cell")
		_, _ = io.WriteString(w, `{"id":"cmpl-remote","object":"text_completion","choices":[{"index":0,"text":"x"}]}`)
	})}
	go func() {
		defer close(f.done)
		_ = f.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = f.srv.Close()
		<-f.done
	})
	return f
}

func (f *fakeIngress) counts() (int, map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.hops {
		out[k] = v
	}
	return f.n, out
}

// proofList returns the hop proofs the ingress received.
func (f *fakeIngress) proofList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.proofs...)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testHopKey is the hop key of tests whose gateways take forwarded
// requests.
var testHopKey = []byte("0123456789abcdef0123456789abcdef")

// provenHop returns the headers of a request forwarded by region's gateway
// holding testHopKey, proven at the real clock's now (the proof stays
// valid for the default HopMaxSkew, longer than any test).
func provenHop(t testing.TB, region string) map[string]string {
	t.Helper()
	tok := hopAuth{key: testHopKey, skew: time.Minute}.token(region, time.Now())
	return map[string]string{xdscontract.DefaultHopHeader: region, xdscontract.HopAuthHeader: tok}
}
