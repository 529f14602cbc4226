package gateway

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A pushed policy the gateway does not know is accepted as ROUND_ROBIN,
// with a warning and isobar_gateway_lb_policy_fallbacks_total.
func TestUnknownPolicyFallsBackToRoundRobin(t *testing.T) {
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	g, err := New(Config{Controller: "127.0.0.1:1", Region: "r1"},
		Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg, Gatherer: reg, DialOptions: insecureDial})
	if err != nil {
		t.Fatal(err)
	}
	rs := []*anypb.Any{
		mustAny(t, edsCluster("known", func(c *cluster.Cluster) { c.LbPolicy = cluster.Cluster_LEAST_REQUEST })),
		mustAny(t, edsCluster("hashed", func(c *cluster.Cluster) { c.LbPolicy = cluster.Cluster_MAGLEV })),
	}
	if err := g.apply(0, rs, "1"); err != nil {
		t.Fatalf("the CDS update was refused: %v", err)
	}
	tg := &testGateway{Gateway: g, reg: reg}
	if n := tg.metric(t, "isobar_gateway_lb_policy_fallbacks_total", nil); n != 1 {
		t.Errorf("isobar_gateway_lb_policy_fallbacks_total = %v, want 1", n)
	}
	if p := g.Table().Clusters["hashed"].Policy; p.LBPolicy != xdsclient.LBRoundRobin || p.LBFallbackFrom != "MAGLEV" {
		t.Errorf("hashed cluster policy %q (fallback from %q), want ROUND_ROBIN from MAGLEV", p.LBPolicy, p.LBFallbackFrom)
	}
	if p := g.Table().Clusters["known"].Policy; p.LBPolicy != xdsclient.LBLeastRequest || p.LBFallbackFrom != "" {
		t.Errorf("known cluster policy %q (fallback from %q), want LEAST_REQUEST", p.LBPolicy, p.LBFallbackFrom)
	}
	if s := logs.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "cluster=hashed") || !strings.Contains(s, "pushed=MAGLEV") {
		t.Errorf("no warning naming the cluster and the pushed policy in the log:\n%s", s)
	}
}

// holdingUpstream holds every request until release closes, counting
// arrivals, then answers 200 with one byte.
type holdingUpstream struct {
	release chan struct{}
	mu      sync.Mutex
	arrived int
}

func (u *holdingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = r.Body.Read(make([]byte, 1))
	u.mu.Lock()
	u.arrived++
	u.mu.Unlock()
	<-u.release
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("x"))
}

func (u *holdingUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.arrived
}

// With --lb isobar against real upstreams the gateway counts each
// endpoint's pending prompt tokens itself and sends a request to the one
// with fewer, all else (requests in flight) equal.
func TestGatewayIsobarPicksFewerPendingTokens(t *testing.T) {
	ups := []*holdingUpstream{{release: make(chan struct{})}, {release: make(chan struct{})}}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model,
		endpointOf(t, "a", startHTTP(t, ups[0]), 1, 0), endpointOf(t, "b", startHTTP(t, ups[1]), 1, 0)))
	// A prefill rate of 1 token/s: the held prompts' head progress
	// (placement.HeadProgress) stays negligible however slow the machine.
	pc := placement.DefaultConfig()
	pc.DefaultPrefillTokensPerSecond = 1
	g := startGateway(t, ctrl, Config{LB: LBIsobar, Placement: pc}, Deps{Rand: newLockedRand(11, 12)})
	var wg sync.WaitGroup
	results := make([]result, 3)
	send := func(i, promptBytes int) {
		wg.Go(func() { results[i] = g.completion(t, model, promptBytes, nil) })
	}
	arrived := func() int { return ups[0].count() + ups[1].count() }
	send(0, 40000) // ~10,000 tokens pending on the endpoint it reaches
	eventually.True(t, testTimeout, "the long prompt held upstream", func() bool { return arrived() == 1 })
	long := 0
	if ups[1].count() == 1 {
		long = 1
	}
	send(1, 40) // to the other endpoint: fewer pending tokens and fewer in flight
	eventually.True(t, testTimeout, "the short prompt held upstream", func() bool { return arrived() == 2 })
	if ups[1-long].count() != 1 {
		t.Fatalf("the second request joined the long prompt's endpoint (arrivals %d, %d)", ups[0].count(), ups[1].count())
	}
	// One request in flight on each: only the pending tokens differ.
	send(2, 40)
	eventually.True(t, testTimeout, "the third request held upstream", func() bool { return arrived() == 3 })
	if ups[1-long].count() != 2 {
		t.Errorf("the third request went to the endpoint with ~10,000 pending tokens (arrivals %d, %d)", ups[0].count(), ups[1].count())
	}
	labels := []string{"a", "b"}
	if n := g.metric(t, "isobar_gateway_upstream_pending_prompt_tokens", map[string]string{"endpoint": labels[long]}); n < 10000 {
		t.Errorf("pending prompt tokens of %s = %v, want the long prompt's ≥ 10,000", labels[long], n)
	}
	for _, u := range ups {
		close(u.release)
	}
	wg.Wait()
	for i, r := range results {
		if r.status != http.StatusOK {
			t.Errorf("request %d: status %d", i, r.status)
		}
	}
	for _, l := range labels {
		if n := g.metric(t, "isobar_gateway_upstream_pending_prompt_tokens", map[string]string{"endpoint": l}); n != 0 {
			t.Errorf("pending prompt tokens of %s after every answer = %v, want 0", l, n)
		}
	}
}

