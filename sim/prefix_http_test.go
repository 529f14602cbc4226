package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// prefixCounters scrapes the engine's vllm:prefix_cache_* counters.
func prefixCounters(t *testing.T, c *http.Client, e *Engine) (queries, hits float64) {
	t.Helper()
	mfs := scrape(t, c, url(e, "/metrics"))
	labels := map[string]string{"engine": "0", "model_name": DefaultModel}
	q, okQ := metricValue(mfs, "vllm:prefix_cache_queries_total", labels)
	h, okH := metricValue(mfs, "vllm:prefix_cache_hits_total", labels)
	if !okQ || !okH {
		t.Fatalf("prefix cache counters missing from /metrics (queries %v, hits %v)", okQ, okH)
	}
	return q, h
}

// generate posts a request, checks it succeeded and returns the prompt
// tokens and the generated text.
func generate(t *testing.T, c *http.Client, e *Engine, path, body string) (promptTokens int, text string) {
	t.Helper()
	resp, b := post(t, c, url(e, path), body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s = %d: %s", path, resp.StatusCode, b)
	}
	r := decode[completionResp](t, b)
	if len(r.Choices) == 0 || r.Usage == nil {
		t.Fatalf("response %s", b)
	}
	if m := r.Choices[0].Message; m != nil {
		return r.Usage.PromptTokens, m.Content
	}
	return r.Usage.PromptTokens, r.Choices[0].Text
}

// awaitPrefix waits until the counters reach at least the given queries
// (the scheduler counts at admission, after the request was handed over)
// and returns them.
func awaitPrefix(t *testing.T, c *http.Client, e *Engine, queries float64) (q, h float64) {
	t.Helper()
	eventually.True(t, pollTimeout, fmt.Sprintf("%v prefix-cache queries", queries), func() bool {
		q, h = prefixCounters(t, c, e)
		return q >= queries
	})
	return q, h
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Two completions whose prompts share 1,024 bytes (256 tokens, 16 blocks):
// the second reuses those blocks, and /metrics shows it as vLLM would.
func TestPrefixCacheHitsOverHTTP(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	shared := strings.Repeat("a shared system prompt, ", 43)[:1024]
	body := func(tail string) string {
		return `{"prompt":` + jsonString(shared+strings.Repeat(tail, 400)) + `,"max_tokens":2}`
	}
	p1, _ := generate(t, c, e, "/v1/completions", body("x"))
	if p1 != 356 {
		t.Fatalf("prompt tokens %d, want 356 (1,424 bytes)", p1)
	}
	if q, h := awaitPrefix(t, c, e, 356); q != 356 || h != 0 {
		t.Fatalf("after the first request: queries %v hits %v, want 356 and 0", q, h)
	}
	generate(t, c, e, "/v1/completions", body("y"))
	if q, h := awaitPrefix(t, c, e, 712); q != 712 || h != 256 {
		t.Fatalf("after the second request: queries %v hits %v, want 712 and 256 (16 shared blocks)", q, h)
	}
	if st := e.Stats(); st.PrefixQueries != 712 || st.PrefixHits != 256 {
		t.Fatalf("Stats %+v disagree with /metrics", st)
	}
	mfs := scrape(t, c, url(e, "/metrics"))
	for name, help := range map[string]string{
		"vllm:prefix_cache_queries_total": "Prefix cache queries, in terms of number of queried tokens.",
		"vllm:prefix_cache_hits_total":    "Prefix cache hits, in terms of number of cached tokens.",
	} {
		if got := mfs[name].GetHelp(); got != help {
			t.Errorf("%s HELP %q, want vLLM's %q", name, got, help)
		}
	}
}

// A conversation's second turn sends the first turn's messages, the reply
// and a new user message: every full block of the first turn's prompt
// is reused.
func TestPrefixCacheChatSecondTurnHits(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	user1 := jsonString(strings.Repeat("tell me about prefix caching. ", 30))
	p1, reply := generate(t, c, e, "/v1/chat/completions",
		`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":`+user1+`}],"max_tokens":8}`)
	awaitPrefix(t, c, e, float64(p1))
	p2, _ := generate(t, c, e, "/v1/chat/completions",
		`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":`+user1+`},`+
			`{"role":"assistant","content":`+jsonString(reply)+`},{"role":"user","content":"and then?"}],"max_tokens":8}`)
	q, h := awaitPrefix(t, c, e, float64(p1+p2))
	if want := float64(p1 / 16 * 16); h != want || q != float64(p1+p2) {
		t.Fatalf("queries %v hits %v, want %d and %v (the first turn's %d full blocks)", q, h, p1+p2, want, p1/16)
	}
}

// Prompts given as token ids hash their ids: two sharing their first 32
// ids share 2 blocks.
func TestPrefixCacheTokenIDPrompts(t *testing.T) {
	t.Parallel()
	e := startEngine(t, tinyConfig(), Deps{})
	c := newClient(t)
	ids := func(tail int) string {
		var s []string
		for i := range 32 {
			s = append(s, fmt.Sprint(1000+i))
		}
		for i := range 20 {
			s = append(s, fmt.Sprint(tail+i))
		}
		return `{"prompt":[` + strings.Join(s, ",") + `],"max_tokens":2}`
	}
	generate(t, c, e, "/v1/completions", ids(5))
	awaitPrefix(t, c, e, 52)
	generate(t, c, e, "/v1/completions", ids(7))
	if q, h := awaitPrefix(t, c, e, 104); q != 104 || h != 32 {
		t.Fatalf("queries %v hits %v, want 104 and 32", q, h)
	}
}

// With prefix caching off the same two requests reuse nothing and the
// counters stay at 0, as vLLM's do with --no-enable-prefix-caching.
func TestPrefixCacheOff(t *testing.T) {
	t.Parallel()
	cfg := tinyConfig()
	cfg.DisablePrefixCaching = true
	e := startEngine(t, cfg, Deps{})
	c := newClient(t)
	prompt := `{"prompt":` + jsonString(strings.Repeat("the same prompt twice ", 60)) + `,"max_tokens":2}`
	generate(t, c, e, "/v1/completions", prompt)
	generate(t, c, e, "/v1/completions", prompt)
	// Both requests are done and counted: success is counted after
	// admission, where the prefix counters would have moved.
	eventually.True(t, pollTimeout, "both requests counted", func() bool {
		v, _ := metricValue(scrape(t, c, url(e, "/metrics")), "vllm:request_success_total", map[string]string{"finished_reason": "length"})
		return v == 2
	})
	if q, h := prefixCounters(t, c, e); q != 0 || h != 0 {
		t.Fatalf("queries %v hits %v with prefix caching off, want 0 and 0", q, h)
	}
}
