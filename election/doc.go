// Package election is leader election on etcd for the global controllers'
// HA pair, with fencing, plus an embedded etcd member for the lab and tests
// and a client constructor for an external (TLS) cluster.
//
// What it owns:
//   - Candidate: campaigns in one election (keys Prefix+hex(lease), ordered
//     by create revision: the protocol of etcd's concurrency.Election, so
//     upstream observers interoperate). A term of office is a Leadership
//     whose Epoch, the key's CreateRevision, is the fencing token; epochs
//     strictly increase across terms. Every term has its own session
//     (lease of TTL); Run re-campaigns with a fresh one after each term.
//   - FencedPut/FencedTxn: writes guarded by CreateRevision(Key) == Epoch,
//     so a deposed leader's writes fail with ErrNotLeader.
//   - Leader, Observe, Depose: read, follow and (for operators and drills)
//     depose the leader of any election prefix.
//   - StartEmbedded/Embedded and NewClient/ClientConfig.
//
// Two upstream client pitfalls are handled here:
//  1. concurrency.Election.Campaign leaves the candidate's key behind, until
//     its lease expires, when it fails for a reason other than ctx (etcd
//     issue #21128); its ctx path resigns with the client's context and so
//     blocks while etcd is unreachable. Candidate runs the same protocol
//     itself and closes the session (revokes the lease, deleting the key at
//     once) on any campaign error, with every cleanup bounded by TTL.
//  2. concurrency.ResumeElection does not add the trailing "/" that
//     concurrency.NewElection adds (etcd PR #10297). Prefixes are
//     normalised to end in "/" everywhere, and NewElection/ResumeElection
//     here wrap the upstream constructors so both see the same keys.
//
// Concurrency model and contracts:
//   - A Candidate holds at most one term. Campaign, Resign and Run are safe
//     to call from any goroutine; a second concurrent Campaign or Run gets
//     ErrBusy, and so does a Campaign while the previous term's cleanup
//     (bounded by TTL) is still running.
//   - Each term has one monitor goroutine, started by Campaign. It waits for
//     the end of the term (session lost, key deleted or replaced, Resign,
//     Campaign's ctx done), closes Leadership.Done first, then revokes the
//     lease (bounded by TTL) and exits. Resign and Run join it.
//   - Leadership.Done is the only authority: act as leader only while it is
//     open, and write through the fence, which also refuses once Done is
//     closed. Run cancels lead's context when Done closes, waits for lead
//     to return, and only then ends the term.
//   - Run owns one observer goroutine (Observe) for KnownLeader and the
//     leader-change counter, joined before Run returns. Observe's goroutine
//     is owned by its ctx and joined by draining its channel to the close.
//   - Timers of this package (Run's back-off, the monitor's re-watch, the
//     observer's retry) use the injected clock. etcd's own lease keep-alive
//     runs on real time inside the client: a session is lost when no
//     keep-alive succeeded for TTL (checked each second), so while etcd is
//     unreachable a leader's Done closes within about TTL + 1 s.
//
// Metrics (registered on Deps.Registerer, one registry per candidate):
// isobar_election_is_leader, isobar_election_terms_total,
// isobar_election_leader_changes_total (seen while Run runs),
// isobar_election_fenced_writes_refused_total and
// isobar_election_campaign_failures_total.
//
// The embedded member is tuned for 1-second leases (raft tick 50 ms,
// election 500 ms); its Stop is graceful and can take up to etcd's request
// timeout (6 s) when clients hold streams open.
package election
