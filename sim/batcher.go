package sim

import (
	"container/list"
	"errors"
	"fmt"
	"time"
)

// SeqID names a sequence inside one Batcher.
type SeqID uint64

// Errors returned by Batcher.Add; check with errors.Is.
var (
	// ErrDuplicateSeq: the id is already queued or running.
	ErrDuplicateSeq = errors.New("sim: duplicate sequence id")
	// ErrExceedsKVCache: prompt+max_tokens can never fit the KV cache, so the
	// sequence would wait forever.
	ErrExceedsKVCache = errors.New("sim: sequence exceeds the KV cache")
	// ErrBadSequence: a token count is not positive.
	ErrBadSequence = errors.New("sim: prompt and max tokens must be positive")
)

// Batcher is the pure continuous-batching model of one engine: a FCFS
// waiting queue, a running batch capped by MaxNumSeqs and by the KV cache,
// chunked prefill under a per-step token budget, and one token per decoding
// sequence per step. It holds no clock and starts no goroutine: the owner
// calls Step, waits Step.Duration (real or virtual) and then applies the
// returned events. It is not safe for concurrent use; one goroutine owns it.
//
// Scheduling follows vLLM's v1 scheduler. Each step first schedules the
// running sequences in admission order (a decoding sequence takes one token
// of the budget, a sequence still prefilling takes the next chunk of its
// prompt), then admits waiting sequences from the head of the queue while a
// batch slot, KV blocks and budget remain. The head of the queue blocks the
// ones behind it. A sequence whose prefill completes in a step samples its
// first token at the end of that step.
//
// Automatic prefix caching follows vLLM's (v1 KVCacheManager): a sequence
// added with AddBlocks names the hash chain of its prompt's full blocks;
// a block whose computation completes is registered under its hash while
// no other block holds that hash; at admission the longest run of leading
// blocks found in the cache is reused (at most the prompt less one token,
// as vLLM always computes the last prompt token) and only the rest is
// prefilled. A block no sequence holds stays cached until a new
// allocation evicts it, least recently freed first (a sequence's tail
// blocks before its head). Prefix-cache queries
// and hits are counted in prompt tokens at every admission, as vLLM's
// prefix_cache_queries and prefix_cache_hits counters are. Sequences
// added with Add have no hashes: they neither reuse nor leave blocks.
type Batcher struct {
	p       Profile
	blocks  int // KV blocks in total
	free    int // KV blocks not held by a running sequence (cached ones included)
	waiting []*bseq
	running []*bseq
	byID    map[SeqID]*bseq

	// The prefix cache: every registered block by hash, and the ones no
	// sequence holds in eviction order (front = least recently freed).
	cache     map[uint64]*kvBlock
	evictable *list.List

	preemptions  int64
	prefixQuery  int64
	prefixHit    int64
	prefixEvicts int64
	out          Step
	sched        []sched
}

// kvBlock is one registered (hashed) KV block of the prefix cache.
type kvBlock struct {
	hash uint64
	refs int           // running sequences holding it
	lru  *list.Element // in evictable while refs == 0
}

type bseq struct {
	id        SeqID
	prompt    int
	maxTokens int
	generated int  // output tokens sampled so far
	target    int  // tokens to prefill: the prompt, or prompt+generated after a preemption
	computed  int  // prefill progress towards target
	decoding  bool // prefill complete
	blocks    int  // KV blocks held (hashed and plain)
	counted   bool // prompt tokens already reported
	// hashes is the hash chain of the prompt's full blocks (nil: none);
	// held are the registered blocks the sequence holds, blocks
	// 0..len(held)-1 of its prompt.
	hashes []uint64
	held   []*kvBlock
}

type sched struct {
	q     *bseq
	chunk int // 0 for a decode
}

// Step is what one engine step does. The slices are owned by the Batcher and
// valid until the next call to Step.
type Step struct {
	// Duration is the model time the step takes; zero when idle.
	Duration time.Duration
	// PrefillDuration is the part of Duration due to prefill compute: for a
	// fitted profile PrefillTokens ÷ PrefillTokensPerSec, for a physics
	// profile Duration less the duration of the same step without its
	// prefill chunks (all of Duration when nothing decodes). Zero when the
	// step prefills nothing.
	PrefillDuration time.Duration
	// Idle is true when there was nothing to schedule.
	Idle bool
	// Scheduled is the number of sequences in the step (the batch).
	Scheduled int
	// Decodes is the number of sequences that decoded one token.
	Decodes int
	// PrefillTokens is the number of prompt tokens computed.
	PrefillTokens int
	// ContextTokens is the context (prompt plus generated) of the decoding
	// sequences, which attention reads.
	ContextTokens int
	// PromptTokensDone counts the prompt tokens of sequences whose first
	// prefill completed this step (vLLM's prompt-token counter).
	PromptTokensDone int
	// Tokens lists the sequences that produced a token, in schedule order.
	Tokens []TokenEvent
	// Preempted lists sequences preempted to make room in the KV cache.
	Preempted []SeqID
	// Admitted lists sequences that entered the running batch this step.
	Admitted []SeqID
}

