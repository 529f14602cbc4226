// Package lb reproduces, pick for pick, the host choice of stock Envoy's
// ROUND_ROBIN and LEAST_REQUEST load balancers, so that a benchmark (and
// later isobar's gateway) can model an Envoy deployment faithfully. It is
// pure: no I/O, no clock, no goroutines, no global state. Randomness is
// injected per pick and active-request counts are read from the caller.
//
// # What Envoy does, and where this package follows it
//
// Sources read (envoyproxy/envoy, main branch as indexed in late 2026):
//
//   - source/common/upstream/edf_scheduler.h, EdfScheduler: the version
//     with createWithPicks and the 1e-13 weight epsilon (PR 31592), which
//     current Envoy always uses. → EDF, NewEDFWithPicks. Older Envoy, or
//     one run with envoy.reloadable_features.edf_lb_host_scheduler_init_fix
//     set to false (a guard that defaulted to true and has since been
//     removed with its legacy path), instead added the hosts one by one and
//     made seed mod n real picks; this package follows the current source
//     only.
//   - source/extensions/load_balancing_policies/common/load_balancer_impl.{h,cc}
//     at commit e01a970ac688b05de9f57591a17d23f493e3969b:
//     EdfLoadBalancerBase's constructor (seed_ = random()), refresh (one
//     scheduler per host source; none when hostWeightsAreEqual or when
//     there is at most one host; otherwise createWithPicks(hosts,
//     hostWeight, seed_)), and chooseHostOnce (one random() for
//     hostSourceToUse, then edf_->pickAndAdd(hostWeight) or
//     unweightedHostPick). → Balancer.Update, Balancer.Pick.
//   - source/extensions/load_balancing_policies/round_robin/round_robin_lb.h
//     at 964dd46212f20ec002ea84594909f6f3a867321e: rr_indexes_ starts at
//     seed_ (inserted once, never reset by a refresh), the unweighted pick
//     is hosts[rr_index++ % n], and hostWeight is the static weight.
//   - source/extensions/load_balancing_policies/least_request/least_request_lb.{h,cc}
//     at 3b0bcb125b34a5447f21d6ff10ed6cbdef600da6 (.cc) and
//     ee2107ff308b8465fbea7daf12d1fbdd5e483885 (.h):
//     unweightedHostPickNChoices (choice_count draws random()%n with
//     replacement; a draw replaces the candidate only with strictly fewer
//     active requests, so ties keep the earlier draw),
//     unweightedHostPickFullScan (lowest count; the k-th host met tied for
//     lowest replaces the candidate when random()%k == 0: reservoir
//     sampling, one draw per tie), and hostWeight
//     (weight / (rq_active+1)^active_request_bias, exact division for bias
//     1, static weight for bias 0).
//
// What "active requests" means is the caller's: Envoy compares the host's
// rq_active gauge (requests attached to an upstream stream). Since PR 45168
// Envoy can add the requests still queued in the connection pool
// (rq_pending_active) behind the runtime guard
// envoy.reloadable_features.least_request_lb_count_pending_requests,
// default off; a caller modelling that guard passes the sum through Active.
//
// # The property that matters: stale least-request weights
//
// With unequal weights LEAST_REQUEST is not "least request" at all but EDF
// over effective weights, and a host's effective weight is computed only
// when the host is (re)added to the schedule: at refresh, and after each of
// its own picks — with the active count at the moment of the pick, before
// the request just routed to it is counted. Between its picks a host keeps
// the deadline its old count gave it, however many requests land on it
// from other workers (or from this one) in the meantime. With equal weights
// it is stateless: N_CHOICES or FULL_SCAN on the live counts.
//
// Two more consequences of following the source: every refresh rebuilds the
// schedule from the same seed_, so frequent host-set updates restart a
// weighted schedule at the same point each time; and the unweighted
// round-robin index is never reset, so a refresh continues the rotation
// (modulo the new host count) rather than restarting it.
//
// # Concurrency model
//
// Envoy gives each worker thread its own thread-local load balancer: its
// own seed_, round-robin index and EDF schedules, while the per-host
// rq_active counter is shared by all workers. A Balancer is one such
// thread-local instance and belongs to one goroutine; a Pool holds one per
// worker. Counts are the caller's (interface Active), so a single-goroutine
// simulation can pass a plain slice (Counts) and a concurrent gateway can
// pass atomics.
//
// # Host identity and the host set
//
// A host is an index into the caller's weight slice. Update takes the
// weights of the hosts the caller wants balanced — in Envoy terms the
// healthy hosts of the chosen priority, or all hosts in panic; the caller
// applies health and the panic threshold itself. Weight 0 (which Envoy's
// API does not allow) removes a host from the set. Whether the weights are
// "all equal" (unweighted pick) or not (EDF) is decided, as Envoy decides
// it per host source, over the positive weights given to the last Update.
//
// # Not modelled
//
// Priority levels and priority load, the panic threshold, zone-aware
// routing and locality-weighted balancing, slow start, host predicates and
// retries of chooseHost (hostSelectionRetryCount), override hosts,
// preconnect peeking (peekAnotherHost, peekAgain and its stashed randoms),
// and the runtime overrides of active_request_bias (Envoy falls back to 1.0
// on a negative or NaN bias; Policy.Validate refuses one). The one random
// value chooseHostOnce draws for the host source is still consumed, so a
// script of Envoy's random values replays exactly.
package lb
