package gateway

import "github.com/isobar-mesh/isobar/gateway/prefix"

// promptChain is the request's prefix block chain for --lb isobar's
// affinity, nil when the gateway keeps no prefix index or the prompt has
// no usable text.
func (g *Gateway) promptChain(body []byte) []uint64 {
	if g.balancer.prefix == nil {
		return nil
	}
	return prefix.TextChain(prefix.PromptText(body), prefix.DefaultMaxBlocksPerRequest)
}
