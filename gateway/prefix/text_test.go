package prefix

import (
	"testing"
)

func TestPromptText(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		none             bool
	}{
		{name: "completion", body: `{"model":"m","prompt":"hello there"}`, want: "hello there"},
		{name: "chat", body: `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
			want: "system\nbe brief\nuser\nhi\n"},
		{name: "chat parts", body: `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]}]}`,
			want: "user\nab\n"},
		{name: "token ids", body: `{"prompt":[1,2,3]}`, none: true},
		{name: "prompt list", body: `{"prompt":["a","b"]}`, none: true},
		{name: "not json", body: `{"prompt":`, none: true},
		{name: "empty prompt", body: `{"prompt":""}`, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PromptText([]byte(tc.body))
			if tc.none != (got == nil) || string(got) != tc.want {
				t.Fatalf("PromptText = %q (nil %v), want %q (nil %v)", got, got == nil, tc.want, tc.none)
			}
		})
	}
}

// FuzzPromptText: whatever a client sends, the prefix text is bounded by
// the body (a chat's roles and newlines aside) and the chain by the text.
func FuzzPromptText(f *testing.F) {
	f.Add([]byte(`{"prompt":"hello"}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`))
	f.Add([]byte(`{"prompt":[1,2]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		text := PromptText(body)
		if len(text) > 2*len(body) {
			t.Fatalf("%d bytes of text from a %d-byte body", len(text), len(body))
		}
		if c := TextChain(text, DefaultMaxBlocksPerRequest); len(c) > len(text)/BlockBytes {
			t.Fatalf("%d blocks from %d bytes", len(c), len(text))
		}
	})
}
