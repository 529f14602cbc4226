// Package gossip is the memberlist cluster of the regional controllers (and
// the global controllers, which listen): it carries membership, the
// round-trip time between regions and each region's compact RegionSummary,
// so that a region can still route with spill-over when the global plan has
// expired (docs/design.md §5.4, static stability).
//
// What it owns:
//   - One memberlist node per controller. Node meta advertises role,
//     region, ingress address and the node's ed25519 public key.
//   - The latest RegionSummary of every region. The local one is set with
//     SetLocalSummary, signed, and spread three ways: piggybacked on UDP
//     gossip through a TransmitLimitedQueue when it fits a packet (else
//     sent over TCP to every member), sent over TCP to each member that
//     joins, and carried in every push-pull exchange (LocalState /
//     MergeRemoteState), which also relays the summaries of the other
//     alive members, so a joining node gets everyone's latest at once.
//   - The smoothed RTT per remote region, from memberlist's direct probes
//     (PingDelegate.NotifyPingComplete), an EWMA per region.
//
// Received summaries: every envelope is size-capped (Config.MaxSummaryBytes)
// before it is decoded; then it must name a known regional member whose
// meta region is the summary's region, carry that member's current public
// key and a valid signature over the summary, pass the basic checks and
// Deps.Validate, and be newer than the one held (same incarnation: higher
// sequence; another incarnation: a later time; a new key, i.e. the member
// restarted: always; another live member of the same region, a
// misconfiguration: a later time). Bad input is refused and counted in
// isobar_gossip_summaries_refused_total{reason} and logged at debug;
// routine repeats (duplicate, stale, our own, or signed by a key the member
// had before it restarted) are counted in
// isobar_gossip_summaries_ignored_total{reason}. A node that never saw a
// member's previous key counts a relayed old-key envelope as bad_signature.
// Nothing received can panic the node or replace a good summary. A summary
// whose region has no alive member is kept with its receive time and
// reported with Alive false.
//
// Trust model: memberlist encryption (Config.SecretKey) keeps outsiders
// out. Inside the cluster, summaries are signed by the member that made
// them, so a relay cannot alter one and a member cannot publish for another
// region under its own name. The binding of a public key to a member name
// is what memberlist's alive messages say, so a holder of the cluster key
// who forges alive messages for another member can still impersonate it
// (until that member refutes); defending against that needs per-member
// certificates, which this package does not have.
//
// Concurrency model: memberlist calls the delegates (delegate) from its
// own goroutines, the event delegate with memberlist's node lock held; they
// touch only the book (one mutex, held for map work only, never while
// calling memberlist) and poke one-slot channels. The node owns two
// goroutines, started by Start and joined by Stop: the join loop (retries
// the seeds with backoff on Deps.Clock while no other member is alive) and
// the send loop (direct TCP sends of the local summary). Stop cancels both,
// waits for them (an in-flight join or send ends within memberlist's
// TCPTimeout), leaves the cluster within Config.LeaveTimeout and shuts
// memberlist down. memberlist's own timers run on real time; Deps.Clock
// stamps receive times and member state changes and drives the join
// backoff. memberlist logs through Go's log package; those lines are
// bridged to Deps.Logger at debug level.
package gossip
