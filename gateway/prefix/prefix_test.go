package prefix

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

func mustIndex(t testing.TB, cfg Config) *Index[string] {
	t.Helper()
	x, err := New[string](cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestTextChainSharesPrefixes(t *testing.T) {
	doc := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog. "), 20) // 900 bytes
	a := TextChain(append(slices.Clone(doc), "what colour is the fox?"...), 100)
	b := TextChain(append(slices.Clone(doc), "which animal is lazy, and why?"...), 100)
	if len(a) != (len(doc)+23)/BlockBytes || len(b) != (len(doc)+30)/BlockBytes {
		t.Fatalf("chain lengths %d, %d: want full blocks only", len(a), len(b))
	}
	shared := len(doc) / BlockBytes
	if !slices.Equal(a[:shared], b[:shared]) {
		t.Fatal("prompts sharing a document do not share its blocks")
	}
	// Same block text at another position has another hash: the chain
	// includes everything before it.
	c := TextChain(append([]byte("x"), doc...), 100)
	if c[1] == a[1] {
		t.Fatal("a block's hash does not depend on what precedes it")
	}
	if got := TextChain(doc, 3); len(got) != 3 || got[2] != a[2] {
		t.Fatal("maxBlocks does not cut the chain")
	}
	if TextChain([]byte("short"), 10) != nil || TextChain(doc, -1) != nil {
		t.Fatal("no full block or maxBlocks < 0 must give no chain")
	}
}

func TestIndexMatchesRecordedPrefixes(t *testing.T) {
	x := mustIndex(t, DefaultConfig())
	chain := []uint64{1, 2, 3, 4}
	x.Record("a", chain, 100)
	for _, tc := range []struct {
		host  string
		chain []uint64
		want  int
	}{
		{"a", []uint64{1, 2, 3, 4, 5}, 4},
		{"a", []uint64{1, 2, 9, 4}, 2},
		{"a", []uint64{9, 2, 3}, 0}, // a chain is found from its start
		{"b", chain, 0},
		{"a", nil, 0},
	} {
		if got := x.Match(tc.host, tc.chain); got != tc.want {
			t.Errorf("Match(%s, %v) = %d, want %d", tc.host, tc.chain, got, tc.want)
		}
	}
	x.Forget("a")
	if got := x.Match("a", chain); got != 0 {
		t.Fatalf("after Forget: %d", got)
	}
	if blocks, hosts := x.Len(); blocks != 0 || hosts != 0 {
		t.Fatalf("after Forget: %d blocks, %d hosts", blocks, hosts)
	}
}

func TestIndexEvictsLeastRecentTailFirst(t *testing.T) {
	x := mustIndex(t, DefaultConfig())
	x.Record("a", []uint64{1, 2, 3, 4}, 6)
	x.Record("a", []uint64{10, 11, 12}, 6) // 7 blocks > 6: one of the first chain goes
	if got := x.Match("a", []uint64{1, 2, 3, 4}); got != 3 {
		t.Fatalf("first chain matches %d, want 3 (its tail evicted first)", got)
	}
	if got := x.Match("a", []uint64{10, 11, 12}); got != 3 {
		t.Fatalf("second chain matches %d, want 3", got)
	}
	// Re-sending the first chain's head makes it recent again.
	x.Record("a", []uint64{1, 2}, 6)
	x.Record("a", []uint64{20, 21}, 6)
	if got := x.Match("a", []uint64{1, 2}); got != 2 {
		t.Fatalf("refreshed head matches %d, want 2", got)
	}
	if blocks, _ := x.Len(); blocks != 6 {
		t.Fatalf("%d blocks held, want the capacity 6", blocks)
	}
}

func TestIndexBounds(t *testing.T) {
	cfg := Config{MaxBlocksPerRequest: 4, MaxBlocksPerHost: 10, MaxHosts: 2, DefaultCapacityBlocks: 5}
	x := mustIndex(t, cfg)
	long := make([]uint64, 100)
	for i := range long {
		long[i] = uint64(i + 1)
	}
	x.Record("a", long, 0)        // cut at 4 blocks, default capacity 5
	x.Record("b", long[50:], 1e6) // capacity capped at 10
	x.Record("c", long[60:], 0)   // a third host drops the least recent ("a")
	if blocks, hosts := x.Len(); hosts != 2 || blocks != 8 {
		t.Fatalf("%d blocks over %d hosts, want 8 over 2", blocks, hosts)
	}
	if x.Match("a", long) != 0 || x.Match("b", long[50:]) != 4 {
		t.Fatal("wrong host dropped")
	}
	if _, err := New[string](Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("zero config: %v", err)
	}
}

// FuzzIndex: whatever text and hosts clients send, chains stay cut, the
// index stays within its bounds and Match never exceeds the chain.
func FuzzIndex(f *testing.F) {
	f.Add([]byte("hello"), "h", uint8(3))
	f.Add(bytes.Repeat([]byte("a"), 700), "h2", uint8(0))
	cfg := Config{MaxBlocksPerRequest: 8, MaxBlocksPerHost: 16, MaxHosts: 3, DefaultCapacityBlocks: 12}
	x := mustIndex(f, cfg)
	f.Fuzz(func(t *testing.T, text []byte, host string, capacity uint8) {
		chain := TextChain(text, 1<<20)
		if len(chain) != len(text)/BlockBytes {
			t.Fatalf("%d blocks for %d bytes", len(chain), len(text))
		}
		x.Record(host, chain, int(capacity))
		if m := x.Match(host, chain); m > min(len(chain), cfg.MaxBlocksPerRequest) {
			t.Fatalf("match %d beyond the chain", m)
		}
		if blocks, hosts := x.Len(); hosts > cfg.MaxHosts || blocks > cfg.MaxHosts*cfg.MaxBlocksPerHost {
			t.Fatalf("%d blocks over %d hosts: beyond the bounds", blocks, hosts)
		}
	})
}
