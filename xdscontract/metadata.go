package xdscontract

import (
	"math"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// MetadataKey is the filter_metadata key (namespace) under which every
// endpoint carries its cell id (MetadataCell, a string), when known its
// max_model_len (MetadataMaxModelLen, a number), its placement inputs
// (MetadataPrefillRate, MetadataMaxNumSeqs, MetadataRTT, MetadataJitter;
// numbers) and, during a probation probe slot, its probe budget
// (MetadataProbeBudget, a number). A locality carries MetadataRTT and
// MetadataJitter under the same key when known, and a pinned cluster
// (PinnedClusterName) its cluster metadata MetadataResidency and
// MetadataAllowedRegions.
const MetadataKey = "isobar"

// Keys under MetadataKey. Every key but MetadataCell is written only when
// known; a data plane counts an absent, non-numeric, negative, non-finite or
// absurd value as unknown.
const (
	// MetadataCell: the endpoint's cell id, a string unique within a model.
	MetadataCell = "cell"
	// MetadataMaxModelLen: the longest context the engine accepts, in
	// tokens; a whole number in [1, 2^32-1].
	MetadataMaxModelLen = "max_model_len"
	// MetadataProbeBudget: the number of requests an endpoint on probation
	// may receive during its probe slot.
	MetadataProbeBudget = "probe_budget"
	// MetadataPrefillRate: the engine's prefill throughput, prompt tokens
	// per second; at most MaxPrefillTokensPerSecond.
	MetadataPrefillRate = "prefill_tokens_per_s"
	// MetadataMaxNumSeqs: the engine's running-batch cap (vLLM
	// --max-num-seqs), sequences.
	MetadataMaxNumSeqs = "max_num_seqs"
	// MetadataRTT: the mean round trip from the region's data plane to the
	// endpoint or locality, milliseconds; at most MaxRTT.
	MetadataRTT = "rtt_ms"
	// MetadataJitter: that round trip's jitter (one standard deviation),
	// milliseconds; at most MaxRTT.
	MetadataJitter = "jitter_ms"
	// MetadataResidency: on a pinned cluster (PinnedClusterName), the
	// residency set's name, a string.
	MetadataResidency = "residency"
	// MetadataAllowedRegions: on a pinned cluster, the regions the set
	// allows, a sorted list of distinct strings (empty: none); a data
	// plane never picks an endpoint of another region for the cluster's
	// requests, and refuses the cluster when the two keys are malformed
	// rather than serve its requests anywhere.
	MetadataAllowedRegions = "allowed_regions"
)

// Bounds of the placement inputs: far above any real value; the server
// refuses a larger one as corrupt and a data plane counts it as unknown.
const (
	MaxPrefillTokensPerSecond = 1e9
	MaxRTT                    = time.Hour
)

// EndpointMetadata reads an endpoint's MetadataCell and MetadataMaxModelLen
// (0 when absent or not a whole number in [1, 2^32-1]). It accepts any
// metadata, nil included, as a data-plane consumer must.
func EndpointMetadata(md *core.Metadata) (cellID string, maxModelLen uint32) {
	fields := md.GetFilterMetadata()[MetadataKey].GetFields()
	cellID = fields[MetadataCell].GetStringValue()
	if v, ok := fields[MetadataMaxModelLen].GetKind().(*structpb.Value_NumberValue); ok {
		f := v.NumberValue
		if f >= 1 && f <= math.MaxUint32 && f == math.Trunc(f) {
			maxModelLen = uint32(f)
		}
	}
	return cellID, maxModelLen
}
