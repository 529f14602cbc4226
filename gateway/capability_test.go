package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

func TestContextMemoryCeiling(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var m contextMemory
	if c := m.ceiling(t0); c != 0 || !m.fits(1<<20, t0) {
		t.Fatalf("fresh memory: ceiling %d, want none", c)
	}
	m.served(300)
	if c := m.ceiling(t0); c != 0 {
		t.Fatalf("served only: ceiling %d, want none", c)
	}
	// A refusal with a smaller success known: only proven sizes.
	m.refusedPrompt(5000, 0, t0)
	if c := m.ceiling(t0); c != 300 {
		t.Fatalf("after a refusal at 5000 with 300 served: ceiling %d, want 300", c)
	}
	if m.fits(301, t0) || !m.fits(300, t0) {
		t.Fatal("fits disagrees with the ceiling of 300")
	}
	// A larger refusal does not raise the smallest refused.
	m.refusedPrompt(9000, 0, t0.Add(time.Minute))
	if c := m.ceiling(t0.Add(time.Minute)); c != 300 {
		t.Fatalf("after a larger refusal: ceiling %d, want 300", c)
	}
	// Expiry counts from the last refusal and clears the memory.
	at := t0.Add(time.Minute + contextMemoryTTL)
	if m.expired(at.Add(-time.Nanosecond)) {
		t.Fatal("expired before the TTL")
	}
	if c := m.ceiling(at); c != 0 || !m.expired(at) {
		t.Fatalf("after the TTL: ceiling %d, want none", c)
	}

	// Nothing served yet: one below the smallest refused.
	var n contextMemory
	n.refusedPrompt(2000, 0, t0)
	if c := n.ceiling(t0); c != 1999 {
		t.Fatalf("refused 2000, nothing served: ceiling %d, want 1999", c)
	}
	n.refusedPrompt(1, 0, t0)
	if c := n.ceiling(t0); c != 1 {
		t.Fatalf("refused 1: ceiling %d, want the floor 1", c)
	}
}

// A refusal that states the engine's limit sets the ceiling to it, proven
// sizes or not; the statement is vLLM's wording.
func TestContextMemoryStatedLimit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	body := []byte(`{"object":"error","message":"This model's maximum context length is 1024 tokens. However, you requested 6916 tokens (6900 in the messages, 16 in the completion).","type":"BadRequestError","code":400}`)
	if n := statedContextLimit(body); n != 1024 {
		t.Fatalf("stated limit %d, want 1024", n)
	}
	for _, b := range []string{"", "bad request", "maximum context length is -5 tokens", "maximum context length is 99999999999 tokens"} {
		if n := statedContextLimit([]byte(b)); n != 0 {
			t.Errorf("%q: stated limit %d, want none", b, n)
		}
	}
	var m contextMemory
	m.refusedPrompt(6916, 1024, t0)
	if c := m.ceiling(t0); c != 1024 {
		t.Fatalf("ceiling %d, want the stated 1024", c)
	}
	m.served(300)
	if c := m.ceiling(t0); c != 1024 {
		t.Fatalf("ceiling %d after a smaller success, want the stated 1024", c)
	}
}

func FuzzStatedContextLimit(f *testing.F) {
	f.Add([]byte("This model's maximum context length is 1024 tokens."))
	f.Add([]byte("maximum context length is 0 tokens"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := statedContextLimit(b); n < 0 || n > 999999999 {
			t.Fatalf("limit %d out of range", n)
		}
	})
}

