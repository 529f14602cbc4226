package sim

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseGenRequest(t *testing.T) {
	long := strings.Repeat("a", 4001)
	tests := []struct {
		name      string
		chat      bool
		body      string
		prompts   []int
		maxTokens int
		stream    bool
		usage     bool
		wantErr   bool
	}{
		{name: "string prompt", body: `{"model":"m","prompt":"` + long + `"}`, prompts: []int{1001}, maxTokens: DefaultMaxTokens},
		{name: "string list", body: `{"prompt":["abcd","abcde"],"max_tokens":7}`, prompts: []int{1, 2}, maxTokens: 7},
		{name: "token ids", body: `{"prompt":[1,2,3,4,5],"stream":true}`, prompts: []int{5}, maxTokens: DefaultMaxTokens, stream: true},
		{name: "token id lists", body: `{"prompt":[[1,2],[3]],"stream":true,"stream_options":{"include_usage":true}}`, prompts: []int{2, 1}, maxTokens: DefaultMaxTokens, stream: true, usage: true},
		{name: "unknown fields ignored", body: `{"prompt":"abcd","temperature":0.7,"top_p":1}`, prompts: []int{1}, maxTokens: DefaultMaxTokens},
		{name: "chat string", chat: true, body: `{"messages":[{"role":"system","content":"abcdefgh"},{"role":"user","content":"abc"}],"max_completion_tokens":9}`, prompts: []int{2 + 4 + 1 + 4}, maxTokens: 9},
		{name: "chat parts", chat: true, body: `{"messages":[{"role":"user","content":[{"type":"text","text":"abcdefgh"}]}]}`, prompts: []int{2 + 4}, maxTokens: DefaultMaxTokens},
		{name: "malformed json", body: `{"prompt":`, wantErr: true},
		{name: "trailing data", body: `{"prompt":"a"} {}`, wantErr: true},
		{name: "no prompt", body: `{"model":"m"}`, wantErr: true},
		{name: "empty prompt", body: `{"prompt":""}`, wantErr: true},
		{name: "empty list", body: `{"prompt":[]}`, wantErr: true},
		{name: "mixed list", body: `{"prompt":["a",1]}`, wantErr: true},
		{name: "negative id", body: `{"prompt":[1,-2]}`, wantErr: true},
		{name: "float id", body: `{"prompt":[1.5]}`, wantErr: true},
		{name: "object prompt", body: `{"prompt":{"a":1}}`, wantErr: true},
		{name: "zero max tokens", body: `{"prompt":"a","max_tokens":0}`, wantErr: true},
		{name: "n=2", body: `{"prompt":"a","n":2}`, wantErr: true},
		{name: "chat no messages", chat: true, body: `{"messages":[]}`, wantErr: true},
		{name: "chat no role", chat: true, body: `{"messages":[{"content":"a"}]}`, wantErr: true},
		{name: "chat bad content", chat: true, body: `{"messages":[{"role":"user","content":5}]}`, wantErr: true},
		{name: "not an object", body: `[1,2]`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseGenRequest([]byte(tt.body), tt.chat)
			if tt.wantErr {
				if !errors.Is(err, errBadRequest) {
					t.Fatalf("err = %v, want errBadRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := tokenCounts(r)
			if !slices.Equal(got, tt.prompts) {
				t.Fatalf("prompts = %v, want %v", got, tt.prompts)
			}
			if r.maxTokens != tt.maxTokens || r.stream != tt.stream || r.includeUsage != tt.usage {
				t.Fatalf("got %+v", r)
			}
		})
	}
}

// tokenCounts lists the token count of each of r's prompts.
func tokenCounts(r genRequest) []int {
	out := make([]int, len(r.prompts))
	for i, p := range r.prompts {
		out[i] = p.tokens
	}
	return out
}

func TestContextErrorMatchesVLLM(t *testing.T) {
	got := contextError(1372, 128, 1024)
	want := "This model's maximum context length is 1024 tokens. However, you requested 1500 tokens (1372 in the messages, 128 in the completion). Please reduce the length of the messages or completion."
	if got != want {
		t.Fatalf("message\n got %q\nwant %q", got, want)
	}
	if contextError(896, 128, 1024) != "" {
		t.Fatal("a request of exactly max_model_len was refused")
	}
	if !strings.Contains(contextError(2000, 1, 1024), "you requested 2001 tokens (2000 in the messages, 1 in the completion)") {
		t.Fatal("prompt alone over the limit not reported")
	}
}

// FuzzParseGenRequest: no input may panic, and accepted input yields sane
// counts.
func FuzzParseGenRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":3}`,
		`{"prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3]}`,
		`{"prompt":[[1],[2,3]]}`,
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
		`{"prompt":`, `null`, `[]`, `{"prompt":[[]]}`, `{"prompt":[1e400]}`, `{"messages":[null]}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		if len(body) > 1<<16 {
			return
		}
		r, err := parseGenRequest(body, chat)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v does not wrap errBadRequest", err)
			}
			return
		}
		if len(r.prompts) == 0 || r.maxTokens < 1 {
			t.Fatalf("accepted request with no prompt or max tokens: %+v", r)
		}
		for _, n := range tokenCounts(r) {
			if n < 1 && !chat {
				t.Fatalf("accepted empty prompt: %+v", r)
			}
			if n < 0 {
				t.Fatalf("negative token count: %+v", r)
			}
		}
	})
}

// FuzzParseFaultRequest: no admin body may panic; accepted ones name a
// known fault.
func FuzzParseFaultRequest(f *testing.F) {
	for _, s := range []string{
		`{"fault":"kill"}`, `{"fault":"throttle","severity":0.5,"lead":"3s"}`,
		`{"fault":"errors","rate":0.2,"status":503}`, `{"fault":"max_model_len","n":1024,"advertise":false}`,
		`{"fault":"slow_start","duration":"10s"}`, `{"fault":"restart","slow_start":"1m"}`,
		`{"fault":"hang","on":false}`, `{"fault":"nope"}`, `{"fault":"kill","extra":1}`, `{`,
	} {
		f.Add([]byte(s))
	}
	known := map[string]bool{FaultKill: true, FaultRestart: true, FaultHang: true, FaultSlowStart: true,
		FaultMaxModelLen: true, FaultErrors: true, FaultThrottle: true, FaultPCIe: true, FaultDCGMDown: true,
		FaultXID: true, FaultClear: true}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseFaultRequest(body)
		if err != nil {
			if !errors.Is(err, errBadFault) {
				t.Fatalf("error %v does not wrap errBadFault", err)
			}
			return
		}
		if !known[r.Fault] {
			t.Fatalf("accepted unknown fault %q", r.Fault)
		}
		if r.Severity < 0 || r.Severity > 1 || r.Rate < 0 || r.Rate > 1 {
			t.Fatalf("accepted out-of-range values: %+v", r)
		}
	})
}