// Through the gateway, a bad x-isobar-prompt-tokens header is replaced by
// the body estimate in the endpoint's pending count; a sane one is used.
func TestGatewayBadPromptHeaderUsesBodyEstimate(t *testing.T) {
	up := &holdingUpstream{release: make(chan struct{})}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "a", startHTTP(t, up), 1, 0)))
	// Every request has the same prompt: without affinity off, its cached
	// prefix would shorten the pending count after the first.
	g := startGateway(t, ctrl, Config{LB: LBIsobar, NoPrefixAffinity: true}, Deps{Rand: newLockedRand(1, 1)})
	const promptBytes = 2000
	bodyLen := len(fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, strings.Repeat("a", promptBytes)))
	estimate := int64((bodyLen + 3) / 4)
	var wg sync.WaitGroup
	var want int64
	for i, tc := range []struct {
		header string // "" absent
		tokens int64
	}{
		{"", estimate},
		{"-5", estimate},
		{"many", estimate},
		{"0", estimate},
		{strconv.Itoa(placement.MaxPromptTokens * 4), estimate},
		{"321", 321},
	} {
		var h map[string]string
		if tc.header != "" {
			h = map[string]string{xdscontract.PromptTokensHeader: tc.header}
		}
		wg.Go(func() {
			if r := g.completion(t, model, promptBytes, h); r.status != http.StatusOK {
				t.Errorf("request %d: status %d", i, r.status)
			}
		})
		eventually.True(t, testTimeout, "the request held upstream", func() bool { return up.count() == i+1 })
		want += tc.tokens
		if got := g.metric(t, "isobar_gateway_upstream_pending_prompt_tokens", map[string]string{"endpoint": "a"}); int64(got) != want {
			t.Errorf("header %q: pending %v, want %d", tc.header, got, want)
		}
	}
	close(up.release)
	wg.Wait()
}

// Over real xDS from the regional controller's builder, the gateway reads
// each endpoint's prefill rate, RTT and jitter, a remote locality's RTT
// and jitter for its ingress endpoint, and leaves unknown what the
// controller did not declare; the batch cap reaches the placement
// metadata.
func TestGatewayReadsControllerPlacementMetadata(t *testing.T) {
	declared := endpointOf(t, "a", "127.0.0.1:18001", 1, 0)
	declared.PrefillTokensPerSecond, declared.MaxNumSeqs = 30000, 12
	declared.RTT, declared.Jitter = 400*time.Microsecond, 50*time.Microsecond
	st := xds.State{Models: []xds.Model{{Name: model, Localities: []xds.Locality{
		{Region: "r1", Zone: "z1", Weight: 750, Endpoints: []xds.Endpoint{declared, endpointOf(t, "b", "127.0.0.1:18002", 1, 0)}},
		{Region: "r2", Zone: "r2", Weight: 250, RTT: 60 * time.Millisecond, Jitter: 2500 * time.Microsecond,
			Endpoints: []xds.Endpoint{endpointOf(t, "region/r2", "127.0.0.2:19000", 1, 0)}},
	}}}}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	g := startGateway(t, ctrl, Config{LB: LBIsobar}, Deps{})
	tb := g.waitTable(t, "three endpoints", func(tb *xdsclient.Table) bool { return len(tb.Clusters[xdscontract.ClusterName(model)].Endpoints) == 3 })
	type place struct {
		rate        float64
		rtt, jitter time.Duration
		slots       int64
	}
	want := map[string]place{
		"a":         {30000, 400 * time.Microsecond, 50 * time.Microsecond, 12},
		"b":         {},
		"region/r2": {0, 60 * time.Millisecond, 2500 * time.Microsecond, 0},
	}
	for _, e := range tb.Clusters[xdscontract.ClusterName(model)].Endpoints {
		if got := (place{e.PrefillTokensPerSecond, e.RTT, e.Jitter, e.MaxNumSeqs}); got != want[e.Cell] {
			t.Errorf("endpoint %s: %+v, want %+v", e.Cell, got, want[e.Cell])
		}
	}

	// The batch cap from the same builder's assignment, as the placement
	// metadata reads it.
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	cla := res.Envoy.Endpoints[0]
	decoded, err := xdsclient.DecodeAssignments([]*anypb.Any{mustAny(t, cla)})
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[string]int64{}
	for _, e := range decoded[cla.GetClusterName()] {
		seqs[e.Cell] = e.MaxNumSeqs
	}
	if seqs["a"] != 12 || seqs["b"] != 0 || seqs["region/r2"] != 0 {
		t.Errorf("batch caps %v, want a 12 and the others unknown", seqs)
	}
}

// edsCluster is a minimal EDS cluster named name, changed by mod.
func edsCluster(name string, mod func(*cluster.Cluster)) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{EdsConfig: &core.ConfigSource{
			ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}},
		ConnectTimeout: durationpb.New(time.Second),
	}
	if mod != nil {
		mod(c)
	}
	return c
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
