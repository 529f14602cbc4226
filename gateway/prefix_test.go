package gateway

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

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
