// Package summary owns the compact regional summary of docs/design.md
// §4.3: its aggregation from the regional registry's cells and its
// validation on receipt.
//
// The summary's encoded size is bounded by the number of models, context
// classes and demand slices — never by the number of cells, nor, since
// issue 26, by the number of regions: it lists the measured RTT to the
// Input.NearestRTT nearest regions (default DefaultNearestRTT, 8) and the
// region's Vivaldi network coordinate (hashicorp/serf coordinate, computed
// by regional/gossip). RTTMatrix (rtt.go) is the one place where a
// receiver rebuilds the RTT matrix it plans with: measured pairs where
// either region listed them, estimates from the coordinates elsewhere.
// Validate still accepts a full RTT list (a pre-issue-26 region, up to
// MaxRegions entries), so a mixed-version fleet keeps working during an
// upgrade; it refuses a coordinate that is not finite, out of bounds or
// of more than MaxCoordinateDims dimensions.
//
// bounds.go is the one set of bounds shared by what the regional
// controller accepts (heartbeat signals, data-plane reports) and what a
// summary may carry: Aggregate saturates every aggregate at them, so its
// output always passes Validate. ValidateAt also refuses summaries dated
// beyond MaxFutureSkew ahead of the receiver's clock.
//
// A model's demand may be split into at most MaxDemandSlices slices by
// criticality and allowed regions (slices.go): Aggregate canonicalises
// them (sorted, merged, a pinned slice never widened to "any": one with
// nowhere to go is taken out of demand_rps) and scales them to add up to
// demand_rps; Validate refuses a summary whose slices
// are malformed or do not add up to demand_rps within SliceSumTolerance.
//
// Aggregate, Validate and ValidateAt are pure functions (now is passed in)
// and safe for concurrent use, and so is RTTMatrix. The package is a
// leaf: of this module it imports only the protocol (and serf's coordinate
// type from outside).
package summary