// With --lb isobar, an engine whose max_model_len nobody declared refuses
// one long prompt (HTTP 400); the gateway remembers it and sends it no
// more long prompts, while it keeps serving short ones. Sequential
// requests: both engines idle, so every pick is a tie broken at random
// (prefix affinity off: the prompts are all the same text, which would
// otherwise stick to the endpoint that served it first).
func TestGatewayIsobarRemembersContextRefusal(t *testing.T) {
	short := engine(t, model, 1024, nil, 0)
	full := engine(t, model, 0, nil, 0)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model,
		endpointOf(t, "short", short.Addr(), 1, 0), endpointOf(t, "full", full.Addr(), 1, 0)))
	g := startGateway(t, ctrl, Config{LB: LBIsobar, NoPrefixAffinity: true}, Deps{Rand: newLockedRand(3, 4)})
	g.waitTable(t, "both endpoints", func(tb *xdsclient.Table) bool { return len(tb.Clusters[xdscontract.ClusterName(model)].Endpoints) == 2 })
	refused := 0
	for i := range 16 {
		r := g.completion(t, model, 8000, nil) // ~2,000 tokens: above 1024
		switch {
		case r.status == http.StatusBadRequest:
			refused++
			if refused > 1 {
				t.Fatalf("long request %d refused again: the refusal was not remembered", i)
			}
		case r.status != http.StatusOK || r.endpoint != "full":
			t.Fatalf("long request %d: status %d from %q", i, r.status, r.endpoint)
		}
	}
	if refused == 0 {
		t.Log("no long prompt drew the short engine: the memory was not exercised by this seed")
	}
	seen := map[string]int{}
	for range 16 {
		r := g.completion(t, model, 400, nil)
		if r.status != http.StatusOK {
			t.Fatalf("short request: status %d", r.status)
		}
		seen[r.endpoint]++
	}
	if seen["short"] == 0 {
		t.Errorf("short prompts by endpoint %v: the short engine was dropped altogether", seen)
	}
}

// --lb isobar sends an endpoint on probation at most its published probe
// budget, counted from the push that armed it; a push without the budget
// (the penalty cleared) returns it to the pick.
func TestGatewayIsobarSpendsProbeBudget(t *testing.T) {
	probed := engine(t, model, 0, nil, 0)
	other := engine(t, model, 0, nil, 0)
	pe := endpointOf(t, "probed", probed.Addr(), 1, 0)
	oe := endpointOf(t, "other", other.Addr(), 1, 0)
	pe.ProbeBudget = 2
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, pe, oe))
	g := startGateway(t, ctrl, Config{LB: LBIsobar}, Deps{Rand: newLockedRand(5, 6)})
	g.waitTable(t, "the probe budget", func(tb *xdsclient.Table) bool {
		for _, e := range tb.Clusters[xdscontract.ClusterName(model)].Endpoints {
			if e.Cell == "probed" && e.ProbeBudget == 2 {
				return true
			}
		}
		return false
	})
	byEndpoint := map[string]int{}
	for range 24 {
		r := g.completion(t, model, 40, nil)
		if r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
		byEndpoint[r.endpoint]++
	}
	if byEndpoint["probed"] > 2 {
		t.Fatalf("the endpoint on probation got %d requests, budget 2 (%v)", byEndpoint["probed"], byEndpoint)
	}
	pe.ProbeBudget = 0
	ctrl.push(oneModel(model, pe, oe))
	g.waitTable(t, "the budget cleared", func(tb *xdsclient.Table) bool {
		for _, e := range tb.Clusters[xdscontract.ClusterName(model)].Endpoints {
			if e.Cell == "probed" && e.ProbeBudget == 0 {
				return true
			}
		}
		return false
	})
	after := map[string]int{}
	for range 24 {
		after[g.completion(t, model, 40, nil).endpoint]++
	}
	if after["probed"] == 0 {
		t.Errorf("after the penalty cleared the endpoint got nothing (%v)", after)
	}
}

