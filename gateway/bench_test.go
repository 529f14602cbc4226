package gateway

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/regional/xds"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// stubUpstream answers every completion at once with a small JSON body, so
// that what a benchmark measures is the proxying.
var stubUpstream = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":" hi","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
})

type benchEnv struct {
	client  *http.Client
	direct  string
	gateway string
}

// newBenchEnv serves model m on upstream (an address) through a gateway.
func newBenchEnv(b *testing.B, upstream string) *benchEnv {
	ctrl := startControl(b, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(b, "u", upstream, 1, 4096)))
	g := startGateway(b, ctrl, Config{MaxInflightPerEndpoint: 1024}, Deps{Logger: discardLogger()})
	tr := &http.Transport{MaxIdleConnsPerHost: 1024}
	b.Cleanup(tr.CloseIdleConnections)
	return &benchEnv{client: &http.Client{Transport: tr}, direct: "http://" + upstream + "/v1/completions", gateway: g.url + "/v1/completions"}
}

const benchBody = `{"model":"m","prompt":"The quick brown fox jumps over the lazy dog.","max_tokens":1}`

func (e *benchEnv) post(b *testing.B, url string) {
	resp, err := e.client.Post(url, "application/json", strings.NewReader(benchBody))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

func pct(ds []time.Duration, p float64) float64 {
	slices.Sort(ds)
	return float64(ds[int(p*float64(len(ds)-1))].Microseconds())
}

// benchLatency alternates direct and proxied requests, one at a time, and
// reports the percentiles of both and of the difference (the gateway's
// added latency).
func benchLatency(b *testing.B, e *benchEnv) {
	e.post(b, e.direct)
	e.post(b, e.gateway)
	var direct, proxied []time.Duration
	for b.Loop() {
		t0 := time.Now()
		e.post(b, e.direct)
		t1 := time.Now()
		e.post(b, e.gateway)
		direct, proxied = append(direct, t1.Sub(t0)), append(proxied, time.Since(t1))
	}
	b.ReportMetric(pct(direct, 0.5), "direct-p50-µs")
	b.ReportMetric(pct(direct, 0.99), "direct-p99-µs")
	b.ReportMetric(pct(proxied, 0.5), "gateway-p50-µs")
	b.ReportMetric(pct(proxied, 0.99), "gateway-p99-µs")
	b.ReportMetric(pct(proxied, 0.5)-pct(direct, 0.5), "added-p50-µs")
	b.ReportMetric(pct(proxied, 0.99)-pct(direct, 0.99), "added-p99-µs")
}

// benchThroughput sends requests from parallel clients and reports
// requests per second.
func benchThroughput(b *testing.B, url string, e *benchEnv) {
	e.post(b, url)
	b.SetParallelism(8)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.post(b, url)
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
}

// BenchmarkGatewayStub measures the gateway against an upstream that
// answers at once: added latency per request and throughput, against the
// same load sent directly.
func BenchmarkGatewayStub(b *testing.B) {
	e := newBenchEnv(b, startHTTPB(b, stubUpstream))
	b.Run("latency", func(b *testing.B) { benchLatency(b, e) })
	b.Run("throughput/direct", func(b *testing.B) { benchThroughput(b, e.direct, e) })
	b.Run("throughput/gateway", func(b *testing.B) { benchThroughput(b, e.gateway, e) })
}

// BenchmarkGatewaySim does the same against a simulated engine (tiny
// profile, 100x faster than real time, one output token).
func BenchmarkGatewaySim(b *testing.B) {
	eng := engine(b, model, 4096, nil, 0)
	e := newBenchEnv(b, eng.Addr())
	b.Run("latency", func(b *testing.B) { benchLatency(b, e) })
	b.Run("throughput/direct", func(b *testing.B) { benchThroughput(b, e.direct, e) })
	b.Run("throughput/gateway", func(b *testing.B) { benchThroughput(b, e.gateway, e) })
}

// BenchmarkPick is the load balancer's cost per pick on a cluster of 100
// weighted endpoints in 3 localities.
func BenchmarkPick(b *testing.B) {
	for _, mode := range []LBMode{LBXDS, LBRoundRobin, LBLeastRequest, LBIsobar} {
		b.Run(string(mode), func(b *testing.B) {
			p := &balancer{mode: mode, limit: 1 << 30, rand: globalRand{}, place: placement.DefaultConfig()}
			c := benchCluster(100, p)
			q := pickQuery{now: time.Now().UnixNano(), tokens: 500}
			for b.Loop() {
				h, _ := p.pick(c, q)
				h.st.release()
			}
		})
	}
}

func benchCluster(n int, pk *balancer) *clusterRT {
	var eps []xdsclient.Endpoint
	for i := range n {
		eps = append(eps, xdsclient.Endpoint{Cell: "c" + string(rune('a'+i%26)) + string(rune('0'+i/26)), Address: "10.0.0." + string(rune('0'+i%10)) + ":" + string(rune('1'+i%9)),
			Weight: uint32(1 + i%7), Region: []string{"r1", "r2", "r3"}[i%3], LocalityWeight: uint32(100 * (1 + i%3))})
	}
	hs := map[string]*hostState{}
	for _, e := range eps {
		if hs[e.Address] == nil {
			hs[e.Address] = &hostState{addr: e.Address}
		}
	}
	p := &xdsclient.ClusterPolicy{LBPolicy: "LEAST_REQUEST", LocalityWeighted: true, ChoiceCount: 2, ActiveRequestBias: 1}
	return buildCluster("c", p, eps, &clusterState{}, hs, "r1", map[string]struct{}{}, pk)
}

func startHTTPB(b *testing.B, h http.Handler) string {
	ln := listen(b, "127.0.0.1:0")
	srv := &http.Server{Handler: h}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	b.Cleanup(func() {
		_ = srv.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}
