package sim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
)

const testBlock = 16

func mustParse(t testing.TB, body string, chat bool) genRequest {
	t.Helper()
	r, err := parseGenRequest([]byte(body), chat)
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	return r
}

func chatBody(msgs ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, c := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		ms = append(ms, msg{role, c})
	}
	b, _ := json.Marshal(map[string]any{"messages": ms})
	return string(b)
}

func textBody(s string) string {
	b, _ := json.Marshal(map[string]any{"prompt": s})
	return string(b)
}

// sharedBlocks counts the leading hashes a and b have in common.
func sharedBlocks(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// The hash of a known prompt is pinned: the tokenizer and hasher are fixed
// across processes and releases, so a router or benchmark can rely on
// them.
func TestBlockHashesPinned(t *testing.T) {
	r := mustParse(t, textBody(strings.Repeat("abcd", 40)), false)
	hs := r.prompts[0].blockHashes(testBlock)
	if len(hs) != 2 {
		t.Fatalf("%d hashes for 40 tokens, want 2", len(hs))
	}
	// Block 0 and block 1 hold the same tokens but not the same prefix.
	if hs[0] == hs[1] {
		t.Fatal("equal tokens at different depths hash alike: the parent is not chained")
	}
	const want0, want1 = 0x9dcb33ddc1b70bcc, 0xa27e53f13125d3a4
	if hs[0] != want0 || hs[1] != want1 {
		t.Errorf("hashes %#x %#x, want %#x %#x (the tokenizer or hash changed)", hs[0], hs[1], uint64(want0), uint64(want1))
	}
	// The same from the documented rule, with the standard library's FNV.
	h32 := fnv.New32a()
	h32.Write([]byte("abcd"))
	tok := uint64(h32.Sum32())
	parent := uint64(rootHash)
	root := fnv.New64a()
	root.Write([]byte("isobar-sim"))
	if root.Sum64() != parent {
		t.Fatalf("rootHash %#x is not FNV-1a 64 of \"isobar-sim\" (%#x)", parent, root.Sum64())
	}
	for i, got := range hs {
		h := fnv.New64a()
		h.Write(binary.LittleEndian.AppendUint64(nil, parent))
		for range testBlock {
			h.Write(binary.LittleEndian.AppendUint64(nil, tok))
		}
		if got != h.Sum64() {
			t.Fatalf("block %d: %#x, the documented rule gives %#x", i, got, h.Sum64())
		}
		parent = h.Sum64()
	}
}

func TestBlockHashesShareAPrefix(t *testing.T) {
	base := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 30) // 1350 bytes
	a := base[:1024] + strings.Repeat("x", 400)
	b := base[:1024] + strings.Repeat("y", 400)
	ha := mustParse(t, textBody(a), false).prompts[0].blockHashes(testBlock)
	hb := mustParse(t, textBody(b), false).prompts[0].blockHashes(testBlock)
	// 1024 bytes = 256 tokens = 16 blocks in common, then they differ.
	if got := sharedBlocks(ha, hb); got != 16 {
		t.Fatalf("shared %d blocks, want 16", got)
	}
	if len(ha) != (1424/4)/testBlock {
		t.Fatalf("%d hashes, want %d", len(ha), (1424/4)/testBlock)
	}
	// A prompt that differs in its first byte shares nothing.
	hc := mustParse(t, textBody("T"+a[1:]), false).prompts[0].blockHashes(testBlock)
	if got := sharedBlocks(ha, hc); got != 0 {
		t.Fatalf("shared %d blocks after a first-byte change, want 0", got)
	}
}

// A conversation's next turn renders its history exactly as before, so
// every full block of the previous turn's prompt is shared.
func TestBlockHashesChatHistoryIsAPrefix(t *testing.T) {
	u1, a1, u2 := strings.Repeat("hello there ", 90), strings.Repeat(" the engine", 60), strings.Repeat("and then? ", 70)
	turn1 := mustParse(t, chatBody(u1), true).prompts[0]
	turn2 := mustParse(t, chatBody(u1, a1, u2), true).prompts[0]
	h1, h2 := turn1.blockHashes(testBlock), turn2.blockHashes(testBlock)
	if len(h1) != turn1.tokens/testBlock || len(h2) != turn2.tokens/testBlock {
		t.Fatalf("hash counts %d, %d for %d, %d tokens", len(h1), len(h2), turn1.tokens, turn2.tokens)
	}
	if got := sharedBlocks(h1, h2); got != len(h1) {
		t.Fatalf("second turn shares %d of the first turn's %d blocks", got, len(h1))
	}
	// The role is part of the template: the same text as another role is
	// another prompt.
	sys := mustParse(t, strings.Replace(chatBody(u1), `"user"`, `"system"`, 1), true).prompts[0]
	if got := sharedBlocks(h1, sys.blockHashes(testBlock)); got != 0 {
		t.Fatalf("user and system messages share %d blocks", got)
	}
	// Content given as parts tokenizes part by part, as it counts.
	parts := mustParse(t, `{"messages":[{"role":"user","content":[{"type":"text","text":"`+u1+`"}]}]}`, true).prompts[0]
	if parts.tokens != turn1.tokens || !slices.Equal(parts.blockHashes(testBlock), h1) {
		t.Fatal("a single text part does not tokenize like the same string content")
	}
}

