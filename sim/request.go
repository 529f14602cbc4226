package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Limits on request bodies; outside input beyond them is refused with 400.
const (
	// DefaultMaxTokens is max_tokens when a request does not set it. vLLM
	// itself defaults to whatever context is left; the simulator uses a
	// fixed, documented value so that load is predictable.
	DefaultMaxTokens = 128
	// maxPromptsPerRequest caps a batched completions request.
	maxPromptsPerRequest = 256
	// maxMessages caps a chat request.
	maxMessages = 4096
	// chatTokensPerMessage is the per-message overhead of the chat template.
	chatTokensPerMessage = 4
)

// errBadRequest marks parse and validation failures of request bodies.
var errBadRequest = errors.New("sim: bad request")

// genRequest is a parsed completions or chat request.
type genRequest struct {
	model        string
	chat         bool
	prompts      []prompt // one entry per prompt (chat: exactly one)
	maxTokens    int
	stream       bool
	includeUsage bool
}

// prompt is one parsed prompt: its token count and the source its token
// ids are derived from (tokens.go): msgs for a chat request, else ids
// when it was given as token ids, else text. The handler drops the source
// once it has the prompt's block hashes.
type prompt struct {
	tokens int
	text   string
	ids    []int64
	msgs   []chatTurn
}

// chatTurn is one chat message: its role and its content's text, as one
// string or the text of each part.
type chatTurn struct {
	role  string
	parts []string
}

// release drops the prompt's source, keeping its count.
func (p *prompt) release() { p.text, p.ids, p.msgs = "", nil, nil }

type wireRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// parseGenRequest decodes a /v1/completions (chat=false) or
// /v1/chat/completions (chat=true) body. Unknown fields are ignored, as the
// OpenAI API has many the simulator does not model. Every failure wraps
// errBadRequest.
func parseGenRequest(body []byte, chat bool) (genRequest, error) {
	var w wireRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&w); err != nil {
		return genRequest{}, fmt.Errorf("%w: invalid JSON body: %v", errBadRequest, err)
	}
	if dec.More() {
		return genRequest{}, fmt.Errorf("%w: trailing data after the JSON body", errBadRequest)
	}
	r := genRequest{model: w.Model, chat: chat, stream: w.Stream, maxTokens: DefaultMaxTokens}
	if w.StreamOptions != nil {
		r.includeUsage = w.StreamOptions.IncludeUsage
	}
	if w.N != nil && *w.N != 1 {
		return genRequest{}, fmt.Errorf("%w: n=%d: the simulator generates one choice per prompt (n=1)", errBadRequest, *w.N)
	}
	mt := w.MaxTokens
	if chat && w.MaxCompletionTokens != nil {
		mt = w.MaxCompletionTokens
	}
	if mt != nil {
		if *mt < 1 {
			return genRequest{}, fmt.Errorf("%w: max_tokens must be at least 1, got %d", errBadRequest, *mt)
		}
		r.maxTokens = *mt
	}
	var err error
	if chat {
		var p prompt
		p, err = chatPrompt(w.Messages)
		r.prompts = []prompt{p}
	} else {
		r.prompts, err = completionPrompts(w.Prompt)
	}
	if err != nil {
		return genRequest{}, err
	}
	return r, nil
}

