package lab

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/sim"
)

// chatTemplateTokens is what the simulated engines count per chat message
// beyond its content (the template's role and delimiters).
const chatTemplateTokens = 4

// sessionStream is the PCG stream base of the multiturn sessions' text:
// slot<<32 + the slot's session number is added.
const sessionStream = 0x5e55 << 48

// chatMessage is one message of a session's history.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// sessions runs the multiturn workload of one region: cfg.Sessions
// conversations open at once, one goroutine per slot (owned by t.wg), a
// fresh conversation taking a slot when its last one ends. It returns
// when ctx ends; each slot then finishes the request it has in flight
// (on reqCtx, which stop cancels after the drain) and exits.
func (t *traffic) sessions(ctx, reqCtx context.Context) {
	for slot := range t.cfg.Sessions {
		t.wg.Go(func() {
			for k := uint64(0); ctx.Err() == nil; k++ {
				// A session's turns share one class, drawn off the text's
				// source so that a mix replays the same conversations.
				class := drawClass(t.cfg, rand.New(rand.NewPCG(t.seed, classStream+sessionStream+uint64(slot)<<32+k)))
				t.session(ctx, reqCtx, rand.New(rand.NewPCG(t.seed, sessionStream+uint64(slot)<<32+k)), class)
			}
		})
	}
	<-ctx.Done()
}

// session runs one conversation on rng, its own source: Turns drawn in
// 1..cfg.Turns, each a user message of TurnTokens ± TurnJitter tokens of
// random words, sent to the region's ingress as a streaming
// /v1/chat/completions whose messages are the whole history so far — the
// user's messages and the assistant's replies as they were streamed back —
// so each turn's prompt extends the previous one's. Turns start as a
// Poisson process of rate RPS/Sessions (the first after one gap, which
// staggers the sessions), but never before the previous reply is in: a
// user reads before typing. The session ends early when ctx ends, when a
// request fails, or when the next turn would not fit the engines' context.
// Every turn carries class (its criticality and tenant headers).
func (t *traffic) session(ctx, reqCtx context.Context, rng *rand.Rand, class requestClass) {
	turns := 1 + rng.IntN(t.cfg.Turns)
	meanGap := float64(t.cfg.Sessions) / t.cfg.RPS * float64(time.Second)
	gap := func() time.Duration { return time.Duration(rng.ExpFloat64() * meanGap) }
	var history []chatMessage
	tokens := 0 // the history's prompt tokens, as the engines count them
	next := t.clock.Now().Add(gap())
	for turn := 1; turn <= turns; turn++ {
		if wait := next.Sub(t.clock.Now()); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-t.clock.After(wait):
			}
		} else if ctx.Err() != nil {
			return
		}
		n := t.cfg.TurnTokens - t.cfg.TurnJitter + rng.IntN(2*t.cfg.TurnJitter+1)
		tokens += n + chatTemplateTokens
		if tokens+t.cfg.MaxTokens > sim.DefaultMaxModelLen {
			return
		}
		history = append(history, chatMessage{Role: "user", Content: promptText(rng, n)})
		next = t.clock.Now().Add(gap())
		body, _ := json.Marshal(map[string]any{
			"model": sim.DefaultModel, "messages": history, "max_tokens": t.cfg.MaxTokens, "stream": true,
		})
		var reply strings.Builder
		o := Outcome{Turn: turn, Criticality: class.crit, Tenant: class.tenant}
		if !t.send(reqCtx, "/v1/chat/completions", body, o, class.header, &reply) {
			return
		}
		history = append(history, chatMessage{Role: "assistant", Content: reply.String()})
		tokens += (reply.Len()+3)/4 + chatTemplateTokens
	}
}
