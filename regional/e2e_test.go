package regional_test

// End-to-end tests on loopback: simulated vLLM engines with their fake
// dcgm-exporter, real cellagents streaming heartbeats over gRPC to a real
// regional controller, and an independent xDS client (go-control-plane's
// ADS client, through xdsclient.Watcher) receiving the endpoint weights.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/cellagent"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/sim"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

type fleetOpts struct {
	cells int
	// heartbeat is the controller's (and so the agents') interval.
	heartbeat time.Duration
	ttlGrace  time.Duration
	window    time.Duration
	timeScale float64
	mutate    func(*regional.Config)
}

type fleet struct {
	t       *testing.T
	ctrl    *regional.Controller
	prom    *prometheus.Registry
	engines []*sim.Engine
	dcgm    *sim.DCGMExporter
	agents  []*cellagent.Agent
	watch   *xdsclient.Watcher
	client  *http.Client
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func cellID(i int) string { return fmt.Sprintf("cell-%d", i) }

func newFleet(t *testing.T, o fleetOpts) *fleet {
	t.Helper()
	if o.cells == 0 {
		o.cells = 3
	}
	if o.heartbeat == 0 {
		o.heartbeat = 100 * time.Millisecond
	}
	if o.ttlGrace == 0 {
		o.ttlGrace = o.heartbeat
	}
	if o.window == 0 {
		o.window = 2 * time.Second
	}
	if o.timeScale == 0 {
		o.timeScale = 0.2
	}
	f := &fleet{t: t, prom: prometheus.NewRegistry(), client: &http.Client{Timeout: 30 * time.Second}}
	ctx := context.Background()

	cfg := regional.DefaultConfig("r1")
	cfg.HeartbeatInterval = o.heartbeat
	cfg.TTLGrace = o.ttlGrace
	cfg.CycleInterval = 20 * time.Millisecond
	cfg.ProbeInterval = 100 * time.Millisecond
	cfg.Projection.MinInterval = 100 * time.Millisecond
	if o.mutate != nil {
		o.mutate(&cfg)
	}
	ctrl, err := regional.New(cfg, regional.Deps{Registerer: f.prom, GRPCListener: listen(t), HTTPListener: listen(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.ctrl = ctrl
	t.Cleanup(ctrl.Stop)

	f.dcgm = sim.NewDCGMExporter(sim.DCGMConfig{}, sim.Deps{})
	for i := range o.cells {
		eng, err := sim.NewEngine(sim.EngineConfig{Name: cellID(i), TimeScale: o.timeScale, GPUIndex: i, Seed: int64(i)}, sim.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.Start(listen(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = eng.Stop(sctx)
		})
		f.engines = append(f.engines, eng)
		f.dcgm.AddGPU(eng.GPU())
	}
	if err := f.dcgm.Start(listen(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = f.dcgm.Stop(sctx)
	})
	for i, eng := range f.engines {
		ag, err := cellagent.NewAgent(cellagent.Config{
			CellID: cellID(i), Region: "r1", ControllerAddr: ctrl.Addr(),
			VLLMURL: "http://" + eng.Addr() + "/metrics", DCGMURL: "http://" + f.dcgm.Addr() + "/metrics",
			DCGMGPU: fmt.Sprint(i), Interval: o.heartbeat, Window: o.window, ScrapeTimeout: 500 * time.Millisecond,
			BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		}, cellagent.Deps{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
		if err != nil {
			t.Fatal(err)
		}
		if err := ag.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ag.Stop)
		f.agents = append(f.agents, ag)
	}
	w, err := xdsclient.NewWatcher(xdsclient.WatchConfig{Server: ctrl.Addr(), NodeID: "e2e-client", MinBackoff: 20 * time.Millisecond},
		xdsclient.WatchDeps{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	f.watch = w
	// Every cell Ready and in the client's assignment.
	f.waitWeights("all cells assigned", 15*time.Second, func(ws map[string]uint32) bool {
		return len(ws) == o.cells
	})
	return f
}

// waitWeights waits until the xDS client's weights satisfy cond.
func (f *fleet) waitWeights(what string, limit time.Duration, cond func(map[string]uint32) bool) (map[string]uint32, time.Time) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	a, err := f.watch.WaitFor(ctx, func(a xdsclient.Assignment) bool { return cond(a.Weights()) })
	if err != nil {
		f.t.Fatalf("%s: not reached within %v; last weights %v; cells %s", what, limit, a.Weights(), f.describe())
	}
	return a.Weights(), a.At
}

func (f *fleet) describe() string {
	var b strings.Builder
	for _, c := range f.ctrl.Registry().View().Cells {
		fmt.Fprintf(&b, "[%s %s w=%d p=%.2f pen=%.2f fb=%v %q] ", c.ID, c.State, c.Weight.Published, c.Score.Pressure, c.Weight.Penalty, c.Fallback, c.Reason)
	}
	return b.String()
}

// counter sums a counter family from the controller's registry.
func (f *fleet) counter(name string) float64 {
	f.t.Helper()
	mfs, err := f.prom.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += metricValue(m)
		}
	}
	return sum
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

// complete sends one completion to an engine and returns the HTTP status.
func (f *fleet) complete(ctx context.Context, addr string, promptTokens, maxTokens int) (int, error) {
	body, _ := json.Marshal(map[string]any{
		"model": sim.DefaultModel, "prompt": strings.Repeat("abcd", promptTokens), "max_tokens": maxTokens,
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TestE2EWeightsIgnoreLoad: weights carry eligibility and capacity, not
// load (issue 13): a loaded cell's pressure rises in the view while its
// weight at the xDS client stays equal to its idle peers', and every
// resource is ACKed.
func TestE2EWeightsIgnoreLoad(t *testing.T) {
	f := newFleet(t, fleetOpts{})
	idle, _ := f.waitWeights("idle weights settle", 10*time.Second, func(ws map[string]uint32) bool {
		return ws[cellID(0)] == 100 && ws[cellID(1)] == 100 && ws[cellID(2)] == 100
	})
	t.Logf("idle weights: %v", idle)

	// Load cell-0 directly: 48 concurrent long generations, bounded in count
	// and time.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 48 {
		wg.Go(func() {
			for n := 0; n < 50 && ctx.Err() == nil; n++ {
				_, _ = f.complete(ctx, f.engines[0].Addr(), 1500, 256)
			}
		})
	}
	for {
		cv, _ := f.ctrl.Registry().View().Cell(cellID(0))
		other, _ := f.ctrl.Registry().View().Cell(cellID(1))
		if cv.Score.Pressure > other.Score.Pressure+0.1 {
			t.Logf("cell-0 pressure %.2f vs %.2f; %s", cv.Score.Pressure, other.Score.Pressure, f.describe())
			if cv.Weight.Published != other.Weight.Published || cv.Weight.Band != other.Weight.Band {
				t.Errorf("load moved cell-0's weight: %+v vs %+v", cv.Weight, other.Weight)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("cell-0's pressure never rose under load: %s", f.describe())
		}
		time.Sleep(10 * time.Millisecond) // polling the view, bounded above
	}
	cancel()
	wg.Wait()
	ws, _ := f.waitWeights("weights unchanged after the load", time.Second, func(ws map[string]uint32) bool {
		return ws[cellID(0)] == 100 && ws[cellID(1)] == 100 && ws[cellID(2)] == 100
	})
	t.Logf("weights after the load: %v", ws)
	if n := f.counter("isobar_regional_xds_nacks_total"); n != 0 {
		t.Errorf("xDS NACKs = %v, want 0", n)
	}
	if n := f.counter("isobar_regional_xds_acks_total"); n == 0 {
		t.Error("no xDS ACK counted")
	}
	if f.watch.Nacks() != 0 {
		t.Errorf("client refused %d updates", f.watch.Nacks())
	}
}

// TestE2EEngineDeath: an engine killed (its listener and connections gone at
// once, like SIGKILL) leaves the xDS client's assignment and is Failed; a
// cellagent that goes silent is Failed and removed, never before one TTL
// after its last heartbeat. The times are logged, not asserted (a loaded
// machine stretches them; the figures belong to the chaos drills).
func TestE2EEngineDeath(t *testing.T) {
	f := newFleet(t, fleetOpts{heartbeat: 500 * time.Millisecond, ttlGrace: 500 * time.Millisecond})

	killed := time.Now()
	f.engines[1].Kill()
	_, at := f.waitWeights("killed engine removed", 30*time.Second, func(ws map[string]uint32) bool {
		_, ok := ws[cellID(1)]
		return !ok && len(ws) == 2
	})
	t.Logf("engine kill → endpoint removed at the xDS client: %v", at.Sub(killed))
	cv, _ := f.ctrl.Registry().View().Cell(cellID(1))
	if cv.State != lifecycle.Failed {
		t.Errorf("killed cell state = %s (%s)", cv.State, cv.Reason)
	}

	// Silent agent: the engine keeps serving, the agent stops heartbeating.
	f.agents[2].Pause(true)
	ws, at := f.waitWeights("silent cell removed", 30*time.Second, func(ws map[string]uint32) bool {
		_, ok := ws[cellID(2)]
		return !ok
	})
	cv, _ = f.ctrl.Registry().View().Cell(cellID(2))
	sinceLast := at.Sub(cv.LastSeen)
	ttl := time.Second
	t.Logf("silent agent: removed %v after its last heartbeat (TTL %v); weights %v; reason %q", sinceLast, ttl, ws, cv.Reason)
	if cv.State != lifecycle.Failed {
		t.Errorf("silent cell state = %s", cv.State)
	}
	// Failed only once the TTL has passed (the upper side is load-bound).
	if sinceLast < ttl {
		t.Errorf("silent cell removed %v after its last heartbeat, before the TTL %v", sinceLast, ttl)
	}

	// Both come back.
	if err := f.engines[1].Restart(); err != nil {
		t.Fatal(err)
	}
	f.agents[2].Pause(false)
	f.waitWeights("cells recover", 10*time.Second, func(ws map[string]uint32) bool { return len(ws) == 3 })
}

// TestE2ECapabilityMismatch: a cell whose engine rejects long prompts (HTTP
// 400, max_model_len 1024 not advertised) is de-weighted by the error-rate
// signal alone, and recovers on probation once fixed.
func TestE2ECapabilityMismatch(t *testing.T) {
	f := newFleet(t, fleetOpts{mutate: func(c *regional.Config) {
		c.Projection.Penalty.BaseHold = 500 * time.Millisecond
		c.Projection.Penalty.ProbeSlot = 300 * time.Millisecond
		c.Projection.Penalty.ClearAfter = 2 * time.Second
	}})
	bad := f.engines[2]
	bad.SetMaxModelLen(1024, false) // nobody declared it: /v1/models still says 32768

	// Long prompts (1500 tokens) to every cell in turn, bounded.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	stop := make(chan struct{})
	for w := range 6 {
		wg.Go(func() {
			for n := 0; n < 2000 && ctx.Err() == nil; n++ {
				select {
				case <-stop:
					return
				default:
				}
				code, err := f.complete(ctx, f.engines[(w+n)%3].Addr(), 1500, 8)
				if err == nil {
					mu.Lock()
					statuses[code]++
					mu.Unlock()
				}
			}
		})
	}
	penalised, _ := f.waitWeights("mismatched cell de-weighted", 30*time.Second, func(ws map[string]uint32) bool {
		return ws[cellID(2)] <= 5 && ws[cellID(0)] >= 30 && ws[cellID(1)] >= 30
	})
	cv, _ := f.ctrl.Registry().View().Cell(cellID(2))
	t.Logf("penalised: weights %v; cell-2 error rate %.2f, trips %d, state %s, advertised max_model_len %d",
		penalised, cv.Signals.GetErrorRate(), cv.Weight.Trips, cv.State, cv.MaxModelLen)
	if cv.State != lifecycle.Ready || cv.Weight.Trips == 0 || cv.MaxModelLen != 32768 {
		t.Errorf("cell-2 should be Ready, penalised by error rate, with the undeclared limit: %+v", cv.Weight)
	}

	// Fixed: errors stop, the penalty decays and the cell is re-admitted.
	bad.SetMaxModelLen(32768, true)
	fixedAt := time.Now()
	f.waitWeights("fixed cell re-admitted", 30*time.Second, func(ws map[string]uint32) bool {
		return float64(ws[cellID(2)]) >= 0.5*float64(min(ws[cellID(0)], ws[cellID(1)]))
	})
	t.Logf("re-admitted %v after the fix; %s", time.Since(fixedAt).Round(time.Millisecond), f.describe())
	close(stop)
	cancel()
	wg.Wait()
	mu.Lock()
	t.Logf("responses: %v", statuses)
	if statuses[http.StatusBadRequest] == 0 {
		t.Error("the mismatched engine never answered 400")
	}
	mu.Unlock()
}

// TestE2EDCGMDown: with the exporter down the fallback flag is raised
// (the time it took is logged), scoring continues on the vLLM signals and no cell is
// dropped; it clears when the exporter returns.
func TestE2EDCGMDown(t *testing.T) {
	f := newFleet(t, fleetOpts{})
	if err := f.dcgm.SetDown(true); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	var took time.Duration
	for {
		v := f.ctrl.Registry().View()
		n := 0
		for _, c := range v.Cells {
			if c.Fallback && !c.DCGM.OK {
				n++
			}
		}
		if n == 3 {
			took = time.Since(down)
			break
		}
		if time.Since(down) > 30*time.Second {
			t.Fatalf("fallback not raised on every cell: %s", f.describe())
		}
		time.Sleep(5 * time.Millisecond) // polling the view, bounded above
	}
	t.Logf("DCGM down → fallback on every cell after %v (heartbeat 100 ms)", took)
	for _, c := range f.ctrl.Registry().View().Cells {
		if c.State != lifecycle.Ready || c.Weight.Published == 0 {
			t.Errorf("%s dropped while DCGM is down: %s w=%d", c.ID, c.State, c.Weight.Published)
		}
		if !c.Score.Present[0] {
			t.Errorf("%s: queue signal not scored while DCGM is down", c.ID)
		}
	}
	ws, _ := f.waitWeights("every cell still assigned", time.Second, func(ws map[string]uint32) bool { return len(ws) == 3 })
	t.Logf("weights while DCGM is down: %v", ws)
	if got := f.counter("isobar_regional_cell_fallback"); got < 3 {
		t.Errorf("isobar_regional_cell_fallback sums to %v, want ≥ 3", got)
	}

	if err := f.dcgm.SetDown(false); err != nil {
		t.Fatal(err)
	}
	if !eventually.Wait(5*time.Second, func() bool {
		n := 0
		for _, c := range f.ctrl.Registry().View().Cells {
			if !c.Fallback {
				n++
			}
		}
		return n == 3
	}) {
		t.Fatalf("fallback not cleared: %s", f.describe())
	}
}
