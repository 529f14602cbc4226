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
//   - This node's Vivaldi network coordinate (coordinate.go): every probe
//     ack carries the responder's coordinate (AckPayload) and the prober
//     updates its own with hashicorp/serf's coordinate.Client, as serf
//     does; the region's summary carries it, so the global estimates the
//     RTTs its summaries no longer list. Malformed or out-of-bounds
//     coordinates are refused and counted in
//     isobar_gossip_coordinates_refused_total{reason}.
//
// Received summaries: every envelope is size-capped (Config.MaxSummaryBytes)
// before it is decoded; then its time must not be ahead of this node's
// clock by more than Config.MaxClockSkew (a forged future time would win
// every later-time comparison below), it must name a known regional member
// whose meta region is the summary's region, carry that member's current
// public key and a valid signature over the summary, with Deps.Identity
// carry an identity proof of the member (below), pass the basic checks and
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
// Trust model: memberlist encryption (Config.SecretKey, read from a key
// file with ParseKey) keeps outsiders out; it is required with an
// Identity. memberlist itself tells members apart by nothing but what they
// say: an alive message carries whatever name, address and metadata its
// sender writes (hashicorp/memberlist v0.7.0 state.go aliveNode), and the
// one shared key of config.go SecretKey ("message-level encryption and
// verification") authenticates the cluster, not a member.
// Inside the cluster, summaries are signed with a per-process ed25519 key
// advertised in the member's metadata, so a relay cannot alter one. With
// Deps.Identity (identity.go, every fleet with mTLS), a regional member
// also signs its name and metadata, key and region included, with its
// spiffe://isobar/region/<region> certificate and every envelope carries
// that proof and the chain. A receiver verifies it against the fleet CA
// (Identity.Roots) before it accepts the member's summaries, counts the
// region alive or takes its RTT (Member.Verified), so a holder of the
// cluster key without the region's certificate cannot introduce a region,
// mask one, or get into a fallback route; refusals are counted as
// no_identity, bad_identity and future. Two holders of one region's
// certificate are one region: the later time wins between them, bounded by
// the skew allowance. Without an Identity (an --insecure fleet) a member's
// region is what its metadata says.
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
