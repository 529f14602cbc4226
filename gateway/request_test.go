package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// oracleModel is what encoding/json makes of a body's model with an exact
// (case-sensitive) member name, the last one winning.
func oracleModel(body []byte) (string, bool) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil || members == nil {
		return "", false
	}
	// map decoding keeps the last duplicate, like BodyModel.
	raw, ok := members["model"]
	if !ok || string(raw) == "null" {
		return "", true
	}
	var m string
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", false
	}
	return m, len(m) <= maxModelNameLen
}

func TestBodyModel(t *testing.T) {
	tests := []struct {
		body    string
		want    string
		wantErr bool
	}{
		{`{"model":"m","prompt":"hi"}`, "m", false},
		{` {"prompt":"a \"model\": \"x\" \\", "model" : "llama/3" } `, "llama/3", false},
		{`{"prompt":{"model":"inner"},"model":"outer"}`, "outer", false},
		{`{"prompt":[1,2,{"a":[true,false,null,-1.5e3]}],"max_tokens":5}`, "", false},
		{`{"model":null}`, "", false},
		{`{"model":"a","model":"b"}`, "b", false},
		{`{"mod\u0065l":"esc"}`, "esc", false},
		{`{"Model":"case"}`, "", false},
		{`{"model":"\u00e9\n"}`, "é\n", false},
		{`{}`, "", false},
		{`{"model":3}`, "", true},
		{`{"model":["m"]}`, "", true},
		{`[{"model":"m"}]`, "", true},
		{`{"model":"m"`, "", true},
		{`{"model":"m"} x`, "", true},
		{`{"model":"m",}`, "", true},
		{`{"a":"unterminated}`, "", true},
		{`{"a":"bad \x escape","model":"m"}`, "", true},
		{"{\"a\":\"raw\x01control\",\"model\":\"m\"}", "", true},
		{``, "", true},
		{`{"model":"` + strings.Repeat("x", maxModelNameLen+1) + `"}`, "", true},
		{`{"a":` + strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2) + `}`, "", true},
	}
	for _, tc := range tests {
		got, err := BodyModel([]byte(tc.body))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("BodyModel(%.60q) = %q, %v; want %q, error %v", tc.body, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !errors.Is(err, ErrBadRequest) {
			t.Errorf("BodyModel(%.60q) error %v does not wrap ErrBadRequest", tc.body, err)
		}
	}
}

// FuzzBodyModel holds the scanner to encoding/json on every valid body, and
// to never panicking on any.
func FuzzBodyModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":3,"stream":true}`,
		`{"messages":[{"role":"user","content":"q \"x\" \\"}],"model":"a/b"}`,
		`{"model":"a","model":null}`, `{"mod\u0065l":"x"}`, `{"model":"\ud83d\ude00"}`,
		`{"n":-0.5e-3,"model":"m"}`, `[1]`, `{"a":{"b":[{}]}}`, `{"model":"m"`, `"model"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := BodyModel(body)
		if !json.Valid(body) {
			return
		}
		want, ok := oracleModel(body)
		if ok != (err == nil) || (ok && got != want) {
			t.Fatalf("BodyModel(%q) = %q, %v; encoding/json says %q, ok %v", body, got, err, want, ok)
		}
	})
}

func BenchmarkBodyModel(b *testing.B) {
	body := []byte(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, strings.Repeat("lorem ipsum ", 2000)))
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := BodyModel(body); err != nil {
			b.Fatal(err)
		}
	}
}
