package gateway

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

const model = "m"

// Endpoint weights 1:3 under the default policy (least-request, which
// with unequal weights is Envoy's EDF over weight/(active+1)): the split
// follows the weights, and the baselines ignore them.
func TestConformanceEndpointWeights(t *testing.T) {
	a, b := engine(t, model, 4096, nil, 0), engine(t, model, 4096, nil, 0)
	st := oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096), endpointOf(t, "b", b.Addr(), 3, 4096))
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	for _, tc := range []struct {
		lb    LBMode
		n     int
		conc  int
		wantA float64
		tol   float64
	}{
		// 2000 sequential requests: the EDF schedule follows the 1:3
		// weights exactly (every active count is 0 when a host is
		// re-added); ±3 pp leaves room for a request still counted in
		// flight when the next is picked.
		{LBXDS, 2000, 1, 0.25, 0.03},
		// The baselines split evenly whatever the weights (least-request
		// within ±6 pp at 1000 requests, sd 1.6 pp).
		{LBRoundRobin, 1000, 2, 0.5, 0.02},
		{LBLeastRequest, 1000, 2, 0.5, 0.06},
		// isobar: weights gate eligibility only; two identical engines
		// share the load by pending prompt tokens (ties at random).
		{LBIsobar, 1000, 2, 0.5, 0.06},
	} {
		t.Run(string(tc.lb), func(t *testing.T) {
			g := startGateway(t, ctrl, Config{LB: tc.lb}, Deps{})
			n := tc.n
			byEP, byStatus := g.spread(t, n, tc.conc, model, 40, nil)
			if byStatus[http.StatusOK] != n {
				t.Fatalf("statuses %v, want %d OK", byStatus, n)
			}
			got := share(byEP["a"], n)
			t.Logf("lb %s: a %.3f b %.3f", tc.lb, got, share(byEP["b"], n))
			if math.Abs(got-tc.wantA) > tc.tol {
				t.Errorf("lb %s: share of a = %.3f, want %.2f ± %.2f", tc.lb, got, tc.wantA, tc.tol)
			}
		})
	}
}

// regionState: model m served by local cells a and b (locality weight
// local) and by region r2's ingress (locality weight remote).
func regionState(t *testing.T, a, b, ingress string, local, remote uint32) xds.State {
	m := xds.Model{Name: model, Localities: []xds.Locality{
		{Region: "r1", Zone: "z1", Weight: local, Endpoints: []xds.Endpoint{
			endpointOf(t, "a", a, 1, 4096), endpointOf(t, "b", b, 1, 4096)}},
	}}
	if remote > 0 {
		m.Localities = append(m.Localities, xds.Locality{Region: "r2", Zone: "r2", Weight: remote,
			Endpoints: []xds.Endpoint{endpointOf(t, "region/r2", ingress, 1, 0)}})
	}
	return xds.State{Models: []xds.Model{m}}
}

