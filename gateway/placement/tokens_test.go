package placement

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// The prompt size comes from x-isobar-prompt-tokens only when it is sane;
// otherwise from the body at 4 bytes per token.
func TestPromptTokens(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []string
		body    int
		want    int64
	}{
		{"absent", nil, 4000, 1000},
		{"absent, rounded up", nil, 4001, 1001},
		{"absent, empty body", nil, 0, 1},
		{"sane", []string{"700"}, 4000, 700},
		{"sane with spaces", []string{" 700 "}, 4000, 700},
		{"zero", []string{"0"}, 4000, 1000},
		{"negative", []string{"-5"}, 4000, 1000},
		{"non-numeric", []string{"lots"}, 4000, 1000},
		{"fractional", []string{"12.5"}, 4000, 1000},
		{"overflowing", []string{"99999999999999999999999"}, 4000, 1000},
		{"absurd: above the bound", []string{strconv.Itoa(MaxPromptTokens + 1)}, 1 << 23, 1 << 21},
		{"absurd: more tokens than body bytes", []string{"5000"}, 4000, 1000},
		{"repeated", []string{"700", "700"}, 4000, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tc.headers {
				h.Add(xdscontract.PromptTokensHeader, v)
			}
			if got := PromptTokens(h, tc.body); got != tc.want {
				t.Errorf("PromptTokens = %d, want %d", got, tc.want)
			}
		})
	}
}