// completionPrompts parses the prompts of a completions request: a string,
// a list of strings, a list of token ids, or a list of lists of token ids.
func completionPrompts(raw json.RawMessage) ([]prompt, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, fmt.Errorf("%w: prompt is required", errBadRequest)
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
		}
		if s == "" {
			return nil, fmt.Errorf("%w: prompt cannot be empty", errBadRequest)
		}
		return []prompt{{tokens: textTokens(s), text: s}}, nil
	case '[':
	default:
		return nil, fmt.Errorf("%w: prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids", errBadRequest)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: prompt cannot be empty", errBadRequest)
	}
	first := bytes.TrimSpace(items[0])
	if len(first) == 0 {
		return nil, fmt.Errorf("%w: prompt: empty element", errBadRequest)
	}
	switch first[0] {
	case '"': // list of strings
		if len(items) > maxPromptsPerRequest {
			return nil, fmt.Errorf("%w: at most %d prompts per request", errBadRequest, maxPromptsPerRequest)
		}
		out := make([]prompt, len(items))
		for i, it := range items {
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				return nil, fmt.Errorf("%w: prompt[%d] must be a string like the first element", errBadRequest, i)
			}
			if s == "" {
				return nil, fmt.Errorf("%w: prompt[%d] cannot be empty", errBadRequest, i)
			}
			out[i] = prompt{tokens: textTokens(s), text: s}
		}
		return out, nil
	case '[': // list of lists of token ids
		if len(items) > maxPromptsPerRequest {
			return nil, fmt.Errorf("%w: at most %d prompts per request", errBadRequest, maxPromptsPerRequest)
		}
		out := make([]prompt, len(items))
		for i, it := range items {
			var ids []int64
			if err := json.Unmarshal(it, &ids); err != nil {
				return nil, fmt.Errorf("%w: prompt[%d] must be a list of token ids", errBadRequest, i)
			}
			if err := checkIDs(ids); err != nil {
				return nil, fmt.Errorf("%w: prompt[%d]: %v", errBadRequest, i, err)
			}
			out[i] = prompt{tokens: len(ids), ids: ids}
		}
		return out, nil
	default: // one list of token ids
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, fmt.Errorf("%w: prompt must be a list of token ids (non-negative integers)", errBadRequest)
		}
		if err := checkIDs(ids); err != nil {
			return nil, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
		}
		return []prompt{{tokens: len(ids), ids: ids}}, nil
	}
}

func checkIDs(ids []int64) error {
	if len(ids) == 0 {
		return errors.New("empty token list")
	}
	for _, id := range ids {
		if id < 0 {
			return fmt.Errorf("token id %d is negative", id)
		}
	}
	return nil
}

type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type wirePart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// chatPrompt parses a chat request's messages into one prompt. It counts,
// per message, ceil(content bytes / 4) plus 4 tokens of template overhead
// (tokens.go renders the template). Content is a string or a list of
// parts whose "text" fields count.
func chatPrompt(raw json.RawMessage) (prompt, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return prompt{}, fmt.Errorf("%w: messages is required", errBadRequest)
	}
	var msgs []wireMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return prompt{}, fmt.Errorf("%w: messages must be a list of {role, content} objects: %v", errBadRequest, err)
	}
	if len(msgs) == 0 {
		return prompt{}, fmt.Errorf("%w: messages cannot be empty", errBadRequest)
	}
	if len(msgs) > maxMessages {
		return prompt{}, fmt.Errorf("%w: at most %d messages", errBadRequest, maxMessages)
	}
	p := prompt{msgs: make([]chatTurn, len(msgs))}
	for i, m := range msgs {
		if m.Role == "" {
			return prompt{}, fmt.Errorf("%w: messages[%d].role is required", errBadRequest, i)
		}
		turn := chatTurn{role: m.Role}
		c := bytes.TrimSpace(m.Content)
		switch {
		case len(c) == 0 || bytes.Equal(c, []byte("null")):
		case c[0] == '"':
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return prompt{}, fmt.Errorf("%w: messages[%d].content: %v", errBadRequest, i, err)
			}
			turn.parts = []string{s}
		case c[0] == '[':
			var parts []wirePart
			if err := json.Unmarshal(c, &parts); err != nil {
				return prompt{}, fmt.Errorf("%w: messages[%d].content must be a string or a list of parts", errBadRequest, i)
			}
			turn.parts = make([]string, len(parts))
			for j, part := range parts {
				turn.parts[j] = part.Text
			}
		default:
			return prompt{}, fmt.Errorf("%w: messages[%d].content must be a string or a list of parts", errBadRequest, i)
		}
		for _, part := range turn.parts {
			p.tokens += textTokens(part)
		}
		p.tokens += chatTokensPerMessage
		p.msgs[i] = turn
	}
	return p, nil
}
