package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/sim"
)

// The steady workload's prompts are exactly 4 bytes per token (the
// engines' count), distinct per request and the same per seed.
func TestPromptText(t *testing.T) {
	seen := map[string]bool{}
	for n := range uint64(200) {
		s := promptText(rand.New(rand.NewPCG(1, textStream+n)), 100+int(n))
		if len(s) != 4*(100+int(n)) {
			t.Fatalf("prompt of %d tokens has %d bytes", 100+n, len(s))
		}
		if seen[s[:64]] {
			t.Fatalf("request %d repeats an earlier prompt's first block", n)
		}
		seen[s[:64]] = true
	}
	a := promptText(rand.New(rand.NewPCG(7, textStream)), 50)
	if b := promptText(rand.New(rand.NewPCG(7, textStream)), 50); a != b {
		t.Fatal("the same seed gave different text")
	}
}

// tWriter sends log lines to t.Log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger { return slog.New(slog.NewTextHandler(tWriter{t}, nil)) }

// startTestEngine runs a fast simulated engine for the traffic to hit
// directly (no gateway), stopped when the test ends.
func startTestEngine(t *testing.T) *sim.Engine {
	t.Helper()
	e, err := sim.NewEngine(sim.EngineConfig{Profile: sim.ProfileTiny, TimeScale: 0.05}, sim.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCtx(e.Stop) })
	return e
}

// runTraffic drives one region's clients at e until n outcomes match,
// stops them, and returns every outcome. The deadline only bounds a stuck
// run.
func runTraffic(t *testing.T, cfg Config, e *sim.Engine, n int, match func(Outcome) bool) []Outcome {
	t.Helper()
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	tr := newTraffic(cfg, "r1", e.Addr(), cfg.Seed, clockwork.NewRealClock(), testLogger(t))
	tr.start(context.Background())
	defer tr.stop()
	eventually.True(t, 2*time.Minute, fmt.Sprintf("%d matching requests", n), func() bool {
		got := 0
		for _, o := range tr.Outcomes() {
			if match(o) {
				got++
			}
		}
		return got >= n
	})
	tr.stop()
	return tr.Outcomes()
}

// The steady workload's prompts share no prefix: the engine looks every
// prompt up and finds nothing.
func TestSteadyWorkloadSharesNoPrefix(t *testing.T) {
	e := startTestEngine(t)
	os := runTraffic(t, Config{RPS: 50, PromptTokens: 64, PromptJitter: 16, LongPrompt: 200, MaxTokens: 2}, e, 30,
		func(o Outcome) bool { return o.OK })
	for _, o := range os {
		if !o.OK {
			t.Errorf("request failed: %+v", o)
		}
	}
	pc := prefixCache([]*sim.Engine{e})
	if pc.Engines != 1 || pc.QueriesTokens == 0 || pc.HitsTokens != 0 {
		t.Fatalf("prefix cache %+v: want queries and no hit", pc)
	}
}

// The multiturn workload's sessions carry their history: later turns
// reuse at least the previous prompt's full blocks.
func TestMultiturnWorkloadReusesHistory(t *testing.T) {
	e := startTestEngine(t)
	cfg := Config{Workload: WorkloadMultiturn, Sessions: 4, Turns: 4, RPS: 40, MaxTokens: 4, TurnTokens: 64, TurnJitter: 16}
	os := runTraffic(t, cfg, e, 8, func(o Outcome) bool { return o.OK && o.Turn >= 2 })
	later := 0
	for _, o := range os {
		if !o.OK {
			t.Errorf("request failed: %+v", o)
		}
		if o.OK && o.Turn >= 2 {
			later++
		}
		if o.Turn < 1 || o.Turn > 4 {
			t.Errorf("turn %d outside 1..4", o.Turn)
		}
	}
	// A turn's previous prompt holds at least one user message of 48
	// tokens plus the template: 3 full blocks the engine reuses.
	pc := prefixCache([]*sim.Engine{e})
	if pc.HitsTokens < int64(48*later) || pc.HitRate <= 0 || pc.HitRate > 1 {
		t.Fatalf("prefix cache %+v after %d later turns: want at least %d hit tokens", pc, later, 48*later)
	}
	t.Logf("%d requests, %d later turns, prefix cache %+v", len(os), later, pc)
}

// A client keeps the streamed reply text (chat deltas or completion text),
// skips anything else, and keeps at most maxReplyBytes.
func TestAppendDelta(t *testing.T) {
	var b strings.Builder
	for _, chunk := range []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"content":" the"}}]}`,
		`{"choices":[{"index":0,"text":" engine"}]}`,
		`{"error":"x"}`, `not json`, `{"choices":[]}`,
	} {
		appendDelta(&b, chunk)
	}
	if b.String() != " the engine" {
		t.Fatalf("reply %q", b.String())
	}
	big, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"text": strings.Repeat("x", maxReplyBytes)}}})
	appendDelta(&b, string(big))
	if b.Len() != maxReplyBytes {
		t.Fatalf("reply grew to %d bytes, want the cap %d", b.Len(), maxReplyBytes)
	}
}

func TestPrefixCacheReportUnreadEngine(t *testing.T) {
	e, err := sim.NewEngine(sim.EngineConfig{Profile: sim.ProfileTiny}, sim.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	// Never started: nothing listens.
	pc := prefixCache([]*sim.Engine{e})
	if pc.Engines != 0 || pc.Unread != 1 {
		t.Fatalf("%+v, want one unread engine", pc)
	}
	var sum PrefixCacheReport
	sum.add(PrefixCacheReport{QueriesTokens: 300, HitsTokens: 100, Engines: 1})
	sum.add(PrefixCacheReport{QueriesTokens: 100, HitsTokens: 100, Engines: 1})
	sum.add(pc)
	if sum.Engines != 2 || sum.Unread != 1 || sum.HitRate != 0.5 {
		t.Fatalf("sum %+v, want 2 engines, 1 unread, hit rate 0.5", sum)
	}
}
