package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// fillerWords are the deterministic output: token k of choice i is
// " "+fillerWords[(k-1+i)%len].
var fillerWords = [...]string{
	"the", "engine", "streams", "simulated", "tokens", "at", "a", "steady",
	"pace", "while", "isobar", "routes", "traffic", "across", "many", "cells",
}

func fillerToken(choice, k int) string {
	return " " + fillerWords[(k-1+choice)%len(fillerWords)]
}

// errorBody is vLLM's error response shape.
type errorBody struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusUnauthorized:
		return "AuthenticationError"
	case http.StatusForbidden:
		return "PermissionDeniedError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLargeError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "Error"
}

// writeError writes a vLLM-style JSON error.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Object: "error", Message: msg, Type: errorType(status), Code: status})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (in *instance) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if in.e.loading(in.e.clock.Now()) {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen int               `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

func (in *instance) handleModels(w http.ResponseWriter, _ *http.Request) {
	e := in.e
	now := e.clock.Now()
	if e.loading(now) {
		writeError(w, http.StatusServiceUnavailable, "The model is still loading.")
		return
	}
	_, advertised := e.maxModelLen()
	created := now.Unix()
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: e.cfg.Model, Object: "model", Created: created, OwnedBy: "vllm", Root: e.cfg.Model,
		MaxModelLen: advertised,
		Permission: []modelPermission{{
			ID: "modelperm-" + e.newID(), Object: "model_permission", Created: created,
			AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
		}},
	}}})
}

// usage is the OpenAI usage object.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason,omitempty"`
}

type genResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   any    `json:"usage,omitempty"`
}

// handleGenerate serves /v1/completions (chat=false) and
// /v1/chat/completions (chat=true).
func (in *instance) handleGenerate(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		e := in.e
		arrival := e.clock.Now()
		e.countTenant(r.Header.Get(xdscontract.TenantHeader))
		if e.loading(arrival) {
			writeError(w, http.StatusServiceUnavailable, "The model is still loading.")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				e.m.badRequests.WithLabelValues(reasonTooLarge).Inc()
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Request body exceeds %d bytes.", e.cfg.MaxBodyBytes))
				return
			}
			return // the client went away while sending
		}
		req, err := parseGenRequest(body, chat)
		if err != nil {
			e.m.badRequests.WithLabelValues(reasonMalformed).Inc()
			writeError(w, http.StatusBadRequest, strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
			return
		}
		if req.model != "" && req.model != e.cfg.Model {
			e.m.badRequests.WithLabelValues(reasonUnknownModel).Inc()
			writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.model))
			return
		}
		maxLen, _ := e.maxModelLen()
		for _, p := range req.prompts {
			if msg := contextError(p.tokens, req.maxTokens, maxLen); msg != "" {
				e.m.badRequests.WithLabelValues(reasonContextLen).Inc()
				writeError(w, http.StatusBadRequest, msg)
				return
			}
		}
		if status, fail := e.injectError(); fail {
			e.m.injectedErrors.Inc()
			writeError(w, status, "Simulated engine failure (injected fault).")
			return
		}
		if d := e.frontendDelay(body); d > 0 {
			t := e.clock.NewTimer(d)
			select {
			case <-t.Chan():
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		seqs := in.sched.submit(e.sequences(req.prompts, req.maxTokens, arrival))
		resp := genResponse{ID: "cmpl-" + e.newID(), Object: "text_completion", Created: arrival.Unix(), Model: e.cfg.Model}
		if chat {
			resp.ID, resp.Object = "chatcmpl-"+e.newID(), "chat.completion"
		}
		if req.stream {
			in.stream(w, r, req, resp, seqs)
			return
		}
		in.respond(w, r, req, resp, seqs)
	}
}

// sequences turns a request's prompts into the sequences the scheduler
// runs, one per prompt, sharing one notify channel. With prefix caching on
// each gets its prompt's block hash chain (tokens.go); either way each
// prompt's source (its text, ids or messages) is dropped here, so a
// request keeps no copy of its prompt while it runs.
func (e *Engine) sequences(prompts []prompt, maxTokens int, arrival time.Time) []*seqState {
	notify := make(chan struct{}, 1)
	out := make([]*seqState, len(prompts))
	for i := range prompts {
		p := &prompts[i]
		q := &seqState{prompt: p.tokens, maxTokens: maxTokens, arrival: arrival, done: make(chan struct{}), notify: notify}
		if !e.cfg.DisablePrefixCaching {
			q.hashes = p.blockHashes(e.prof.BlockSize)
		}
		p.release()
		out[i] = q
	}
	return out
}

// contextError returns vLLM's message for a request that does not fit the
// context length, or "".
func contextError(prompt, maxTokens, maxLen int) string {
	if prompt+maxTokens > maxLen {
		return fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", maxLen, prompt+maxTokens, prompt, maxTokens)
	}
	return ""
}

func isDone(q *seqState) bool {
	select {
	case <-q.done:
		return true
	default:
		return false
	}
}

