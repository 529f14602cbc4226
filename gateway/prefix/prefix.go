package prefix

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
)

// ErrInvalidConfig: a Config field is out of range.
var ErrInvalidConfig = errors.New("prefix: invalid config")

// Defaults of Config.
const (
	// BlockBytes is the text of one block: 16 tokens (vLLM's block size)
	// at 4 bytes per token.
	BlockBytes = 64
	// DefaultMaxBlocksPerRequest cuts a chain at 8,192 blocks (131,072
	// tokens, above every served context length).
	DefaultMaxBlocksPerRequest = 8192
	// DefaultMaxBlocksPerHost caps one host's view at 1<<20 blocks (16 M
	// tokens of KV cache, above any single engine's).
	DefaultMaxBlocksPerHost = 1 << 20
	// DefaultMaxHosts bounds the hosts tracked.
	DefaultMaxHosts = 4096
	// DefaultCapacityBlocks is a host's capacity when its KV size is
	// unknown: 16,384 blocks (262,144 tokens, a 70B model's cache on one
	// 80 GB GPU is about 100,000 tokens; an 8B model's several times it).
	DefaultCapacityBlocks = 16384
)

// Config bounds an Index.
type Config struct {
	MaxBlocksPerRequest int
	MaxBlocksPerHost    int
	MaxHosts            int
	// DefaultCapacityBlocks is used when Record is given no capacity.
	DefaultCapacityBlocks int
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		MaxBlocksPerRequest:   DefaultMaxBlocksPerRequest,
		MaxBlocksPerHost:      DefaultMaxBlocksPerHost,
		MaxHosts:              DefaultMaxHosts,
		DefaultCapacityBlocks: DefaultCapacityBlocks,
	}
}

// Validate reports a field out of range, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.MaxBlocksPerRequest < 1:
		return fmt.Errorf("%w: MaxBlocksPerRequest %d must be >= 1", ErrInvalidConfig, c.MaxBlocksPerRequest)
	case c.MaxBlocksPerHost < 1:
		return fmt.Errorf("%w: MaxBlocksPerHost %d must be >= 1", ErrInvalidConfig, c.MaxBlocksPerHost)
	case c.MaxHosts < 1:
		return fmt.Errorf("%w: MaxHosts %d must be >= 1", ErrInvalidConfig, c.MaxHosts)
	case c.DefaultCapacityBlocks < 1 || c.DefaultCapacityBlocks > c.MaxBlocksPerHost:
		return fmt.Errorf("%w: DefaultCapacityBlocks %d must be in [1, MaxBlocksPerHost]", ErrInvalidConfig, c.DefaultCapacityBlocks)
	}
	return nil
}

// TextChain returns the hash chain of text's full BlockBytes-byte blocks,
// at most maxBlocks of them (a partial last block has no hash, as in the
// engine). FNV-1a over the parent hash and the block's bytes.
func TextChain(text []byte, maxBlocks int) []uint64 {
	n := min(len(text)/BlockBytes, max(maxBlocks, 0))
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	var parent [8]byte
	h := fnv.New64a()
	for i := range out {
		h.Reset()
		_, _ = h.Write(parent[:])
		_, _ = h.Write(text[i*BlockBytes : (i+1)*BlockBytes])
		out[i] = h.Sum64()
		binary.LittleEndian.PutUint64(parent[:], out[i])
	}
	return out
}

// Index is the per-host view. Build one with New. K names a host: an
// address in the gateway, a cell index in the benchmark.
type Index[K comparable] struct {
	cfg Config

	mu    sync.Mutex
	hosts map[K]*host[K]
	order *list.List // hosts, least recently recorded first
	total int        // blocks over all hosts
}

type host[K comparable] struct {
	key    K
	cap    int
	blocks map[uint64]*list.Element
	lru    *list.List // block hashes, least recently sent first
	elem   *list.Element
}

// New returns an empty index.
func New[K comparable](cfg Config) (*Index[K], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Index[K]{cfg: cfg, hosts: make(map[K]*host[K]), order: list.New()}, nil
}

// Match returns how many leading blocks of chain the host probably holds.
func (x *Index[K]) Match(k K, chain []uint64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	h := x.hosts[k]
	if h == nil {
		return 0
	}
	n := 0
	for _, b := range chain[:min(len(chain), x.cfg.MaxBlocksPerRequest)] {
		if _, ok := h.blocks[b]; !ok {
			break
		}
		n++
	}
	return n
}

// Record notes that chain was sent to host k, whose cache holds capacity
// blocks (<= 0: Config.DefaultCapacityBlocks; capped at
// Config.MaxBlocksPerHost). The chain's blocks become the host's most
// recent, its head last; the least recent beyond the capacity are
// dropped.
func (x *Index[K]) Record(k K, chain []uint64, capacity int) {
	if capacity <= 0 {
		capacity = x.cfg.DefaultCapacityBlocks
	}
	capacity = min(capacity, x.cfg.MaxBlocksPerHost)
	chain = chain[:min(len(chain), x.cfg.MaxBlocksPerRequest)]
	x.mu.Lock()
	defer x.mu.Unlock()
	h := x.hosts[k]
	if h == nil {
		if len(x.hosts) >= x.cfg.MaxHosts {
			x.drop(x.order.Front().Value.(*host[K]))
		}
		h = &host[K]{key: k, blocks: make(map[uint64]*list.Element), lru: list.New()}
		h.elem = x.order.PushBack(h)
		x.hosts[k] = h
	} else {
		x.order.MoveToBack(h.elem)
	}
	h.cap = capacity
	for i := len(chain) - 1; i >= 0; i-- {
		if e, ok := h.blocks[chain[i]]; ok {
			h.lru.MoveToBack(e)
			continue
		}
		h.blocks[chain[i]] = h.lru.PushBack(chain[i])
		x.total++
	}
	for h.lru.Len() > h.cap {
		b := h.lru.Remove(h.lru.Front()).(uint64)
		delete(h.blocks, b)
		x.total--
	}
}

// Forget drops host k's view (the host left, or restarted with an empty
// cache).
func (x *Index[K]) Forget(k K) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h := x.hosts[k]; h != nil {
		x.drop(h)
	}
}

func (x *Index[K]) drop(h *host[K]) {
	x.order.Remove(h.elem)
	delete(x.hosts, h.key)
	x.total -= h.lru.Len()
}

// Len returns the blocks held over all hosts and the hosts tracked.
func (x *Index[K]) Len() (blocks, hosts int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.total, len(x.hosts)
}
