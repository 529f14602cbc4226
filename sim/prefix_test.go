package sim

import (
	"testing"

	"pgregory.net/rapid"
)

// chain returns n block hashes of a prompt stream named key: blocks of the
// same key share hashes up to the shorter chain, as prompts with a common
// prefix do.
func chain(key uint64, n int) []uint64 {
	hs := make([]uint64, n)
	h := key * 0x9e3779b97f4a7c15
	for i := range hs {
		h = (h ^ uint64(i+1)) * 0x100000001b3
		hs[i] = h
	}
	return hs
}

func mustAddBlocks(t *testing.T, b *Batcher, id SeqID, prompt, out int, hs []uint64) {
	t.Helper()
	if err := b.AddBlocks(id, prompt, out, hs); err != nil {
		t.Fatal(err)
	}
}

// prefillTokens runs to idle and returns the prompt tokens computed.
func prefillTokens(t *testing.T, b *Batcher) int {
	t.Helper()
	n := 0
	for steps := 0; !b.Idle(); steps++ {
		if steps > 100000 {
			t.Fatal("batcher does not converge")
		}
		n += b.Step().PrefillTokens
	}
	return n
}

func TestPrefixCacheReusesASharedPrefix(t *testing.T) {
	b := mustBatcher(t, testProfile())
	mustAddBlocks(t, b, 1, 320, 4, chain(7, 20))
	if got := prefillTokens(t, b); got != 320 {
		t.Fatalf("first request prefilled %d tokens, want 320", got)
	}
	if got := b.CachedPrefixTokens(400, chain(7, 25)); got != 320 {
		t.Fatalf("CachedPrefixTokens = %d, want the 320 cached", got)
	}
	// A longer prompt with the same first 20 blocks prefills only the rest.
	mustAddBlocks(t, b, 2, 400, 4, chain(7, 25))
	if got := prefillTokens(t, b); got != 80 {
		t.Fatalf("second request prefilled %d tokens, want 80", got)
	}
	st := b.Stats()
	if st.PrefixQueries != 720 || st.PrefixHits != 320 {
		t.Fatalf("queries/hits = %d/%d, want 720/320", st.PrefixQueries, st.PrefixHits)
	}
	// Another stream shares nothing.
	mustAddBlocks(t, b, 3, 320, 4, chain(8, 20))
	if got := prefillTokens(t, b); got != 320 {
		t.Fatalf("unrelated request prefilled %d tokens, want 320", got)
	}
	if st := b.Stats(); st.KVUsage != 0 {
		t.Fatalf("KV use %v after all finished, want 0 (cached blocks are free)", st.KVUsage)
	}
}

func TestPrefixCacheAlwaysComputesTheLastToken(t *testing.T) {
	b := mustBatcher(t, testProfile())
	mustAddBlocks(t, b, 1, 320, 4, chain(1, 20))
	prefillTokens(t, b)
	// The same prompt again: every block is cached, but vLLM computes the
	// last token, so the last block is recomputed.
	if got := b.CachedPrefixTokens(320, chain(1, 20)); got != 304 {
		t.Fatalf("CachedPrefixTokens = %d, want 304", got)
	}
	mustAddBlocks(t, b, 2, 320, 4, chain(1, 20))
	if got := prefillTokens(t, b); got != 16 {
		t.Fatalf("prefilled %d, want 16", got)
	}
}

