// Package global is the global controller: one member of the HA pair that
// routes traffic between regions (docs/design.md §5).
//
// Both members campaign on an etcd election (package election). The leader
// accepts GlobalControl.Sync streams from regional controllers, keeps the
// latest summary of each region with its age, and every cycle solves the
// cross-region problem (package optimize) per model, damps the change
// against the previous plan, writes the plan to etcd in a transaction
// guarded by its election key's revision (the fencing epoch) and sends each
// region its part. A standby answers Sync with FailedPrecondition naming
// the leader. A region whose summaries are older than RegionTTL is treated
// as down: it is left out of the problem and receives nothing.
//
// RTTs (issue 26): a region's summary lists the measured RTT to its
// nearest regions only (8 by default) and carries its Vivaldi network
// coordinate, so the leader's intake grows linearly in regions. The
// planner's RTT matrix is summary.RTTMatrix over the live regions' latest
// summaries: a pair either region listed is measured (the mean when both
// did), any other pair is the distance between their coordinates, +Inf
// without them. A pre-issue-26 region lists every peer and sends no
// coordinate; it is accepted and its pairs count as measured.
//
// Demand slices (slices.go): each model's demand is planned by
// (criticality, allowed regions) as the regions' summaries split it
// (demand_slices, validated by package summary; none is one standard,
// unpinned slice of demand_rps) with optimize.SolveSlices, so a shortfall
// sheds sheddable demand first, then standard, and critical only when it
// alone exceeds what it may use. Every ingress whose summary carried
// slices gets a SlicePlan per slice; routes and shed stay its unpinned
// standard slice's. A pinned slice is never routed outside its regions:
// the solver cannot, damping mixes rows that are both zero outside them,
// and a share outside them would be shed. An allowed region that is not
// live is dropped from the slice (counted in
// isobar_global_slice_regions_unknown_total); a slice left with none is
// shed whole. Without slices the plans are those of before, bit for bit
// (tested against the earlier planner).
//
// Concurrency: each Sync stream runs on its gRPC handler goroutine and
// writes summaries into the summary store (mutex); the leader loop runs on
// the election's term goroutine, reads a copy of the store, plans, and
// publishes through the plan hub, which hands each stream its region's
// latest plan through a one-slot mailbox (a slow region never blocks the
// loop, it just skips to the newest plan).
//
// Limits (Config.Limits): the store holds at most MaxRegions regions (a new
// one beyond it is refused with ResourceExhausted, counted as
// too_many_regions, unless a region silent for RegionForgetAfter is
// forgotten to make room), the gRPC server receives at most
// MaxRecvMsgBytes per message, and a summary whose own time is further
// than MaxClockSkew from this member's clock flags its region. Every age
// and liveness decision uses the receive time on this member's clock,
// never a region's timestamps.
//
// Authorisation: with TLS a Sync stream is served only to a client whose
// verified certificate carries the URI identity spiffe://isobar/region/<name>
// (no common-name or DNS-SAN fallback), and it may send summaries only for
// that region; anything else is PermissionDenied, logged with the peer's
// identity and counted (isobar_global_summaries_rejected_total, reasons
// no_identity and identity_mismatch). Members present
// spiffe://isobar/global/<name>, the only identity regions take plans from.
package global