// TokenEvent reports one sampled token.
type TokenEvent struct {
	ID SeqID
	// N is the number of output tokens of the sequence including this one;
	// N == 1 is the first token.
	N int
	// Done is true when the sequence reached its max tokens and left the
	// batch.
	Done bool
}

// BatcherStats is a snapshot of the scheduler state.
type BatcherStats struct {
	Running, Waiting int
	// KVUsage is the fraction of KV blocks in use, 0–1 (cached blocks no
	// sequence holds are free, as vLLM counts them).
	KVUsage float64
	// Preemptions counts preemptions since the Batcher was created.
	Preemptions int64
	// PrefixQueries and PrefixHits count, over every admission, the
	// prompt tokens looked up in the prefix cache and those found there
	// (vLLM's prefix_cache_queries and prefix_cache_hits). Only
	// sequences added with block hashes are looked up.
	PrefixQueries, PrefixHits int64
	// PrefixEvictions counts cached blocks evicted to make room.
	PrefixEvictions int64
	// CachedBlocks is the number of blocks registered in the prefix cache
	// (held or not).
	CachedBlocks int
}

// NewBatcher returns an empty batcher for the profile, which must be valid.
func NewBatcher(p Profile) (*Batcher, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	n := p.KVCacheTokens / p.BlockSize
	return &Batcher{p: p, blocks: n, free: n, byID: make(map[SeqID]*bseq),
		cache: make(map[uint64]*kvBlock), evictable: list.New()}, nil
}

// BlockSize returns the KV block size in tokens, the unit of the hash
// chains AddBlocks takes.
func (b *Batcher) BlockSize() int { return b.p.BlockSize }

func (b *Batcher) blocksFor(tokens int) int {
	return (tokens + b.p.BlockSize - 1) / b.p.BlockSize
}

// Add queues a sequence at the tail of the waiting queue, without prefix
// caching.
func (b *Batcher) Add(id SeqID, promptTokens, maxTokens int) error {
	return b.AddBlocks(id, promptTokens, maxTokens, nil)
}

// AddBlocks queues a sequence whose prompt's full blocks have the hash
// chain hashes: hashes[i] names block i (tokens i×BlockSize up to
// (i+1)×BlockSize) and everything before it, as vLLM's block hashes do,
// so two prompts share block i's hash only if they share every token up
// to its end. At most promptTokens/BlockSize hashes are used; the rest are
// ignored. The Batcher keeps the slice; the caller must not change it.
func (b *Batcher) AddBlocks(id SeqID, promptTokens, maxTokens int, hashes []uint64) error {
	if promptTokens < 1 || maxTokens < 1 {
		return fmt.Errorf("%w: prompt %d, max tokens %d", ErrBadSequence, promptTokens, maxTokens)
	}
	if _, ok := b.byID[id]; ok {
		return fmt.Errorf("%w: %d", ErrDuplicateSeq, id)
	}
	if need := b.blocksFor(promptTokens + maxTokens); need > b.blocks {
		return fmt.Errorf("%w: %d tokens, cache holds %d", ErrExceedsKVCache, promptTokens+maxTokens, b.blocks*b.p.BlockSize)
	}
	if full := promptTokens / b.p.BlockSize; len(hashes) > full {
		hashes = hashes[:full]
	}
	q := &bseq{id: id, prompt: promptTokens, maxTokens: maxTokens, target: promptTokens, hashes: hashes}
	b.byID[id] = q
	b.waiting = append(b.waiting, q)
	return nil
}

// Abort removes a sequence wherever it is and frees its KV blocks. It
// reports whether the sequence was known.
func (b *Batcher) Abort(id SeqID) bool {
	q, ok := b.byID[id]
	if !ok {
		return false
	}
	delete(b.byID, id)
	b.release(q)
	b.running = remove(b.running, q)
	b.waiting = remove(b.waiting, q)
	return true
}

func remove(s []*bseq, q *bseq) []*bseq {
	for i, x := range s {
		if x == q {
			copy(s[i:], s[i+1:])
			s[len(s)-1] = nil
			return s[:len(s)-1]
		}
	}
	return s
}

// Idle reports whether no sequence is waiting or running.
func (b *Batcher) Idle() bool { return len(b.running) == 0 && len(b.waiting) == 0 }

