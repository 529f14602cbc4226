package xdsclient

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// The --lb isobar pick reads these keys of the isobar filter-metadata
// namespace (xdscontract.MetadataKey), as the regional controller writes
// them. Each is optional: an absent, non-numeric, negative, non-finite or
// absurd value counts as unknown.
//
//   - xdscontract.MetadataPrefillRate, an endpoint's prefill rate in prompt
//     tokens per second (its capacity class). Unknown: placement's
//     DefaultPrefillTokensPerSecond (Config.Placement).
//   - xdscontract.MetadataRTT, the mean round trip to an endpoint in
//     milliseconds, on the endpoint or on its locality (the endpoint's
//     wins). Unknown: 0.
//   - xdscontract.MetadataJitter, that round trip's jitter (one standard
//     deviation) in milliseconds, endpoint then locality. Unknown: 0.
//   - xdscontract.MetadataMaxNumSeqs, an endpoint's running-batch cap (vLLM
//     --max-num-seqs): a whole number of sequences in [1, maxMetadataSeqs].
//     Unknown: 0.

// maxMetadataSeqs bounds max_num_seqs from metadata (2^20 sequences, far
// above any engine's batch).
const maxMetadataSeqs = 1 << 20

// maxMetadataMillis bounds RTT and jitter from metadata: xdscontract.MaxRTT
// (one hour) in milliseconds.
const maxMetadataMillis = float64(xdscontract.MaxRTT / time.Millisecond)

type placementMeta struct {
	prefillRate float64
	rtt, jitter time.Duration
	// maxNumSeqs is the engine's batch-slot cap (0: unknown). It feeds the
	// pick's slot term: requests beyond it queue for a slot.
	maxNumSeqs int64
}

// placementMetadata reads the placement keys from an endpoint's metadata,
// falling back to its locality's for RTT and jitter.
func placementMetadata(ep, loc *core.Metadata) placementMeta {
	epf := ep.GetFilterMetadata()[xdscontract.MetadataKey].GetFields()
	locf := loc.GetFilterMetadata()[xdscontract.MetadataKey].GetFields()
	var m placementMeta
	if v, ok := metaNumber(epf, xdscontract.MetadataPrefillRate, xdscontract.MaxPrefillTokensPerSecond); ok {
		m.prefillRate = v
	}
	if v, ok := metaNumber(epf, xdscontract.MetadataMaxNumSeqs, maxMetadataSeqs); ok && v >= 1 && v == math.Trunc(v) {
		m.maxNumSeqs = int64(v)
	}
	for _, f := range []struct {
		key string
		dst *time.Duration
	}{{xdscontract.MetadataRTT, &m.rtt}, {xdscontract.MetadataJitter, &m.jitter}} {
		v, ok := metaNumber(epf, f.key, maxMetadataMillis)
		if !ok {
			v, ok = metaNumber(locf, f.key, maxMetadataMillis)
		}
		if ok {
			*f.dst = time.Duration(v * float64(time.Millisecond))
		}
	}
	return m
}

// maxProbeBudget bounds a believed probe budget: the controller's default
// is 3; a larger budget than this is not a probe.
const maxProbeBudget = 1 << 16

// probeBudget reads an endpoint's xdscontract.MetadataProbeBudget, 0 when
// absent or not a whole number in [1, maxProbeBudget].
func probeBudget(ep *core.Metadata) uint32 {
	v, ok := metaNumber(ep.GetFilterMetadata()[xdscontract.MetadataKey].GetFields(), xdscontract.MetadataProbeBudget, maxProbeBudget)
	if !ok || v < 1 || v != math.Trunc(v) {
		return 0
	}
	return uint32(v)
}

// metaNumber returns fields[key] when it is a number in [0, limit].
func metaNumber(fields map[string]*structpb.Value, key string, limit float64) (float64, bool) {
	v, ok := fields[key].GetKind().(*structpb.Value_NumberValue)
	if !ok || !(v.NumberValue >= 0 && v.NumberValue <= limit) {
		return 0, false
	}
	return v.NumberValue, true
}

// residencyMetadata reads a pinned cluster's residency set and allowed
// regions (xdscontract.MetadataResidency, MetadataAllowedRegions under
// MetadataKey). Neither key: an unpinned cluster ("", nil). Unlike the
// placement keys, a malformed residency is not read as unknown, which
// would serve the set's requests anywhere: it is an error, so the whole
// CDS response is refused (NACKed, counted) and the clusters in use
// stay. The set is a name by xdscontract.CheckName; the regions a list
// of at most residency.MaxRegions such names, returned sorted and
// distinct (an empty list: served nowhere).
func residencyMetadata(md *core.Metadata) (set string, regions []string, err error) {
	fields := md.GetFilterMetadata()[xdscontract.MetadataKey].GetFields()
	sv, hasSet := fields[xdscontract.MetadataResidency]
	rv, hasRegions := fields[xdscontract.MetadataAllowedRegions]
	switch {
	case !hasSet && !hasRegions:
		return "", nil, nil
	case !hasSet:
		return "", nil, errors.New("metadata: allowed_regions without a residency set")
	}
	s, ok := sv.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return "", nil, fmt.Errorf("metadata: residency is a %T, not a string", sv.GetKind())
	}
	if err := xdscontract.CheckName("metadata residency", s.StringValue); err != nil {
		return "", nil, err
	}
	list, ok := rv.GetKind().(*structpb.Value_ListValue)
	if !ok {
		return "", nil, fmt.Errorf("metadata: residency set %q without an allowed_regions list", s.StringValue)
	}
	vs := list.ListValue.GetValues()
	if len(vs) > residency.MaxRegions {
		return "", nil, fmt.Errorf("metadata: residency set %q allows %d regions, at most %d", s.StringValue, len(vs), residency.MaxRegions)
	}
	regions = make([]string, 0, len(vs))
	for _, v := range vs {
		r, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return "", nil, fmt.Errorf("metadata: residency set %q: allowed region %T is not a string", s.StringValue, v.GetKind())
		}
		if err := xdscontract.CheckName("metadata allowed region", r.StringValue); err != nil {
			return "", nil, err
		}
		regions = append(regions, r.StringValue)
	}
	slices.Sort(regions)
	return s.StringValue, slices.Compact(regions), nil
}