// Locality weights (80/20 local vs remote) are followed, then a plan change
// (50/50); forwarded requests carry the hop header with this region, come
// back with the remote endpoint's identity, and requests carrying the hop
// header are served locally only.
func TestConformanceLocalityWeightsPlanChangeAndHop(t *testing.T) {
	a, b := engine(t, model, 4096, nil, 0), engine(t, model, 4096, nil, 0)
	ing := startIngress(t)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{Region: "r1"}, regionState(t, a.Addr(), b.Addr(), ing.addr, 800, 200))
	g := startGateway(t, ctrl, Config{Region: "r1", HopKey: testHopKey}, Deps{})

	const n = 2000
	check := func(what string, wantRemote, tol float64) {
		t.Helper()
		before, _ := ing.counts()
		byEP, byStatus := g.spread(t, n, 4, model, 40, nil)
		after, _ := ing.counts()
		if byStatus[http.StatusOK] != n {
			t.Fatalf("%s: statuses %v", what, byStatus)
		}
		remote := byEP[ing.addr]
		if remote != after-before {
			t.Errorf("%s: %d responses name the ingress, it served %d", what, remote, after-before)
		}
		t.Logf("%s: remote share %.3f (a %d, b %d)", what, share(remote, n), byEP["a"], byEP["b"])
		// Binomial sd at 2000 requests is about 1 pp.
		if got := share(remote, n); math.Abs(got-wantRemote) > tol {
			t.Errorf("%s: remote share %.3f, want %.2f ± %.2f", what, got, wantRemote, tol)
		}
	}
	check("plan 80/20", 0.2, 0.03)
	r := g.completion(t, model, 10, nil)
	_, hops := ing.counts()
	if hops["r1"] == 0 || len(hops) != 1 {
		t.Errorf("hop headers seen by the remote ingress = %v, want all r1", hops)
	}
	_ = r

	ctrl.push(regionState(t, a.Addr(), b.Addr(), ing.addr, 500, 500))
	check("plan 50/50", 0.5, 0.04)

	// A forwarded response names the ingress and its region, and passes on
	// the remote gateway's own endpoint header.
	eventually.True(t, testTimeout, "a response forwarded through the ingress", func() bool {
		r := g.completion(t, model, 10, nil)
		if r.endpoint != ing.addr {
			return false
		}
		if r.region != "r2" || r.header.Get(xdscontract.UpstreamEndpointHeader) != "far-cell" {
			t.Errorf("forwarded response headers: region %q upstream %q", r.region, r.header.Get(xdscontract.UpstreamEndpointHeader))
		}
		return true
	})

	// Requests that were forwarded to us are served here, never again
	// forwarded, even with the remote locality at 99 %.
	ctrl.push(regionState(t, a.Addr(), b.Addr(), ing.addr, 10, 990))
	before, _ := ing.counts()
	byEP, byStatus := g.spread(t, 300, 4, model, 40, provenHop(t, "r3"))
	after, _ := ing.counts()
	if after != before || byStatus[http.StatusOK] != 300 || byEP["a"]+byEP["b"] != 300 {
		t.Errorf("hop requests: ingress got %d, statuses %v, endpoints %v; want all 300 served by a and b", after-before, byStatus, byEP)
	}
}

// An endpoint removed from the assignment gets no request once the update
// is acknowledged.
func TestConformanceEndpointRemoval(t *testing.T) {
	a, b := engine(t, model, 4096, nil, 0), engine(t, model, 4096, nil, 0)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096), endpointOf(t, "b", b.Addr(), 1, 4096)))
	g := startGateway(t, ctrl, Config{}, Deps{})
	byEP, _ := g.spread(t, 100, 4, model, 40, nil)
	if byEP["a"] == 0 || byEP["b"] == 0 {
		t.Fatalf("before removal: %v, want both endpoints used", byEP)
	}
	ctrl.push(oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096)))
	byEP, byStatus := g.spread(t, 500, 4, model, 40, nil)
	if byEP["b"] != 0 || byStatus[http.StatusOK] != 500 {
		t.Errorf("after removal: endpoints %v statuses %v; want no request to b", byEP, byStatus)
	}
	// Its per-endpoint series are gone too.
	if v := g.metric(t, "isobar_gateway_upstream_requests_total", map[string]string{"endpoint": "b"}); v != 0 {
		t.Errorf("metrics still hold endpoint b: %v", v)
	}
}

// A model's shed share refuses about that share of client requests with a
// JSON 429; forwarded requests are never shed.
func TestConformanceShed(t *testing.T) {
	a := engine(t, model, 4096, nil, 0)
	st := oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096))
	st.Models[0].Shed = 0.3
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	g := startGateway(t, ctrl, Config{HopKey: testHopKey}, Deps{})
	const n = 1000
	_, byStatus := g.spread(t, n, 4, model, 40, nil)
	shed := byStatus[http.StatusTooManyRequests]
	t.Logf("shed %d of %d", shed, n)
	// Binomial sd at 1000 requests is 1.5 pp.
	if got := share(shed, n); math.Abs(got-0.3) > 0.05 || byStatus[http.StatusOK]+shed != n {
		t.Errorf("statuses %v: shed share %.3f, want 0.30 ± 0.05", byStatus, got)
	}
	if m := g.metric(t, "isobar_gateway_shed_total", map[string]string{"model": model, "reason": "fault"}); int(m) != shed {
		t.Errorf("shed metric %v, want %d", m, shed)
	}
	r := g.completion(t, model, 10, nil)
	for r.status != http.StatusTooManyRequests {
		r = g.completion(t, model, 10, nil)
	}
	var eb errorBody
	if err := json.Unmarshal([]byte(r.body), &eb); err != nil || eb.Error.Code != 429 || eb.Error.Type != "RateLimitError" ||
		r.header.Get("Content-Type") != "application/json" {
		t.Errorf("429 body %q (%v)", r.body, err)
	}
	if got := r.header.Get(xdscontract.ShedHeader); got != "plan" {
		t.Errorf("plan shed's %s header = %q, want plan", xdscontract.ShedHeader, got)
	}
	_, byStatus = g.spread(t, 300, 4, model, 40, provenHop(t, "r2"))
	if byStatus[http.StatusOK] != 300 {
		t.Errorf("forwarded requests: statuses %v, want all 300 served", byStatus)
	}
}

