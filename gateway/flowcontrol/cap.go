package flowcontrol

import (
	"math"
	"time"
)

// EndpointCap is how many requests the gateway keeps in flight to one
// endpoint before the endpoint counts as saturated (and an arrival waits
// in the Queue), from what the endpoint declares and what the gateway
// measures of it:
//
//	cap = min(configured, maxNumSeqs + margin)
//	margin = max(1, ⌈maxNumSeqs × rtt / slotHold⌉)
//
// Why: an engine runs at most maxNumSeqs sequences at once (vLLM
// --max-num-seqs, xDS metadata xdscontract.MetadataMaxNumSeqs). Every
// request sent beyond that only waits in the engine's own FCFS queue,
// where the gateway can neither order it by criticality nor withdraw it;
// held at the gateway instead, it waits in the Queue, most important
// first. The margin keeps the batch full across the round trip: when a
// sequence ends, its replacement reaches the engine one round trip later
// (the end of the reply back to the gateway, the next request out), and
// in a round trip the engine finishes maxNumSeqs × rtt / slotHold
// sequences on average (Little's law: maxNumSeqs slots, each held
// slotHold); that many requests already waiting at the engine start at
// once. At least one, since completions do not come evenly spaced.
//
// configured (the gateway's MaxInflightPerEndpoint) stays the upper bound:
// it is the operator's bound on connections and memory, and the bound that
// applies to an engine whose KV cache, not maxNumSeqs, limits its batch
// (vLLM's default max_num_seqs is 1024 on large GPUs, far above what the
// KV cache of a 70B model holds). maxNumSeqs 0 (not declared) gives
// configured; slotHold 0 (no completion measured yet) gives margin 1.
// The result is at least 1 whenever configured is.
func EndpointCap(maxNumSeqs int64, rtt, slotHold time.Duration, configured int) int {
	if maxNumSeqs <= 0 || maxNumSeqs >= int64(configured) {
		return configured
	}
	margin := int64(1)
	if slotHold > 0 && rtt > 0 {
		m := math.Ceil(float64(maxNumSeqs) * float64(rtt) / float64(slotHold))
		if m > float64(configured) {
			return configured
		}
		margin = max(margin, int64(m))
	}
	return int(min(int64(configured), maxNumSeqs+margin))
}
