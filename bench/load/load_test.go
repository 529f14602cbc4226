package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/sim"
)

const model = "test-model"

func startEngine(t *testing.T, maxLen int) string {
	t.Helper()
	e, err := sim.NewEngine(sim.EngineConfig{Model: model, MaxModelLen: maxLen, Profile: sim.ProfileTiny, TimeScale: 0.01, Seed: 1},
		sim.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
	return "http://" + e.Addr()
}

func class(t *testing.T, name string) Class {
	t.Helper()
	c, err := LookupClass(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRunAgainstEngine: every request sent is recorded with a TTFT before
// its end and the streamed tokens asked for; a constant rate sends
// RPS × Duration requests; NDJSON lines decode back into the records.
func TestRunAgainstEngine(t *testing.T) {
	url := startEngine(t, 4096)
	var ndjson bytes.Buffer
	enc := json.NewEncoder(&ndjson)
	var progress bytes.Buffer
	res, err := Run(context.Background(), Config{URL: url, Model: model, Class: class(t, "baseline_mixed"), RPS: 40,
		Arrival: ArrivalConstant, Duration: time.Second, MaxOutput: 4, Seed: 7},
		Deps{OnRecord: func(r Record) { _ = enc.Encode(r) }, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Records); n < 38 || n > 40 {
		t.Fatalf("%d records at 40 RPS for 1 s: want 39 or 40", n)
	}
	for i, r := range res.Records {
		if r.Seq != i+1 {
			t.Fatalf("record %d has seq %d: want start order", i, r.Seq)
		}
		if !r.OK || r.Status != 200 || r.TTFTms == nil || *r.TTFTms > r.E2Ems || r.OutputTokens != 4 || r.PromptTokens < 1 {
			t.Fatalf("record %+v: want a complete stream of 4 tokens with TTFT <= E2E", r)
		}
	}
	lines := strings.Split(strings.TrimSpace(ndjson.String()), "\n")
	if len(lines) != len(res.Records) {
		t.Fatalf("%d NDJSON lines for %d records", len(lines), len(res.Records))
	}
	var first Record
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first.Class != "baseline_mixed" {
		t.Fatalf("NDJSON line %q: %v", lines[0], err)
	}
	s := res.Summary
	if s.Requests != len(res.Records) || s.Succeeded != s.Requests || *s.Success != 1 || s.TTFTms == nil || s.TTFTms.P50 > s.TTFTms.P99 {
		t.Errorf("summary %+v", s)
	}
	if !strings.Contains(progress.String(), "100%") {
		t.Errorf("progress %q: no final bar", progress.String())
	}
}

// TestSameSeedSameRequests: the request sequence depends on the seed only.
func TestSameSeedSameRequests(t *testing.T) {
	url := startEngine(t, 1<<14)
	shapes := func(seed uint64) []int {
		res, err := Run(context.Background(), Config{URL: url, Model: model, Class: class(t, "code_heavy"), RPS: 50,
			Duration: 500 * time.Millisecond, MaxOutput: 1, Seed: seed}, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, r := range res.Records {
			out = append(out, r.PromptTokens)
		}
		return out
	}
	a, b, c := shapes(3), shapes(3), shapes(4)
	if len(a) == 0 || !slices.Equal(a, b) {
		t.Errorf("seed 3 twice: %v vs %v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 3 and 4 sent the same prompts %v", a)
	}
}

// TestClassShapes checks the shapes without a server: multiturn
// conversations grow turn by turn and share the previous turn as a
// prefix, RAG documents repeat with their document as the shared prefix,
// rapid_shift alternates, the long classes sit where the evaluation puts
// them, and output lengths vary around each class's mean.
func TestClassShapes(t *testing.T) {
	mt := class(t, "multiturn")
	s := NewSampler(mt, 1)
	prev := map[uint64]Shape{}
	newConv := 0
	for range 400 {
		sh := s.Next(0)
		if sh.Session == 0 || sh.Turn < 1 || sh.Turn > mt.Turns {
			t.Fatalf("multiturn shape %+v: want a session and a turn in 1..%d", sh, mt.Turns)
		}
		p, seen := prev[sh.Session]
		switch {
		case !seen:
			newConv++
			if sh.Turn != 1 || sh.SharedPrefix != 0 {
				t.Fatalf("new conversation %+v: want turn 1 with no shared prefix", sh)
			}
		case sh.Turn != p.Turn+1 || sh.SharedPrefix != p.Prompt || sh.Prompt <= p.Prompt:
			t.Fatalf("turn %+v after %+v: want the next turn sharing the previous prompt", sh, p)
		}
		prev[sh.Session] = sh
	}
	if newConv < 400/mt.Turns {
		t.Errorf("%d conversations in 400 requests of %d turns", newConv, mt.Turns)
	}
	rag := NewSampler(class(t, "rag_multidoc"), 1)
	seen := map[uint64]bool{}
	docLen := map[uint64]int{} // the document's length, from its first reuse
	shared := 0
	for range 2000 {
		sh := rag.Next(0)
		if sh.Session == 0 || sh.SharedPrefix >= sh.Prompt {
			t.Fatalf("rag shape %+v", sh)
		}
		switch {
		case !seen[sh.Session] && sh.SharedPrefix != 0:
			t.Fatalf("first use of document %d shares %d tokens", sh.Session, sh.SharedPrefix)
		case seen[sh.Session] && sh.SharedPrefix == 0:
			t.Fatalf("document %d seen before but nothing shared: %+v", sh.Session, sh)
		case sh.SharedPrefix > 0:
			shared++
			if n, ok := docLen[sh.Session]; ok && n != sh.SharedPrefix {
				t.Fatalf("document %d shared as %d tokens, earlier as %d", sh.Session, sh.SharedPrefix, n)
			}
			docLen[sh.Session] = sh.SharedPrefix
		}
		seen[sh.Session] = true
	}
	if shared < 1500 {
		t.Errorf("only %d of 2000 RAG requests reuse a document: want a skewed pool", shared)
	}
	rs := NewSampler(class(t, "rapid_shift"), 1)
	if short, long := rs.Next(time.Second), rs.Next(11*time.Second); short.Prompt > 1000 || long.Prompt < 2000 {
		t.Errorf("rapid_shift: %d then %d tokens: want short then long", short.Prompt, long.Prompt)
	}
	for name, want := range map[string]float64{"rag_multidoc": 4000, "long_context": 8000, "very_long": 16000} {
		smp, sum := NewSampler(class(t, name), 1), 0
		for range 4000 {
			sum += smp.Next(0).Prompt
		}
		if mean := float64(sum) / 4000; mean < 0.93*want || mean > 1.07*want {
			t.Errorf("%s: mean prompt %.0f, want ~%.0f", name, mean, want)
		}
	}
	bm := class(t, "baseline_mixed")
	smp, distinct, sum := NewSampler(bm, 1), map[int]bool{}, 0
	for range 4000 {
		o := smp.Next(0).Output
		if o < 1 || o > bm.Output.Max {
			t.Fatalf("output %d outside [1, %d]", o, bm.Output.Max)
		}
		distinct[o] = true
		sum += o
	}
	if mean := float64(sum) / 4000; len(distinct) < 50 || mean < 0.9*bm.Output.Mean || mean > 1.05*bm.Output.Mean {
		t.Errorf("baseline_mixed outputs: %d distinct values, mean %.1f: want varied around %.0f", len(distinct), mean, bm.Output.Mean)
	}
}

// TestSamplerKeyed: request i's shape depends on (seed, i) alone, not on
// how many requests were drawn before it, for classes without sessions.
func TestSamplerKeyed(t *testing.T) {
	c := class(t, "code_heavy")
	a := NewSampler(c, 9)
	var seq []Shape
	for range 50 {
		seq = append(seq, a.Next(0))
	}
	b := NewSampler(c, 9)
	for _, i := range []uint64{49, 3, 17, 0} {
		if got := b.At(i, 0); !reflect.DeepEqual(got, seq[i]) {
			t.Errorf("At(%d) = %+v, Next gave %+v", i, got, seq[i])
		}
	}
	if reflect.DeepEqual(NewSampler(c, 10).At(3, 0), seq[3]) {
		t.Error("another seed drew the same shape")
	}
}

// TestBurstsAndWindow: adversarial_spike adds its bursts on top of the
// rate, and the summary leaves warm-up out.
func TestBurstsAndWindow(t *testing.T) {
	url := startEngine(t, 4096)
	c := class(t, "adversarial_spike")
	c.BurstSize, c.BurstEvery = 10, 400*time.Millisecond
	res, err := Run(context.Background(), Config{URL: url, Model: model, Class: c, RPS: 10, Arrival: ArrivalConstant,
		Duration: time.Second, Warmup: 500 * time.Millisecond, MaxOutput: 1}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	bursts := 0
	for _, r := range res.Records {
		if r.Burst {
			bursts++
		}
	}
	if bursts != 20 || len(res.Records) < 28 {
		t.Errorf("%d burst requests of %d: want 2 bursts of 10 on top of ~10 steady", bursts, len(res.Records))
	}
	if res.Summary.Requests >= len(res.Records) || res.Summary.WindowS != 0.5 {
		t.Errorf("summary counts %d of %d over %vs: want the warm-up left out", res.Summary.Requests, len(res.Records), res.Summary.WindowS)
	}
}

// TestFailuresRecorded: prompts over the engine's max_model_len come back
// as HTTP 400 records with the engine's message, and count as failures.
func TestFailuresRecorded(t *testing.T) {
	url := startEngine(t, 1024)
	res, err := Run(context.Background(), Config{URL: url, Model: model, Class: class(t, "long_context"), RPS: 20,
		Duration: 300 * time.Millisecond, MaxOutput: 1}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) == 0 {
		t.Fatal("no requests")
	}
	for _, r := range res.Records {
		if r.OK || r.Status != 400 || !strings.Contains(r.Error, "context") {
			t.Fatalf("record %+v: want HTTP 400 naming the context length", r)
		}
	}
	if *res.Summary.Success != 0 || res.Summary.Statuses["400"] != res.Summary.Requests {
		t.Errorf("summary %+v", res.Summary)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Model: model, RPS: 1}, "URL is required"},
		{Config{URL: "ftp://x", Model: model, RPS: 1}, "URL"},
		{Config{URL: "http://127.0.0.1:1"}, "Model"},
		{Config{URL: "http://127.0.0.1:1", Model: model}, "RPS"},
		{Config{URL: "http://127.0.0.1:1", Model: model, RPS: 1, Arrival: "bursty"}, "Arrival"},
		{Config{URL: "http://127.0.0.1:1", Model: model, RPS: 1, Duration: time.Second, Warmup: time.Second}, "Warmup"},
	} {
		_, err := Run(context.Background(), tc.cfg, Deps{})
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := LookupClass("nope"); err == nil || !strings.Contains(err.Error(), "baseline_mixed") {
		t.Errorf("LookupClass: %v", err)
	}
}

// TestBlockHashesShareWhatPromptsShare: turns of a conversation share
// the earlier turns' blocks, requests about one document share its
// blocks, a tenant's requests share its system prompt, and nothing else
// is shared.
func TestBlockHashesShareWhatPromptsShare(t *testing.T) {
	common := func(a, b []uint64) int {
		n := 0
		for n < min(len(a), len(b)) && a[n] == b[n] {
			n++
		}
		return n
	}
	for _, name := range []string{"multiturn", "rag_multidoc", "tenant_prompts", "baseline_mixed"} {
		t.Run(name, func(t *testing.T) {
			s := NewSampler(class(t, name), 5)
			type seen struct {
				sh Shape
				bh []uint64
			}
			last := map[uint64]seen{}
			checked := 0
			for i := range 400 {
				sh := s.Next(0)
				sum := 0
				for _, sg := range sh.Segments {
					sum += sg.Tokens
				}
				if sum != sh.Prompt {
					t.Fatalf("request %d: segments hold %d tokens, prompt %d", i, sum, sh.Prompt)
				}
				bh := sh.BlockHashes(16)
				if len(bh) != sh.Prompt/16 {
					t.Fatalf("request %d: %d blocks for %d tokens", i, len(bh), sh.Prompt)
				}
				if prev, ok := last[sh.Session]; ok && sh.Session != 0 {
					want := min(sh.SharedPrefix, prev.sh.Prompt) / 16
					if name == "multiturn" {
						want = prev.sh.Prompt / 16 // the previous turn is this one's prefix
						if sh.Turn == 1 {
							want = 0
						}
					}
					if got := common(prev.bh, bh); got != want {
						t.Fatalf("request %d (session %d): shares %d blocks with the last of its session, want %d", i, sh.Session, got, want)
					}
					checked++
				}
				if prev, ok := last[0]; ok && sh.Session == 0 && len(bh) > 0 && len(prev.bh) > 0 {
					if c := common(prev.bh, bh); c != 0 {
						t.Fatalf("request %d shares %d blocks with an unrelated prompt", i, c)
					}
					checked++
				}
				last[sh.Session] = seen{sh, bh}
			}
			if checked == 0 {
				t.Fatal("nothing compared")
			}
		})
	}
}

// TestShapeText: a prompt's text is 4 bytes per token, and the turns of a
// conversation share their text where they share segments.
func TestShapeText(t *testing.T) {
	s := NewSampler(class(t, "multiturn"), 2)
	last := map[uint64]string{}
	shared := 0
	for range 200 {
		sh := s.Next(0)
		text := sh.Text()
		if len(text) != 4*sh.Prompt {
			t.Fatalf("%d bytes for %d tokens", len(text), sh.Prompt)
		}
		if prev, ok := last[sh.Session]; ok && sh.Turn > 1 {
			if !strings.HasPrefix(text, prev) {
				t.Fatalf("session %d turn %d does not start with the previous turn's prompt", sh.Session, sh.Turn)
			}
			shared++
		}
		last[sh.Session] = text
	}
	if shared == 0 {
		t.Fatal("no later turn compared")
	}
	a := NewSampler(class(t, "baseline_mixed"), 2)
	x, y := a.Next(0).Text(), a.Next(0).Text()
	if x[:64] == y[:64] {
		t.Fatal("two prefix-free prompts share their first block")
	}
}