// Stats returns the current scheduler state.
func (b *Batcher) Stats() BatcherStats {
	return BatcherStats{
		Running:     len(b.running),
		Waiting:     len(b.waiting),
		KVUsage:     float64(b.blocks-b.free) / float64(b.blocks),
		Preemptions: b.preemptions,

		PrefixQueries:   b.prefixQuery,
		PrefixHits:      b.prefixHit,
		PrefixEvictions: b.prefixEvicts,
		CachedBlocks:    len(b.cache),
	}
}

// CachedPrefixTokens returns how many leading tokens of a prompt of
// promptTokens tokens with the block hash chain hashes the prefix cache
// would serve if it were admitted now (vLLM's rule: whole blocks, at most
// the prompt less one token). It changes nothing; a router that knows the
// engine's cache exactly (the benchmark's precise-prefix policy) reads
// it.
func (b *Batcher) CachedPrefixTokens(promptTokens int, hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if _, ok := b.cache[h]; !ok {
			break
		}
		n++
	}
	return min(n, b.maxHitBlocks(promptTokens)) * b.p.BlockSize
}

// maxHitBlocks is the most prompt blocks a hit may cover: vLLM computes at
// least the prompt's last token, so a prompt of whole blocks reuses all
// but its last.
func (b *Batcher) maxHitBlocks(promptTokens int) int {
	return (promptTokens - 1) / b.p.BlockSize
}

// lookup returns how many of q's leading blocks the cache holds (hits),
// and how many of those no sequence holds (idle: counted as free now,
// taken from the free pool by admission).
func (b *Batcher) lookup(q *bseq) (hits, idle int) {
	limit := min(len(q.hashes), b.maxHitBlocks(q.target))
	for _, h := range q.hashes[:limit] {
		blk, ok := b.cache[h]
		if !ok {
			break
		}
		hits++
		if blk.refs == 0 {
			idle++
		}
	}
	return hits, idle
}

// admit gives q its need blocks: the hits leading cached blocks (taking
// the idle ones off the eviction list) and need−hits fresh ones, and
// starts its prefill after the cached tokens.
func (b *Batcher) admit(q *bseq, hits, need int) {
	q.held = q.held[:0]
	for _, h := range q.hashes[:hits] {
		blk := b.cache[h]
		if blk.refs == 0 {
			b.evictable.Remove(blk.lru)
			blk.lru = nil
			b.free--
		}
		blk.refs++
		q.held = append(q.held, blk)
	}
	b.alloc(need - hits)
	q.blocks = need
	q.computed = hits * b.p.BlockSize
	if len(q.hashes) > 0 {
		b.prefixQuery += int64(q.target)
		b.prefixHit += int64(q.computed)
	}
}

// alloc takes n fresh blocks from the free pool, evicting the least
// recently freed cached blocks when the uncached free blocks run out. The
// caller has checked that n blocks are free.
func (b *Batcher) alloc(n int) {
	b.free -= n
	for b.free < b.evictable.Len() {
		blk := b.evictable.Remove(b.evictable.Front()).(*kvBlock)
		delete(b.cache, blk.hash)
		b.prefixEvicts++
	}
}

// register makes q's prompt blocks whose computation has completed
// findable in the cache. A hash another block already holds (the same
// prefix computed at the same time by another sequence) stays with that
// block: q's copy is plain, and so are all q's later blocks, as a chain
// can only be found from its start.
func (b *Batcher) register(q *bseq) {
	done := min(q.computed/b.p.BlockSize, len(q.hashes))
	for i := len(q.held); i < done; i++ {
		h := q.hashes[i]
		if _, ok := b.cache[h]; ok {
			return
		}
		blk := &kvBlock{hash: h, refs: 1}
		b.cache[h] = blk
		q.held = append(q.held, blk)
	}
}

// release returns q's blocks: plain ones to the free pool, registered
// ones to the eviction list once no sequence holds them. As vLLM's
// free_blocks does, a sequence's blocks join the list tail first, so its
// last blocks are evicted before its first and a shared head survives
// longest.
func (b *Batcher) release(q *bseq) {
	b.free += q.blocks - len(q.held)
	for i := len(q.held) - 1; i >= 0; i-- {
		blk := q.held[i]
		blk.refs--
		if blk.refs == 0 {
			blk.lru = b.evictable.PushBack(blk)
			b.free++
		}
	}
	q.held = q.held[:0]
	q.blocks = 0
}

// preemptLast frees the most recently admitted running sequence and puts it
// at the head of the waiting queue for recomputation.
func (b *Batcher) preemptLast() *bseq {
	v := b.running[len(b.running)-1]
	b.running[len(b.running)-1] = nil
	b.running = b.running[:len(b.running)-1]
	b.release(v)
	v.decoding = false
	v.computed = 0
	v.target = v.prompt + v.generated
	b.waiting = append(b.waiting, nil)
	copy(b.waiting[1:], b.waiting)
	b.waiting[0] = v
	b.preemptions++
	b.out.Preempted = append(b.out.Preempted, v.id)
	return v
}

