// Package summary owns the compact regional summary of docs/design.md
// §4.3: its aggregation from the regional registry's cells and its
// validation on receipt.
//
// The summary's encoded size is bounded by the number of models, context
// classes and regions — never by the number of cells — so the global
// controller's inbound traffic does not grow with the fleet.
//
// Aggregate and Validate are pure functions (now is passed in) and safe
// for concurrent use. The package is a leaf: it imports only the protocol.
package summary
