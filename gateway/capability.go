package gateway

import (
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/isobar-mesh/isobar/gateway/placement"
)

// contextMemoryTTL is how long the gateway remembers that an endpoint
// refused a prompt as too long. A refusal older than this is forgotten, so
// an engine restarted with a longer max_model_len is found again (at the
// cost of one more refusal).
const contextMemoryTTL = 10 * time.Minute

// refusalPeekBytes bounds what the gateway reads of an upstream 400 body
// to find the stated context limit (the rest is relayed unread).
const refusalPeekBytes = 4096

// contextLimitRE matches vLLM's refusal of a prompt above max_model_len:
// "This model's maximum context length is N tokens. However, you
// requested M tokens ...".
var contextLimitRE = regexp.MustCompile(`maximum context length is (\d{1,9}) tokens`)

// statedContextLimit returns the context limit an engine's 400 body
// states, or 0 when it states none.
func statedContextLimit(body []byte) int64 {
	m := contextLimitRE.FindSubmatch(body)
	if m == nil {
		return 0
	}
	n, err := strconv.ParseInt(string(m[1]), 10, 64)
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// contextMemory is the --lb isobar rejection memory of one upstream
// address: the largest prompt (in the pick's token estimate) it has
// answered with a 2xx, the smallest it refused with HTTP 400, vLLM's
// answer to a prompt longer than its max_model_len, and the limit the
// refusal stated, when it stated one. It catches a context
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
	stated    int64     // smallest limit a refusal stated; 0: none
	refusedAt time.Time // last refusal
}

// served records a 2xx answer to a prompt of tokens tokens.
func (m *contextMemory) served(tokens int64) {
	m.mu.Lock()
	m.okTokens = max(m.okTokens, tokens)
	m.mu.Unlock()
}

// refusedPrompt records a 400 answer to a prompt of tokens tokens at now,
// which stated the engine's context limit when limit > 0.
func (m *contextMemory) refusedPrompt(tokens, limit int64, now time.Time) {
	m.mu.Lock()
	if m.refused == 0 || tokens < m.refused {
		m.refused = tokens
	}
	if limit > 0 && (m.stated == 0 || limit < m.stated) {
		m.stated = limit
	}
	m.refusedAt = now
	m.mu.Unlock()
}

// ceiling is the largest prompt the pick may send the address at now, or
// 0 for no limit: once it has refused a prompt, the limit a refusal
// stated; without one, the largest prompt it has served when that is
// smaller than the smallest refused, else one token below the smallest
// refused. An expired memory is cleared.
func (m *contextMemory) ceiling(now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refused != 0 && now.Sub(m.refusedAt) >= contextMemoryTTL {
		m.refused, m.okTokens, m.stated = 0, 0, 0
	}
	return placement.ContextCeiling(m.okTokens, m.refused, m.stated)
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