// Step schedules one engine step, applies its effects and returns them. The
// owner must let Step.Duration pass before it publishes the events, and
// calls Step again only after that.
func (b *Batcher) Step() Step {
	b.out = Step{Tokens: b.out.Tokens[:0], Preempted: b.out.Preempted[:0], Admitted: b.out.Admitted[:0]}
	b.sched = b.sched[:0]
	budget := b.scheduleRunning(b.p.MaxBatchedTokens)
	b.admitWaiting(budget)
	if len(b.sched) == 0 {
		b.out.Idle = true
		return b.out
	}
	b.advance()
	return b.out
}

// scheduleRunning schedules the running sequences, in admission order,
// within budget tokens (preempting for a decode's KV block when it must)
// and returns the budget left.
func (b *Batcher) scheduleRunning(budget int) int {
	for i := 0; i < len(b.running) && budget > 0; i++ {
		q := b.running[i]
		if !q.decoding {
			chunk := min(q.target-q.computed, budget)
			budget -= chunk
			b.sched = append(b.sched, sched{q: q, chunk: chunk})
			continue
		}
		if b.p.Preemption {
			// The token sampled last step has its KV written this step.
			need := b.blocksFor(q.prompt + q.generated)
			for q.blocks < need {
				if b.free > 0 {
					b.alloc(1)
					q.blocks++
					continue
				}
				if b.preemptLast() == q {
					break
				}
			}
			if q.blocks < need {
				break // q itself was preempted; it was the last running
			}
		}
		budget--
		b.sched = append(b.sched, sched{q: q})
	}
	return budget
}

// admitWaiting admits sequences from the head of the waiting queue while
// they fit (sequences, KV blocks and the budget left) and schedules their
// first chunk.
func (b *Batcher) admitWaiting(budget int) {
	for len(b.waiting) > 0 && len(b.running) < b.p.MaxNumSeqs && budget > 0 {
		q := b.waiting[0]
		var need int
		if b.p.Preemption {
			need = b.blocksFor(q.target)
		} else {
			need = b.blocksFor(q.prompt + q.maxTokens)
		}
		hits, idle := b.lookup(q)
		if need-hits > b.free-idle {
			break
		}
		b.admit(q, hits, need)
		b.waiting[0] = nil
		b.waiting = b.waiting[1:]
		b.running = append(b.running, q)
		b.out.Admitted = append(b.out.Admitted, q.id)
		chunk := min(q.target-q.computed, budget)
		budget -= chunk
		b.sched = append(b.sched, sched{q: q, chunk: chunk})
	}
}

// advance applies the step: every scheduled sequence advances, finished
// ones leave, and the step's duration is set.
func (b *Batcher) advance() {
	b.out.Scheduled = len(b.sched)
	load := stepLoad{scheduled: len(b.sched)}
	finished := false
	for _, s := range b.sched {
		q := s.q
		if s.chunk == 0 {
			b.out.Decodes++
			b.out.ContextTokens += q.prompt + q.generated
		} else {
			b.out.PrefillTokens += s.chunk
			load.addChunk(q.computed, s.chunk)
			q.computed += s.chunk
			b.register(q)
			if q.computed < q.target {
				continue
			}
			q.decoding = true
			if !q.counted {
				q.counted = true
				b.out.PromptTokensDone += q.prompt
			}
		}
		q.generated++
		done := q.generated >= q.maxTokens
		b.out.Tokens = append(b.out.Tokens, TokenEvent{ID: q.id, N: q.generated, Done: done})
		if done {
			finished = true
			delete(b.byID, q.id)
			b.release(q)
			q.id = 0
			q.maxTokens = -1 // marks it for removal below
		}
	}
	if finished {
		kept := b.running[:0]
		for _, q := range b.running {
			if q.maxTokens >= 0 {
				kept = append(kept, q)
			}
		}
		for i := len(kept); i < len(b.running); i++ {
			b.running[i] = nil
		}
		b.running = kept
	}

	load.decodes, load.decodeCtx = b.out.Decodes, b.out.ContextTokens
	b.out.Duration, b.out.PrefillDuration = b.p.stepDuration(load)
}

// QueuedPrefillTokens returns the prompt tokens not yet prefilled, over the
// waiting sequences and the running sequences still prefilling (a
// preempted sequence counts the prompt and generated tokens it must
// recompute).
func (b *Batcher) QueuedPrefillTokens() int {
	n := 0
	for _, q := range b.waiting {
		n += q.target - q.computed
	}
	for _, q := range b.running {
		if !q.decoding {
			n += q.target - q.computed
		}
	}
	return n
}
