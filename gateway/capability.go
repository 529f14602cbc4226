package gateway

import (
	"sync"
	"time"
)

// contextMemoryTTL is how long the gateway remembers that an endpoint
// refused a prompt as too long. A refusal older than this is forgotten, so
// an engine restarted with a longer max_model_len is found again (at the
// cost of one more refusal).
const contextMemoryTTL = 10 * time.Minute

// contextMemory is the --lb isobar rejection memory of one upstream
// address: the largest prompt (in the pick's token estimate) it has
// answered with a 2xx, and the smallest it refused with HTTP 400, vLLM's
// answer to a prompt longer than its max_model_len. It catches a context
// limit nobody declared (no max_model_len in the endpoint metadata, so the
// context-class routes cannot help) after the first refusal, instead of
// waiting for the controller's error-rate penalty, and keeps the endpoint
// serving the prompts it has proven to hold.
//
// It lives in the host registry by address and outlives the endpoint's
// absence from EDS (a penalised cell leaves the assignment and comes back
// on probation), until contextMemoryTTL after the last refusal. Safe for
// concurrent use.
type contextMemory struct {
	mu        sync.Mutex
	okTokens  int64     // largest prompt served (2xx)
	refused   int64     // smallest prompt refused with 400; 0: none
	refusedAt time.Time // last refusal
}

// served records a 2xx answer to a prompt of tokens tokens.
func (m *contextMemory) served(tokens int64) {
	m.mu.Lock()
	m.okTokens = max(m.okTokens, tokens)
	m.mu.Unlock()
}

// refusedPrompt records a 400 answer to a prompt of tokens tokens at now.
func (m *contextMemory) refusedPrompt(tokens int64, now time.Time) {
	m.mu.Lock()
	if m.refused == 0 || tokens < m.refused {
		m.refused = tokens
	}
	m.refusedAt = now
	m.mu.Unlock()
}

// ceiling is the largest prompt the pick may send the address at now, or
// 0 for no limit: once it has refused a prompt, the largest it has served
// when that is smaller than the smallest refused, else one token below
// the smallest refused. An expired memory is cleared.
func (m *contextMemory) ceiling(now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.refused == 0:
		return 0
	case now.Sub(m.refusedAt) >= contextMemoryTTL:
		m.refused, m.okTokens = 0, 0
		return 0
	case m.okTokens > 0 && m.okTokens < m.refused:
		return m.okTokens
	default:
		return max(m.refused-1, 1)
	}
}

// fits reports whether a prompt of tokens tokens is within the ceiling.
func (m *contextMemory) fits(tokens int64, now time.Time) bool {
	c := m.ceiling(now)
	return c == 0 || tokens <= c
}

// expired reports whether the memory holds nothing worth keeping at now.
func (m *contextMemory) expired(now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused == 0 || now.Sub(m.refusedAt) >= contextMemoryTTL
}
