package sim

import (
	"errors"
	"testing"
	"time"
)

// testProfile is a small profile with round numbers: 10 ms steps plus 1 ms
// per decoding sequence, 1000 prefill tokens per second, no attention cost.
func testProfile() Profile {
	p := ProfileTinyFast()
	p.Name = "test"
	p.StepBase = 10 * time.Millisecond
	p.DecodePerSeq = time.Millisecond
	p.AttnPerKToken = 0
	p.PrefillTokensPerSec = 1000
	p.MaxNumSeqs = 8
	p.MaxBatchedTokens = 256
	p.KVCacheTokens = 4096
	p.BlockSize = 16
	p.Preemption = false
	return p
}

func mustBatcher(t *testing.T, p Profile) *Batcher {
	t.Helper()
	b, err := NewBatcher(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustAdd(t *testing.T, b *Batcher, id SeqID, prompt, out int) {
	t.Helper()
	if err := b.Add(id, prompt, out); err != nil {
		t.Fatal(err)
	}
}

// runToIdle steps until idle and returns the number of steps and the total
// model time.
func runToIdle(t *testing.T, b *Batcher) (steps int, total time.Duration) {
	t.Helper()
	for !b.Idle() {
		st := b.Step()
		if st.Idle {
			t.Fatal("Step reported idle with work pending")
		}
		steps++
		total += st.Duration
		if steps > 100000 {
			t.Fatal("batcher does not converge")
		}
	}
	return steps, total
}

func TestBatcherSingleSequenceTimeline(t *testing.T) {
	b := mustBatcher(t, testProfile())
	mustAdd(t, b, 1, 100, 3)

	st := b.Step() // prefill 100 tokens, first token sampled
	if want := 10*time.Millisecond + 100*time.Millisecond; st.Duration != want {
		t.Fatalf("prefill step = %v, want %v", st.Duration, want)
	}
	if len(st.Tokens) != 1 || st.Tokens[0].N != 1 || st.PromptTokensDone != 100 || len(st.Admitted) != 1 {
		t.Fatalf("prefill step = %+v, want first token, 100 prompt tokens, one admission", st)
	}
	for n := 2; n <= 3; n++ {
		st = b.Step()
		if want := 11 * time.Millisecond; st.Duration != want {
			t.Fatalf("decode step = %v, want %v", st.Duration, want)
		}
		if len(st.Tokens) != 1 || st.Tokens[0].N != n || st.Tokens[0].Done != (n == 3) {
			t.Fatalf("decode step %d tokens = %+v", n, st.Tokens)
		}
	}
	if !b.Idle() || b.Stats().KVUsage != 0 {
		t.Fatalf("after finishing: idle=%v stats=%+v, want idle and KV freed", b.Idle(), b.Stats())
	}
}

func TestBatcherDecodeTimeGrowsWithBatch(t *testing.T) {
	p := testProfile()
	p.AttnPerKToken = 100 * time.Microsecond
	var prev time.Duration
	for _, batch := range []int{1, 2, 4, 8} {
		b := mustBatcher(t, p)
		for i := range batch {
			mustAdd(t, b, SeqID(i+1), 16, 10)
		}
		b.Step() // prefill everything in one step (8×16 tokens < budget)
		st := b.Step()
		if st.Decodes != batch || st.PrefillTokens != 0 {
			t.Fatalf("batch %d: decodes=%d prefill=%d", batch, st.Decodes, st.PrefillTokens)
		}
		if st.Duration <= prev {
			t.Fatalf("batch %d: decode step %v not longer than smaller batch's %v", batch, st.Duration, prev)
		}
		wantMin := p.StepBase + time.Duration(batch)*p.DecodePerSeq
		if st.Duration < wantMin {
			t.Fatalf("batch %d: decode step %v < %v", batch, st.Duration, wantMin)
		}
		prev = st.Duration
	}
}

func TestBatcherKVCacheLimitsConcurrency(t *testing.T) {
	p := testProfile()
	p.MaxNumSeqs = 100
	p.KVCacheTokens = 1024 // 64 blocks
	p.MaxBatchedTokens = 4096
	b := mustBatcher(t, p)
	// Each sequence reserves 200+56 = 256 tokens = 16 blocks: 4 fit.
	for i := range 10 {
		mustAdd(t, b, SeqID(i+1), 200, 56)
	}
	b.Step()
	if s := b.Stats(); s.Running != 4 || s.Waiting != 6 || s.KVUsage != 1 {
		t.Fatalf("stats = %+v, want 4 running, 6 waiting, KV full", s)
	}
	maxRunning := 0
	for !b.Idle() {
		b.Step()
		maxRunning = max(maxRunning, b.Stats().Running)
	}
	if maxRunning > 4 {
		t.Fatalf("max running = %d, KV cache allows 4", maxRunning)
	}
}

func TestBatcherMaxNumSeqsLimitsConcurrency(t *testing.T) {
	p := testProfile()
	p.MaxNumSeqs = 3
	b := mustBatcher(t, p)
	for i := range 7 {
		mustAdd(t, b, SeqID(i+1), 8, 4)
	}
	for !b.Idle() {
		st := b.Step()
		if st.Scheduled > 3 || b.Stats().Running > 3 {
			t.Fatalf("scheduled %d, running %d; cap is 3", st.Scheduled, b.Stats().Running)
		}
	}
}

func TestBatcherChunkedPrefill(t *testing.T) {
	p := testProfile() // 256-token budget
	b := mustBatcher(t, p)
	mustAdd(t, b, 1, 1000, 2)
	var chunks []int
	for {
		st := b.Step()
		if len(st.Tokens) > 0 {
			if st.Tokens[0].N != 1 {
				t.Fatalf("first token event N=%d", st.Tokens[0].N)
			}
			chunks = append(chunks, st.PrefillTokens)
			break
		}
		chunks = append(chunks, st.PrefillTokens)
	}
	want := []int{256, 256, 256, 232}
	if len(chunks) != len(want) {
		t.Fatalf("prefill chunks = %v, want %v", chunks, want)
	}
	for i := range want {
		if chunks[i] != want[i] {
			t.Fatalf("prefill chunks = %v, want %v", chunks, want)
		}
	}
}

func TestBatcherChunkedPrefillSharesStepsWithDecodes(t *testing.T) {
	p := testProfile()
	b := mustBatcher(t, p)
	mustAdd(t, b, 1, 10, 50)
	b.Step() // seq 1 prefilled, decoding from now on
	mustAdd(t, b, 2, 1000, 2)
	st := b.Step()
	// Seq 1 decodes (1 token of budget); seq 2 gets the remaining 255.
	if st.Decodes != 1 || st.PrefillTokens != 255 {
		t.Fatalf("mixed step: decodes=%d prefill=%d, want 1 and 255", st.Decodes, st.PrefillTokens)
	}
	if len(st.Tokens) != 1 || st.Tokens[0].ID != 1 {
		t.Fatalf("mixed step tokens = %+v, want only seq 1's", st.Tokens)
	}
}

func TestBatcherFCFSHeadOfLineBlocks(t *testing.T) {
	p := testProfile()
	p.KVCacheTokens = 1024
	b := mustBatcher(t, p)
	mustAdd(t, b, 1, 600, 100) // 44 blocks
	mustAdd(t, b, 2, 600, 100) // does not fit next to seq 1
	mustAdd(t, b, 3, 16, 16)   // would fit, but waits behind seq 2
	b.Step()
	if s := b.Stats(); s.Running != 1 || s.Waiting != 2 {
		t.Fatalf("stats = %+v, want 1 running, 2 waiting (FCFS)", s)
	}
}

func TestBatcherPreemption(t *testing.T) {
	p := testProfile()
	p.Preemption = true
	p.KVCacheTokens = 64 // 4 blocks of 16
	b := mustBatcher(t, p)
	mustAdd(t, b, 1, 16, 30) // grows to 46 tokens = 3 blocks
	mustAdd(t, b, 2, 16, 30)
	steps, _ := runToIdle(t, b)
	s := b.Stats()
	if s.Preemptions == 0 {
		t.Fatalf("no preemption with 2 sequences growing to 6 blocks in a 4-block cache (steps %d)", steps)
	}
	if s.KVUsage != 0 {
		t.Fatalf("KV not freed: %+v", s)
	}
}

func TestBatcherPreemptionRecomputesAndFinishes(t *testing.T) {
	p := testProfile()
	p.Preemption = true
	p.KVCacheTokens = 64
	b := mustBatcher(t, p)
	mustAdd(t, b, 1, 16, 30)
	mustAdd(t, b, 2, 16, 30)
	got := map[SeqID]int{}
	for !b.Idle() {
		st := b.Step()
		for _, ev := range st.Tokens {
			if ev.N != got[ev.ID]+1 {
				t.Fatalf("seq %d: token %d after %d", ev.ID, ev.N, got[ev.ID])
			}
			got[ev.ID] = ev.N
		}
	}
	if got[1] != 30 || got[2] != 30 {
		t.Fatalf("tokens = %v, want 30 each", got)
	}
}

func TestBatcherAbortFreesKV(t *testing.T) {
	b := mustBatcher(t, testProfile())
	mustAdd(t, b, 1, 100, 100)
	mustAdd(t, b, 2, 100, 100)
	b.Step()
	if !b.Abort(1) || b.Abort(1) {
		t.Fatal("Abort should report a known sequence once")
	}
	if !b.Abort(2) {
		t.Fatal("abort of running seq 2 failed")
	}
	if !b.Idle() || b.Stats().KVUsage != 0 {
		t.Fatalf("after aborts: idle=%v stats=%+v", b.Idle(), b.Stats())
	}
	if st := b.Step(); !st.Idle {
		t.Fatalf("step after aborts = %+v, want idle", st)
	}
}

func TestBatcherAddErrors(t *testing.T) {
	b := mustBatcher(t, testProfile())
	mustAdd(t, b, 1, 10, 10)
	tests := []struct {
		name           string
		id             SeqID
		prompt, tokens int
		want           error
	}{
		{"duplicate", 1, 10, 10, ErrDuplicateSeq},
		{"zero prompt", 2, 0, 10, ErrBadSequence},
		{"zero tokens", 3, 10, 0, ErrBadSequence},
		{"exceeds kv", 4, 4000, 200, ErrExceedsKVCache},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := b.Add(tt.id, tt.prompt, tt.tokens); !errors.Is(err, tt.want) {
				t.Fatalf("Add = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestProfilesValid(t *testing.T) {
	for _, n := range ProfileNames() {
		p, err := LookupProfile(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
	if _, err := LookupProfile("nope"); !errors.Is(err, ErrUnknownProfile) {
		t.Fatalf("LookupProfile(nope) = %v", err)
	}
	bad := testProfile()
	bad.MaxBatchedTokens = bad.MaxNumSeqs
	if err := bad.Validate(); err == nil {
		t.Fatal("profile with a budget that cannot fit prefill validated")
	}
}
