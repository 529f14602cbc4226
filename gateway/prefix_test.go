package gateway

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/gateway/prefix"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
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
			got := promptText([]byte(tc.body))
			if tc.none != (got == nil) || string(got) != tc.want {
				t.Fatalf("promptText = %q (nil %v), want %q (nil %v)", got, got == nil, tc.want, tc.none)
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
		text := promptText(body)
		if len(text) > 2*len(body) {
			t.Fatalf("%d bytes of text from a %d-byte body", len(text), len(body))
		}
		if c := prefix.TextChain(text, prefix.DefaultMaxBlocksPerRequest); len(c) > len(text)/prefix.BlockBytes {
			t.Fatalf("%d blocks from %d bytes", len(c), len(text))
		}
	})
}

// TestGatewayPrefixAffinityKeepsConversations: real engines behind
// --lb isobar; each conversation's later turns (its earlier prompt plus
// a new message) go where its first went, since that endpoint holds the
// prefix; with affinity off they spread as the least expected TTFT ties
// do.
func TestGatewayPrefixAffinityKeepsConversations(t *testing.T) {
	for _, affinity := range []bool{true, false} {
		t.Run(fmt.Sprintf("affinity=%v", affinity), func(t *testing.T) {
			var eps []xds.Endpoint
			for i := range 3 {
				e := engine(t, model, 0, nil, 0)
				eps = append(eps, endpointOf(t, fmt.Sprintf("c%d", i), e.Addr(), 1, 0))
			}
			ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, eps...))
			g := startGateway(t, ctrl, Config{LB: LBIsobar, NoPrefixAffinity: !affinity}, Deps{Rand: newLockedRand(3, 4)})
			r := rand.New(rand.NewPCG(1, 2))
			words := func(n int) string {
				var b strings.Builder
				for range n {
					fmt.Fprintf(&b, "w%d ", r.IntN(1e6))
				}
				return b.String()
			}
			moved := 0
			for conv := range 8 {
				prompt := words(200)
				first := ""
				for turn := range 3 {
					prompt += words(20)
					got := g.post(t, fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, prompt))
					if got.status != http.StatusOK {
						t.Fatalf("conversation %d turn %d: status %d", conv, turn, got.status)
					}
					if turn == 0 {
						first = got.endpoint
					} else if got.endpoint != first {
						moved++
					}
				}
			}
			switch {
			case affinity && moved != 0:
				t.Fatalf("%d of 16 later turns left their conversation's endpoint", moved)
			case !affinity && moved == 0:
				t.Fatal("without affinity every later turn still found its first endpoint: the test cannot tell")
			}
		})
	}
}

// post sends a completion body as is.
func (g *testGateway) post(t testing.TB, body string) result {
	t.Helper()
	resp, err := g.client.Post(g.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, endpoint: resp.Header.Get(xdscontract.EndpointHeader), body: string(b), header: resp.Header}
}