// respond waits for every sequence and writes one JSON response.
func (in *instance) respond(w http.ResponseWriter, r *http.Request, req genRequest, resp genResponse, seqs []*seqState) {
	for _, q := range seqs {
		select {
		case <-q.done:
		case <-r.Context().Done():
			in.sched.abort(seqs)
			return
		}
		if q.err != nil {
			writeError(w, http.StatusInternalServerError, "Generation failed: "+q.err.Error())
			return
		}
	}
	length := finishLength
	var u usage
	var text strings.Builder
	if req.chat {
		choices := make([]chatChoice, len(seqs))
		for i, q := range seqs {
			text.Reset()
			n := int(q.tokens.Load())
			for k := 1; k <= n; k++ {
				text.WriteString(fillerToken(i, k))
			}
			choices[i] = chatChoice{Index: i, Message: &chatMessage{Role: "assistant", Content: text.String()}, FinishReason: &length}
			u.PromptTokens += q.prompt
			u.CompletionTokens += n
		}
		resp.Choices = choices
	} else {
		choices := make([]completionChoice, len(seqs))
		for i, q := range seqs {
			text.Reset()
			n := int(q.tokens.Load())
			for k := 1; k <= n; k++ {
				text.WriteString(fillerToken(i, k))
			}
			choices[i] = completionChoice{Index: i, Text: text.String(), FinishReason: &length}
			u.PromptTokens += q.prompt
			u.CompletionTokens += n
		}
		resp.Choices = choices
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	resp.Usage = u
	writeJSON(w, http.StatusOK, resp)
}

// stream writes one SSE event per token as the scheduler publishes it,
// flushing each, then [DONE].
func (in *instance) stream(w http.ResponseWriter, r *http.Request, req genRequest, resp genResponse, seqs []*seqState) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if req.chat {
		resp.Object = "chat.completion.chunk"
	}
	if req.includeUsage {
		resp.Usage = json.RawMessage("null")
	}
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if err := rc.Flush(); err != nil {
		in.sched.abort(seqs)
		return
	}
	if !streamTokens(w, rc, r, req, &resp, seqs, send) {
		in.sched.abort(seqs)
		return
	}
	if req.includeUsage {
		var u usage
		for _, q := range seqs {
			u.PromptTokens += q.prompt
			u.CompletionTokens += int(q.tokens.Load())
		}
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
		resp.Choices = []struct{}{}
		resp.Usage = u
		if !send(resp) {
			return
		}
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

// streamTokens sends every sequence's tokens as the scheduler publishes
// them, until all are done. It returns false, for the caller to abort the
// sequences, when a send fails, the client goes away or a sequence failed
// (after writing that failure as an error event).
func streamTokens(w http.ResponseWriter, rc *http.ResponseController, r *http.Request, req genRequest, resp *genResponse, seqs []*seqState, send func(any) bool) bool {
	notify := seqs[0].notify
	// A chat stream's first chunk of each choice carries the role, sent
	// with the choice's first engine output as vLLM's serving_chat.py does
	// (its first_iteration branch runs inside the loop over the engine's
	// outputs), so a client's time to first byte is its time to first
	// token, as with completions.
	st := streamState{chat: req.chat, roleSent: make([]bool, len(seqs)), sent: make([]int, len(seqs)), length: finishLength}
	remaining := len(seqs)
	for remaining > 0 {
		for i, q := range seqs {
			if st.sent[i] < 0 {
				continue
			}
			done := isDone(q)
			if done && q.err != nil {
				b, _ := json.Marshal(errorBody{Object: "error", Message: "Generation failed: " + q.err.Error(), Type: errorType(500), Code: 500})
				_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
				_ = rc.Flush()
				return false
			}
			if !st.emit(send, resp, i, int(q.tokens.Load()), q.maxTokens) {
				return false
			}
			if done {
				st.sent[i] = -1
				remaining--
			}
		}
		if remaining == 0 {
			break
		}
		select {
		case <-notify:
		case <-r.Context().Done():
			return false
		}
	}
	return true
}

// streamState is what a stream has sent of each choice: its role chunk
// (chat only) and its token count, -1 once the choice is done.
type streamState struct {
	chat     bool
	roleSent []bool
	sent     []int
	length   string
}

// emit sends choice i's tokens from sent[i]+1 to n, preceded for a chat
// stream by the role chunk if not sent yet; false when a send failed.
func (st *streamState) emit(send func(any) bool, resp *genResponse, i, n, maxTokens int) bool {
	if st.chat && n > 0 && !st.roleSent[i] {
		st.roleSent[i] = true
		resp.Choices = []chatChoice{{Index: i, Delta: &chatMessage{Role: "assistant", Content: ""}}}
		if !send(*resp) {
			return false
		}
	}
	for st.sent[i] < n {
		st.sent[i]++
		var fr *string
		if st.sent[i] == maxTokens {
			fr = &st.length
		}
		if st.chat {
			resp.Choices = []chatChoice{{Index: i, Delta: &chatMessage{Content: fillerToken(i, st.sent[i])}, FinishReason: fr}}
		} else {
			resp.Choices = []completionChoice{{Index: i, Text: fillerToken(i, st.sent[i]), FinishReason: fr}}
		}
		if !send(*resp) {
			return false
		}
	}
	return true
}
