package sim

// The simulator's tokenizer and block hasher: how the engine turns a
// request's prompt into token ids, and those into the hash chain of the
// prompt's full KV blocks that the Batcher's prefix cache looks up.
//
// Tokens. Text is cut into 4-byte chunks from its start (the last chunk
// may be shorter), one token each, so n bytes count ceil(n/4) tokens; a
// token's id is FNV-1a (32-bit) of its chunk's bytes. A chat request is
// rendered message by message with a fixed template, four tokens per
// message around its content:
//
//	<|start_header_id|> role <|end_header_id|> content… <|eot_id|>
//
// (Llama 3's special token ids 128006, 128007 and 128009; the role is one
// token, FNV-1a of its bytes; a content given as parts is each part's text
// in order, each cut into chunks from its own start.) Each message is
// tokenized on its own, so a conversation whose history grows keeps its
// earlier messages' tokens as a prefix. A prompt given as token ids is
// those ids.
//
// Blocks. Every full block of BlockSize tokens gets the hash of its parent
// block's hash and its own token ids, as vLLM's hash(parent_hash,
// block_tokens) does: FNV-1a (64-bit) over the parent hash and then each
// token id, 8 little-endian bytes each, starting from a fixed root for the
// first block. So two prompts share block i's hash only if they share
// every token up to its end. A trailing partial block has no hash. The
// hash is fixed across processes and runs; it is not collision-resistant
// against a client that crafts prompts to collide, which a simulator does
// not need.

const (
	// bytesPerToken is the simulator's tokenizer rule.
	bytesPerToken = 4

	// The chat template's special tokens (Llama 3's ids).
	tokStartHeader = 128006
	tokEndHeader   = 128007
	tokEOT         = 128009

	fnv32Offset = 2166136261
	fnv32Prime  = 16777619
	fnv64Offset = 14695981039346656037
	fnv64Prime  = 1099511628211

	// rootHash is the parent hash of a prompt's first block (vLLM's
	// NONE_HASH): FNV-1a 64 of "isobar-sim".
	rootHash = 0xa45b5d1d1c0e7165
)

// textTokens is the token count of text: ceil(bytes/4).
func textTokens(s string) int { return (len(s) + bytesPerToken - 1) / bytesPerToken }

// tokenID is the id of one chunk of text (or of a chat role): FNV-1a 32.
func tokenID(chunk string) uint64 {
	h := uint32(fnv32Offset)
	for i := 0; i < len(chunk); i++ {
		h ^= uint32(chunk[i])
		h *= fnv32Prime
	}
	return uint64(h)
}

// fnv64Word folds the 8 little-endian bytes of v into h (FNV-1a 64).
func fnv64Word(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= fnv64Prime
		v >>= 8
	}
	return h
}

// blockChain streams a prompt's token ids into the hash chain of its full
// blocks. It holds one block's running hash, not the tokens; it stops
// hashing once the prompt's full blocks are all hashed.
type blockChain struct {
	size  int      // tokens per block
	limit int      // full blocks of the prompt
	h     uint64   // running hash of the current block, parent included
	n     int      // tokens in the current block
	out   []uint64 // hashes of the full blocks so far
}

// newBlockChain starts the chain of a prompt of tokens tokens.
func newBlockChain(blockSize, tokens int) *blockChain {
	c := &blockChain{size: blockSize, limit: tokens / blockSize}
	c.out = make([]uint64, 0, c.limit)
	c.h = fnv64Word(fnv64Offset, rootHash)
	return c
}

func (c *blockChain) done() bool { return len(c.out) >= c.limit }

// add appends one token id.
func (c *blockChain) add(tok uint64) {
	if c.done() {
		return
	}
	c.h = fnv64Word(c.h, tok)
	c.n++
	if c.n == c.size {
		c.out = append(c.out, c.h)
		c.h, c.n = fnv64Word(fnv64Offset, c.h), 0
	}
}

// addText appends the tokens of s: its 4-byte chunks from its start.
func (c *blockChain) addText(s string) {
	for i := 0; i < len(s) && !c.done(); i += bytesPerToken {
		c.add(tokenID(s[i:min(i+bytesPerToken, len(s))]))
	}
}

// blockHashes returns the hash chain of p's full blocks of blockSize
// tokens (tokens/blockSize hashes). The work is linear in the prompt.
func (p *prompt) blockHashes(blockSize int) []uint64 {
	c := newBlockChain(blockSize, p.tokens)
	switch {
	case p.msgs != nil:
		for _, m := range p.msgs {
			c.add(tokStartHeader)
			c.add(tokenID(m.role))
			c.add(tokEndHeader)
			for _, part := range m.parts {
				c.addText(part)
			}
			c.add(tokEOT)
		}
	case p.ids != nil:
		for _, id := range p.ids {
			c.add(uint64(id))
		}
	default:
		c.addText(p.text)
	}
	return c.out
}
