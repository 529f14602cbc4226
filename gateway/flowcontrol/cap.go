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
//	cap = min(configured, maxNumSeqs + ⌊maxNumSeqs × rtt / slotHold⌋)
//
// Why: an engine runs at most maxNumSeqs sequences at once (vLLM
// --max-num-seqs, xDS metadata xdscontract.MetadataMaxNumSeqs). A request
// sent beyond that waits in the engine's own FCFS queue, where the
// gateway can neither order it by criticality nor withdraw it, for the
// next sequence to end (about slotHold / maxNumSeqs, seconds when replies
// are long); held at the gateway instead it waits in the Queue, most
// important first, and takes the next slot that frees. The one request
// worth sending early is one that will find a slot free when it arrives:
// the gateway learns of a freed slot one round trip after the engine
// freed it (the end of the reply travels back, the next request travels
// out), and over a round trip the engine ends maxNumSeqs × rtt / slotHold
// sequences on average (Little's law: maxNumSeqs slots each held
// slotHold). That many, rounded down, start on arrival instead of
// waiting; rounding up would queue one at the engine. The cost of the
// rounding is a slot idle for less than a round trip (plus the engine's
// frontend) per sequence, a share rtt / slotHold of the batch: under 1 %
// at a 50 ms round trip and 5 s replies.
//
// configured (the gateway's MaxInflightPerEndpoint) stays the upper bound:
// it is the operator's bound on connections and memory, and the bound that
// applies to an engine whose KV cache, not maxNumSeqs, limits its batch
// (vLLM's default max_num_seqs is 1024 on large GPUs, far above what the
// KV cache of a 70B model holds). maxNumSeqs 0 (not declared) gives
// configured; rtt or slotHold 0 (not measured yet) gives maxNumSeqs.
func EndpointCap(maxNumSeqs int64, rtt, slotHold time.Duration, configured int) int {
	if maxNumSeqs <= 0 || maxNumSeqs >= int64(configured) {
		return configured
	}
	early := 0.0
	if slotHold > 0 && rtt > 0 {
		early = math.Floor(float64(maxNumSeqs) * float64(rtt) / float64(slotHold))
	}
	if float64(maxNumSeqs)+early >= float64(configured) {
		return configured
	}
	return int(maxNumSeqs + int64(early))
}