func TestPrefixCacheEvictsLeastRecentlyFreed(t *testing.T) {
	p := testProfile()
	p.KVCacheTokens = 1024 // 64 blocks
	b := mustBatcher(t, p)
	// Two 24-block prompts fill 48 blocks of cache (+1 each for output).
	mustAddBlocks(t, b, 1, 384, 4, chain(1, 24))
	prefillTokens(t, b)
	mustAddBlocks(t, b, 2, 384, 4, chain(2, 24))
	prefillTokens(t, b)
	// A third needs 25 fresh blocks: 64 − 48 = 16 uncached free, so 9
	// blocks of the least recently freed (stream 1) are evicted, its tail
	// first, as vLLM frees a request's blocks in reverse: its first 15
	// blocks survive.
	mustAddBlocks(t, b, 3, 384, 4, chain(3, 24))
	prefillTokens(t, b)
	if got := b.CachedPrefixTokens(384, chain(2, 24)); got != 368 {
		t.Fatalf("stream 2 cached %d, want 368 (intact)", got)
	}
	if got := b.CachedPrefixTokens(384, chain(1, 24)); got != 240 {
		t.Fatalf("stream 1 cached %d, want 240 (15 head blocks)", got)
	}
	if st := b.Stats(); st.PrefixEvictions == 0 {
		t.Fatal("no eviction counted")
	}
}

func TestPrefixCacheSharedWhileRunning(t *testing.T) {
	b := mustBatcher(t, testProfile())
	// The first request's prefix is cached once its prefill completes;
	// a second added while the first still decodes reuses it.
	mustAddBlocks(t, b, 1, 256, 50, chain(5, 16))
	for b.Stats().PrefixQueries == 0 || b.CachedPrefixTokens(256, chain(5, 16)) == 0 {
		b.Step()
	}
	mustAddBlocks(t, b, 2, 256, 4, chain(5, 16))
	if got := prefillTokens(t, b); got != 16 {
		t.Fatalf("second prefilled %d, want 16", got)
	}
}

// TestPrefixCacheBlockAccounting checks, under random adds, aborts and
// steps with and without preemption, that free blocks plus blocks held by
// sequences (a shared block once) equal the cache, and that cached blocks no one holds are free.
func TestPrefixCacheBlockAccounting(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := testProfile()
		p.KVCacheTokens = 16 * rapid.IntRange(40, 120).Draw(rt, "blocks")
		p.Preemption = rapid.Bool().Draw(rt, "preemption")
		b, err := NewBatcher(p)
		if err != nil {
			rt.Fatal(err)
		}
		var next SeqID
		for range rapid.IntRange(1, 200).Draw(rt, "ops") {
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0, 1:
				next++
				prompt := rapid.IntRange(1, 600).Draw(rt, "prompt")
				key := uint64(rapid.IntRange(0, 4).Draw(rt, "key"))
				_ = b.AddBlocks(next, prompt, rapid.IntRange(1, 40).Draw(rt, "out"), chain(key, prompt/16))
			case 2:
				b.Abort(SeqID(rapid.IntRange(1, int(next)+1).Draw(rt, "abort")))
			default:
				b.Step()
			}
			held := 0
			for _, q := range b.running {
				held += q.blocks - len(q.held) // plain blocks
				if len(q.held) > q.blocks {
					rt.Fatalf("seq %d holds %d hashed of %d blocks", q.id, len(q.held), q.blocks)
				}
			}
			for _, q := range b.waiting {
				if q.blocks != 0 || len(q.held) != 0 {
					rt.Fatalf("waiting seq %d holds blocks", q.id)
				}
			}
			if b.evictable.Len() > b.free {
				rt.Fatalf("%d evictable > %d free", b.evictable.Len(), b.free)
			}
			idle := 0
			for _, blk := range b.cache {
				if blk.refs < 0 || (blk.refs == 0) != (blk.lru != nil) {
					rt.Fatalf("block refs %d, on list %v", blk.refs, blk.lru != nil)
				}
				if blk.refs == 0 {
					idle++
				} else {
					held++ // a shared block counts once
				}
			}
			if b.free+held != b.blocks {
				rt.Fatalf("free %d + held %d != %d", b.free, held, b.blocks)
			}
			if idle != b.evictable.Len() {
				rt.Fatalf("%d idle cached blocks, %d on the eviction list", idle, b.evictable.Len())
			}
		}
	})
}
