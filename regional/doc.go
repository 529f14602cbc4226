// Package regional is the per-datacenter controller: it owns the cell
// registry (heartbeats, TTL failure detection, lifecycle), scores every
// cell's pressure (for explanation, alerts and the summary), projects each
// cell's slow facts (lifecycle, error-rate penalty, hardware derate,
// capacity class; not its load) into banded endpoint weights and health
// (regional/projection) and pushes them to the region's Envoy (and
// gateways, and proxyless gRPC clients) over xDS.
//
// Concurrency model (single-writer actor):
//   - One goroutine, the registry loop, owns every cell record, the
//     projector and the penalty state. Everything else talks to it through
//     its inbox: heartbeat streams hand over validated heartbeats with
//     SubmitOrBlock, the prober hands over RTT samples, operators hand over
//     drain requests. Stream losses have a lane of their own, taken before
//     the heartbeats queued ahead of them (streamloss.go). After a
//     successful submit the registry owns the message; the sender must not
//     touch it again. Each write the loop makes to what a cell's view is
//     made of touches the cell, and a cycle reads only the touched cells
//     (touched.go).
//   - The registry publishes an immutable *View through an atomic pointer
//     after every cycle; the debug endpoint, the metrics collector, the
//     prober and the heartbeat streams (for commands) read it without locks.
//   - xDS pushes run on a separate publisher goroutine fed by a one-slot
//     mailbox: a burst of changes coalesces into one snapshot build. A
//     state the publisher is done with (pushed, refused, or replaced in the
//     mailbox) goes back to the registry (publisher.takeSpent), which
//     builds a later state in its buffers (cycle.Params.Reuse), and the
//     registry alternates two weight maps the same way: at 10,000 cells
//     these were a megabyte of garbage a cycle.
//   - Warm start (warmstart.go): the registry loop owns the hold that keeps
//     a starting controller's first push back until the cells of its last
//     pushed state are back; the publisher goroutine alone writes that
//     state to Config.WarmStart.StateDir after each push, and Start reads
//     it once before the loop runs. Registry.Settled (an atomic) tells the
//     summary goroutine when it may summarise and fall back.
//   - Each heartbeat stream runs on its gRPC handler goroutine and keeps its
//     own per-stream state (sequence, ownership of its cell id).
//   - The syncer (globalsync.go) composes four parts, each owning its
//     state: the summary builder (summarybuilder.go), the fallback planner
//     (fallback.go), the route keeper (routekeeper.go: the table in force
//     and the plan fence, under its mutex) and the leader session
//     (leadersession.go: leader lookup and the Sync stream, its goroutine).
//     The summary goroutine owns the builder's demand smoother and
//     capacity estimator (regional/capacity): each summary feeds the
//     estimator every cell heartbeat the view shows for the first time, so
//     a cell's capacity in the summary moves from the configured prior to
//     what its engine shows.
//
// Failure detection has two paths. A heartbeat stream that ends without a
// Terminated report (the agent process was killed, its host or link died)
// is reported by its handler to the registry (StreamLost), which makes the
// cell suspect: it keeps its lifecycle state but is projected with weight
// 0 in the cycle that message triggers, so it leaves the xDS endpoints
// without waiting for a tick. A heartbeat on a new stream (the agent
// reconnected within the TTL) restores it; otherwise the TTL fails it as
// before. A hung agent whose stream stays open is caught by the TTL alone.
// When most live cells pass their TTL in one sweep, the sweep holds them,
// for at most Config.MassExpiry.Hold, rather than fail them: the likelier
// cause is this controller stalling or falling behind (massexpiry.go).
//
// Limits (Config.Limits, limits.go) bound what peers can make the
// controller hold: MaxCells cells (checked by the heartbeat service when a
// stream claims a new cell id, and again by the registry loop), a token
// bucket per heartbeat stream, MaxDemandKeys data-plane demand windows and
// the gRPC receive size. Heartbeat streams are bounded too: at most
// MaxHeartbeatStreams open at once (one more is refused with
// ResourceExhausted), each must send its first heartbeat within
// Config.FirstHeartbeatTimeout (the first receive runs in a goroutine that
// ends when gRPC closes the stream, right after the handler returns), and a
// heartbeat over MaxMessageBytes is refused on its encoded size before it
// is decoded (heartbeatCodec, wirecodec.go). The gRPC server's keepalive,
// ping enforcement and streams per connection come from
// internal/grpcbounds (Config.Keepalive), as do the keepalive of the Sync
// stream to the leader (GlobalConfig.Keepalive). Plans are bounded in models, routes and ingress
// addresses. Liveness (TTL), staleness and plan validity run on the
// controller's own clock at receipt; a cell's sent_at only raises the
// clock-skew flag. Heartbeat signals and report counts are bounded by the
// bounds a summary is validated against (summary/bounds.go): a finite
// signal above its bound is capped per cell and counted, a report beyond
// the rate bound refused, so whatever is accepted can be published.
//
// Authorisation (identity.go): with Config.TLS every client is known by the
// isobar URI identity of its verified certificate, never by a common name
// or DNS SAN. Heartbeats come only from spiffe://isobar/region/<region>/cell/<id>
// of this region, for that cell id and region, advertising an endpoint the
// certificate allows (endpointbind.go: an IP SAN by default, a prefix of
// the endpoint map with mapping, any with off); xDS and DataPlane reports
// only from spiffe://isobar/gateway/<region> of this region; plans are taken
// only from a global leader whose server certificate is
// spiffe://isobar/global/<name> (checked on the Sync stream before any
// summary is sent). Refusals are PermissionDenied, logged with the peer's
// identity and counted. The debug pages and drain API (debug.go,
// adminPolicy) are served over TLS with Config.TLS and then need an
// operator identity, spiffe://isobar/operator/<name>, or the admin token;
// POSTs must be JSON and cross-origin requests are refused. Without TLS
// (isobar regional --insecure) nobody is authenticated on gRPC, and the
// admin endpoints need the token when one is set.
//
// Overload that protects what matters (issue 25; docs/design.md §5.6).
// Data planes report each model's demand split by criticality and
// residency set (demandslices.go); the registry keeps the split in its
// demand windows (a set this controller's Config.Residency does not define
// is counted and taken as standard unpinned, never as a pin) and the
// summary carries it as demand_slices by allowed regions
// (summaryslices.go). Plans carry slices back: per-criticality shed for
// the unpinned demand and, per set of allowed regions, routes and shed
// (planslices.go); a plan routing a pinned slice outside its regions is
// refused (plans_total result "residency") and the last good plan kept.
// The cycle (regional/cycle, pinned.go) builds one xds.Pinned per set of
// each model from the plan's slice, or, with no slice, no plan or on the
// gossip fallback, from the local cells when the region is allowed, else
// the nearest allowed region's ingress: never a region the set does not
// allow, whatever the route source. The retry budget of each model's
// clusters follows the region's utilisation (load over capacity, from the
// summary; retrybudget.go) unless Config.StaticRetryBudget.
//
// Time is injected (clockwork.Clock); scoring, projection, lifecycle and
// capacity estimation are pure packages (regional/score,
// regional/projection, regional/lifecycle, regional/capacity) that take now
// as an argument.
package regional