func TestBlockHashesTokenIDs(t *testing.T) {
	ids := func(from, n int) string {
		var b strings.Builder
		b.WriteString(`{"prompt":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(itoa(from + i))
		}
		b.WriteString("]}")
		return b.String()
	}
	a := mustParse(t, ids(1, 40), false).prompts[0]
	b := mustParse(t, ids(1, 70), false).prompts[0]
	ha, hb := a.blockHashes(testBlock), b.blockHashes(testBlock)
	if len(ha) != 2 || len(hb) != 4 || sharedBlocks(ha, hb) != 2 {
		t.Fatalf("hashes %d and %d sharing %d; want 2 and 4 sharing 2", len(ha), len(hb), sharedBlocks(ha, hb))
	}
	c := mustParse(t, ids(2, 40), false).prompts[0]
	if sharedBlocks(ha, c.blockHashes(testBlock)) != 0 {
		t.Fatal("different ids share a block")
	}
	// Lists of lists: each prompt its own chain.
	lists := mustParse(t, `{"prompt":[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],[1,2]]}`, false)
	if got := lists.prompts[0].blockHashes(testBlock); len(got) != 1 || got[0] != ha[0] {
		t.Fatalf("list-of-lists prompt hashes %v, want the first block of the flat list", got)
	}
	if got := lists.prompts[1].blockHashes(testBlock); len(got) != 0 {
		t.Fatalf("a 2-token prompt has %d full blocks", len(got))
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// FuzzPromptBlockHashes: for any request the parser accepts, every prompt
// hashes to exactly tokens/16 blocks, deterministically, without
// panicking; a text prompt extended by more text (and a chat extended by
// another message) keeps every full block of the original.
func FuzzPromptBlockHashes(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"` + strings.Repeat("abcd", 40) + `"}`,
		`{"prompt":["` + strings.Repeat("héllo", 30) + `","b"]}`,
		`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`,
		`{"prompt":[[9223372036854775807,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],[2,3]]}`,
		`{"messages":[{"role":"user","content":"` + strings.Repeat("hi ", 50) + `"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]},{"role":"assistant","content":null}]}`,
	} {
		f.Add([]byte(s), false, []byte("more text"))
		f.Add([]byte(s), true, []byte(strings.Repeat("x", 70)))
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool, more []byte) {
		if len(body) > 1<<16 || len(more) > 1<<12 {
			return
		}
		r, err := parseGenRequest(body, chat)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v does not wrap errBadRequest", err)
			}
			return
		}
		for _, p := range r.prompts {
			h := p.blockHashes(testBlock)
			if len(h) != p.tokens/testBlock {
				t.Fatalf("%d hashes for %d tokens", len(h), p.tokens)
			}
			if !slices.Equal(h, p.blockHashes(testBlock)) {
				t.Fatal("hashing is not deterministic")
			}
			var longer prompt
			switch {
			case p.msgs != nil:
				longer = prompt{msgs: append(slices.Clip(p.msgs), chatTurn{role: "user", parts: []string{string(more)}})}
				longer.tokens = p.tokens + textTokens(string(more)) + chatTokensPerMessage
			case p.ids != nil:
				continue
			default:
				// Pad to whole tokens so the original's chunks stay intact.
				text := p.text + strings.Repeat(" ", (bytesPerToken-len(p.text)%bytesPerToken)%bytesPerToken) + string(more)
				longer = prompt{text: text, tokens: textTokens(text)}
			}
			if got := sharedBlocks(h, longer.blockHashes(testBlock)); got != len(h) {
				t.Fatalf("extending the prompt kept %d of its %d blocks", got, len(h))
			}
		}
	})
}
