package placement

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// MaxPromptTokens is the largest x-isobar-prompt-tokens value believed
// (2^20, above every served context length); a larger one is absurd and the
// body estimate is used instead.
const MaxPromptTokens = 1 << 20

// PromptTokens is a request's prompt size in tokens for the pick: the
// x-isobar-prompt-tokens header when it holds one integer in [1,
// min(MaxPromptTokens, body bytes)] (a token is at least a byte of the body),
// else the body estimate ⌈body bytes / xdscontract.BytesPerToken⌉ (at least
// 1), the convention the controller's routes use. A client's bad header is
// never trusted.
func PromptTokens(h http.Header, bodyLen int) int64 {
	est := max(int64(bodyLen+xdscontract.BytesPerToken-1)/xdscontract.BytesPerToken, 1)
	vals := h.Values(xdscontract.PromptTokensHeader)
	if len(vals) != 1 {
		return est
	}
	n, err := strconv.ParseInt(strings.TrimSpace(vals[0]), 10, 64)
	if err != nil || n < 1 || n > MaxPromptTokens || n > int64(bodyLen) {
		return est
	}
	return n
}
