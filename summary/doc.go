// Package summary owns the compact regional summary of docs/design.md
// §4.3: its aggregation from the regional registry's cells and its
// validation on receipt.
//
// The summary's encoded size is bounded by the number of models, context
// classes and regions — never by the number of cells — so the global
// controller's inbound traffic does not grow with the fleet.
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
// and safe for concurrent use. The package is a leaf: it imports only the protocol.
package summary