// The oldest pending prompt counts less as the host prefills it: from the
// later of its send and the host's last first byte, at the prefill rate.
func TestHostPendingWorkHeadProgress(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var h hostState
	a1 := &attempt{tokens: 1000, sent: t0}
	a2 := &attempt{tokens: 500, sent: t0.Add(10 * time.Millisecond)}
	h.addPending(a1)
	h.addPending(a2)
	for _, tc := range []struct {
		at   time.Duration
		want int64
	}{{0, 1500}, {25 * time.Millisecond, 1000}, {time.Second, 500}, {-time.Second, 1500}} {
		if got := h.pendingWork(t0.Add(tc.at), 20000); got != tc.want {
			t.Errorf("at %v: pending work %d, want %d", tc.at, got, tc.want)
		}
	}
	if got := h.pendingWork(t0.Add(time.Second), 0); got != 1500 {
		t.Errorf("unknown rate: pending work %d, want all 1500", got)
	}
	// a1's first byte at 1 s: a2 is the head, prefilling since then.
	h.removePending(a1, t0.Add(time.Second))
	if got := h.pendingWork(t0.Add(time.Second+10*time.Millisecond), 20000); got != 300 {
		t.Errorf("after the head's first byte: pending work %d, want 300", got)
	}
	h.removePending(a2, t0.Add(2*time.Second))
	if got := h.pendingWork(t0.Add(2*time.Second), 20000); got != 0 || h.pending.Load() != 0 {
		t.Errorf("nothing pending: work %d, pending %d", got, h.pending.Load())
	}
}

// TestGatewayPinnedLongPromptAvoidsShortEngine: a residency set's pinned
// cluster is split by context class as the unpinned routes are
// (xdscontract.PinnedClassClusterName), so a long pinned prompt never
// reaches an endpoint whose declared max_model_len is shorter (the lab's
// residency drill once leaked one to a 1,024-token engine); short prompts
// still use that endpoint.
func TestGatewayPinnedLongPromptAvoidsShortEngine(t *testing.T) {
	ups := map[string]*countingUpstream{"short": {}, "full": {}}
	locs := []xds.Locality{{Region: "r1", Zone: "z1", Weight: 1000, Endpoints: []xds.Endpoint{
		endpointOf(t, "short", startHTTP(t, ups["short"]), 1, 1024),
		endpointOf(t, "full", startHTTP(t, ups["full"]), 1, 0),
	}}}
	st := xds.State{Models: []xds.Model{{Name: model, Localities: locs,
		Pinned: []xds.Pinned{{Set: "home", Regions: []string{"r1"}, Localities: locs}}}}}
	g := unitGateway(t, Config{LB: LBIsobar, NoPrefixAffinity: true,
		Residency: mustResidency(t, `{"sets": {"home": ["r1"]}, "tenants": {"t": "home"}}`)}, Deps{Rand: newLockedRand(5, 6)})
	applyState(t, g, st, nil)
	send := func(promptBytes int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, strings.Repeat("a", promptBytes))
		req := httptest.NewRequest(http.MethodPost, "http://gw/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(xdscontract.TenantHeader, "t")
		rec := httptest.NewRecorder()
		g.handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("pinned request of %d bytes: %d %s", promptBytes, rec.Code, rec.Body)
		}
	}
	for range 30 {
		send(24000) // ~6,000 tokens: above 1024
	}
	if n := ups["short"].n.Load(); n != 0 {
		t.Fatalf("%d long pinned prompts reached the endpoint declaring max_model_len 1024, want 0", n)
	}
	for range 30 {
		send(400)
	}
	if ups["short"].n.Load() == 0 {
		t.Errorf("no short pinned prompt reached the short endpoint: it was dropped altogether")
	}
}

// placeable keeps a prompt off a host whose declared max_model_len it
// exceeds (the window in which a data plane holds the new endpoints but
// not yet the new class routes), and not off one without a declared
// length or one it fits.
func TestPlaceableDeclaredContextLength(t *testing.T) {
	host := func(maxLen uint32) *hostRT {
		return &hostRT{ep: xdsclient.Endpoint{MaxModelLen: maxLen}, st: &hostState{}}
	}
	for _, c := range []struct {
		maxLen uint32
		tokens int64
		want   bool
	}{{1024, 6008, false}, {1024, 1024, true}, {1024, 600, true}, {0, 6008, true}, {8192, 6008, true}} {
		if got := placeable(host(c.maxLen), pickQuery{tokens: c.tokens}); got != c.want {
			t.Errorf("max_model_len %d, prompt %d tokens: placeable %v, want %v", c.maxLen, c.tokens, got, c.want)
		}
	}
}