// Context-length classes: a prompt that does not fit a cell's
// max_model_len never reaches it, whether its size comes from the token
// header or from the body's length.
func TestConformanceContextClasses(t *testing.T) {
	small, big := engine(t, model, 4096, nil, 0), engine(t, model, 32768, nil, 0)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{},
		oneModel(model, endpointOf(t, "small", small.Addr(), 1, 4096), endpointOf(t, "big", big.Addr(), 1, 32768)))
	g := startGateway(t, ctrl, Config{}, Deps{})

	// Short prompts use both cells.
	byEP, byStatus := g.spread(t, 200, 4, model, 400, nil)
	if byStatus[http.StatusOK] != 200 || byEP["small"] == 0 || byEP["big"] == 0 {
		t.Fatalf("short prompts: %v %v, want both cells", byEP, byStatus)
	}
	// 6000-token prompts (24000 bytes, no token header): the body length
	// puts them in the 8192 class, which only big serves. The small cell
	// would answer 400.
	byEP, byStatus = g.spread(t, 200, 4, model, 24000, nil)
	if byStatus[http.StatusOK] != 200 || byEP["small"] != 0 {
		t.Errorf("long prompts by length: %v %v, want all 200 on big", byEP, byStatus)
	}
	// A short body announcing 5000 tokens goes by the header.
	byEP, _ = g.spread(t, 100, 4, model, 40, map[string]string{xdscontract.PromptTokensHeader: "5000"})
	if byEP["small"] != 0 || byEP["big"] != 100 {
		t.Errorf("token header 5000: %v, want all on big", byEP)
	}
	if n := g.metric(t, "isobar_gateway_upstream_requests_total", map[string]string{"endpoint": "small", "code": "4xx"}); n != 0 {
		t.Errorf("the small cell refused %v requests as too long", n)
	}
	// /v1/models lists the model with its largest context.
	resp, err := g.client.Get(g.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml modelList
	err = json.NewDecoder(resp.Body).Decode(&ml)
	resp.Body.Close()
	if err != nil || len(ml.Data) != 1 || ml.Data[0].ID != model || ml.Data[0].MaxModelLen != 32768 {
		t.Errorf("/v1/models = %+v (%v)", ml, err)
	}
}

// SSE streams pass through unbuffered: the first token reaches the client
// while the engine has not generated the last one.
func TestStreamingFirstTokenBeforeLast(t *testing.T) {
	const tokens = 200
	e := engine(t, model, 4096, nil, 1) // real time: 2 ms per step, ~0.4 s in all
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "a", e.Addr(), 1, 4096)))
	g := startGateway(t, ctrl, Config{}, Deps{})
	body := fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":%d,"stream":true}`, model, tokens)
	resp, err := g.client.Post(g.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var atFirst int64 = -1
	events := 0
	err = sseEvents(resp.Body, func(d string) bool {
		if atFirst < 0 {
			atFirst = e.Stats().GeneratedTokens
		}
		events++
		return d != "[DONE]"
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("engine had generated %d of %d tokens when the first reached the client", atFirst, tokens)
	if atFirst < 0 || atFirst >= tokens {
		t.Errorf("first event arrived after %d tokens, want before the last (%d)", atFirst, tokens)
	}
	if events != tokens+1 {
		t.Errorf("%d events, want %d tokens and [DONE]", events, tokens)
	}
	if n := g.metric(t, "isobar_gateway_ttft_seconds", map[string]string{"model": model}); n != 1 {
		t.Errorf("TTFT observations %v, want 1", n)
	}
}
