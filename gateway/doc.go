// Package gateway is isobar's HTTP data plane for places without Envoy (dev,
// CI, benchmarks, the lab): `isobar gateway`. It consumes the ADS resources
// the regional controller serves to Envoy and honours them as Envoy would.
// The names, headers, metadata keys and validation it shares with the
// controller are package xdscontract's; it imports nothing of the regional
// controller.
//
// # What it owns
//
//   - xDS consumption, through package gateway/xdsclient (which owns the
//     ADS streams, decoding and validation, route matching and the Table
//     view): three subscriptions (CDS, EDS, RDS), whose accepted responses
//     this package links to its runtime state; a refused one is NACKed,
//     counted and logged, and the previous resources of that type stay in
//     use. Without its controller the gateway keeps routing on what it last
//     accepted. The streams receive responses up to
//     Config.MaxXDSMessageBytes (xdscontract.MaxXDSMessageBytes of the
//     controller's cell cap); each response's size is exported, one above
//     75 % of the limit is counted and warned about, and a stream broken by
//     one above it is counted (isobar_gateway_xds_responses_*).
//   - The routing table (table.go): the Table view (xdsclient.Table, read-only,
//     replaced on every accepted update) linked to the per-address and
//     per-cluster runtime state (in-flight counts, outlier state, load
//     balancers).
//   - The proxy. POST /v1/completions and /v1/chat/completions; GET
//     /v1/models (the models the routes name, with the largest known
//     max_model_len), /health (200 once routes, clusters and endpoints
//     arrived) and /metrics (Deps.Gatherer). A completion request is
//     admitted first: past Config.MaxInflightRequests it is answered 503
//     before its body is read. When its headers name its model and declare
//     its length, it is routed, counted and shed by the plan before the
//     body is read too. Its headers and body must arrive within
//     Config.ReadTimeout (else 408, connection closed); the deadline is then
//     lifted, and the route's timeout bounds the rest: when it ends, a
//     write blocked on a client that does not read fails within a second
//     (a write deadline), freeing the request's slots. Idle keep-alive
//     connections close after Config.IdleTimeout. A request body is read
//     once, capped at Config.MaxBodyBytes (413), and kept for retries. The
//     hop header is trusted only with a valid proof made with Config.HopKey
//     (hop.go); otherwise it, the proof and the route configuration's
//     internal_only_headers are removed before the route is matched. The route
//     is matched as Envoy matches: virtual host by Host, then the first
//     route whose path and header matchers (exact, prefix, suffix,
//     contains, RE2 regex, present, int64 range, invert, ignore case) all
//     hold. Config.ModelHeader is taken from the body's "model" when the
//     client did not send it, and content-length is the body's length
//     (chunked bodies included); the controller's routes turn it into a
//     token need at 4 bytes per token when x-isobar-prompt-tokens is absent
//     (xdscontract.BytesPerToken). The route's fault abort sheds its share of
//     requests with a JSON error of its status (429, with Retry-After and
//     xdscontract.ShedHeader "plan"); the controller's per-criticality
//     routes carry their own share, so a sheddable-only share sheds only
//     sheddable requests.
//   - The request class (class.go), settled before the route is matched, by
//     the proxy and Gateway.Pick alike (classify, one function): the
//     criticality from xdscontract.CriticalityHeader, else the Inference
//     Extension objective (xdscontract.ObjectiveHeader) through
//     Config.ObjectivePriority and reqclass.FromPriority, else standard
//     (unknown or repeated values standard and counted); "critical" kept
//     only from Config.TrustedSources (default none) or with a valid hop
//     proof, else lowered to standard and counted; the tenant
//     (xdscontract.TenantHeader) normalised and bounded (reqclass), bucketed
//     for fairness among at most Config.MaxTenants; the residency set
//     Config.Residency.Lookup(tenant, model). The headers are rewritten
//     canonically (criticality always set, tenant normalised, the residency
//     header set from the gateway's own config or removed) so that routes
//     match the gateway's decision and the next hop reads it.
//   - Residency: a request with a residency set is never sent to an
//     endpoint whose region (this gateway's for one without) the set does
//     not allow, in every --lb mode, every fallback (the scan, ejected
//     hosts, retries to tried hosts, priority spill) and in Gateway.Pick,
//     whatever the routes say: the pick treats such hosts as absent. When
//     none is left the answer is 503 naming the set and its regions
//     (isobar_gateway_residency_refused_total).
//   - Flow control (flow.go, package gateway/flowcontrol): a request whose
//     first pick finds every eligible endpoint at its in-flight cap waits
//     in one bounded queue (bands by criticality, round-robin between
//     tenant buckets within a band, Config.Queue's length, total and age
//     bounds) instead of being answered 429; each slot an attempt gives
//     back, and each table update, dispatches the first waiter in that
//     order whose own pick succeeds. Full, evicted (a more critical arrival
//     while the queue is full) or expired: 429 with Retry-After and
//     xdscontract.ShedHeader queue_full, queue_evicted or queue_expired.
//     The queue's policy is flowcontrol.DefaultConfig's unless Config.Queue
//     says otherwise (flags --queue-length, --queue-total, --queue-max-age,
//     --queue-newest-first, --queue-objective, --queue-no-yield):
//     critical waits up to 10 s, oldest first (a liveness bound);
//     standard and sheddable wait until their wait plus the measured time
//     to first token reaches the 1.5 s TTFT objective (Objective), and are
//     served newest first within a tenant (NewestFirst), so that under a
//     sustained shortfall the requests served still meet the objective.
//     Yield: after a more critical request went unserved (expired,
//     evicted, refused), a less critical class yields for the longer of
//     that class's max age and the mean slot hold: a fresh request of it
//     is queued even while a slot is free (isobar_gateway_queue_yielded_total;
//     when the queue refuses it, it is picked for as usual), freed slots
//     go to the more critical classes, and a timer at the yield's end
//     offers the queue again. Before each call the queue is told the mean
//     slot hold over the table's endpoints and the EWMA (weight 0.1) of
//     send → first byte over successful answers. The bench's
//     overload_priority stage drives the same queue with the same calls
//     (bench/paper flow.go). Gateway.Pick neither queues nor yields; in a
//     gateway that also proxies it takes the same caps.
//     Config.NoQueue answers 429 "saturated" at once instead, as
//     Gateway.Pick always does (Envoy bounds an ext_proc answer by its
//     message_timeout, 200 ms by default, too short to wait in). The queue is
//     in /metrics (isobar_gateway_queue_*) and GET /debug/queue
//     (QueueState).
//   - Load balancing (balancer), with no weighted-random pick anywhere.
//     LBXDS behaves as stock Envoy on the same resources, citing its
//     source (load_balancer_impl.cc, locality_wrr.cc, round_robin_lb.h,
//     least_request_lb.cc, random_lb.cc, edf_scheduler.h): one random value
//     per pick chooses the priority, and whether its healthy or its EDS
//     DEGRADED hosts serve, by Envoy's integer priority load (health =
//     min(100, 140 × healthy / total), degraded likewise; healthy load
//     first, then degraded, normalised by the total availability capped at
//     100; then hash % 100 + 1 into the cumulative loads); a priority is
//     in panic, and balances over all its hosts, when that total is below
//     100 and its healthy and degraded hosts are below 50 % (when every
//     priority is, the load follows host counts); otherwise, when the
//     cluster is locality-weighted, LocalityWrr's EDF schedule (seeded
//     with a fresh random value at each rebuild) over weight × min(1, 1.4 ×
//     eligible share) chooses the locality; then the cluster's policy
//     picks within that host source
//     through package gateway/lb: ROUND_ROBIN (rotation when the weights
//     are equal, EDF over the weights otherwise), LEAST_REQUEST (N_CHOICES
//     with choice_count draws, or FULL_SCAN, on the live in-flight counts
//     when the weights are equal; EDF over weight/(active+1)^bias, a
//     host's weight recomputed only when it is picked, when they differ)
//     or RANDOM (hosts[random % n]). The policy comes from the typed
//     load_balancing_policy (LeastRequest, RoundRobin, Random: the first
//     the gateway knows) or the legacy lb_policy; an unknown one (RING_HASH,
//     MAGLEV, another extension) falls back to ROUND_ROBIN, Envoy's
//     default, with a warning and isobar_gateway_lb_policy_fallbacks_total.
//     A host source's schedule is rebuilt (Envoy's refresh, from the same
//     seed, the round-robin index kept) when its priority's host set,
//     weights or healthy set change — an xDS update that changes them, or
//     an ejection starting or ending — never per request. LBIsobar chooses
//     the priority (and healthy or degraded) the same way, then the least
//     expected time to first token among those hosts, across its
//     localities of positive weight (package placement: RTT + 2 × jitter +
//     (pending prompt tokens + this prompt's uncached tokens) / prefill
//     rate + Config.Placement.DecodeCost (25 ms) per request in flight +
//     the wait for a batch slot, ties at random; with prefix affinity, the
//     longest expected cached prefix among the hosts within
//     Config.Placement.AffinityBand of the best). The gateway counts each
//     address's pending prompt tokens itself: an attempt adds its
//     request's uncached tokens when it is sent and takes them back at its
//     first response body byte, or when it fails or ends without one. A
//     request's tokens are x-isobar-prompt-tokens when that is one integer
//     in [1, min(2^20, body bytes)], else ⌈body bytes / 4⌉. Prefix
//     affinity (on unless Config.NoPrefixAffinity) hashes the prompt text
//     (a completions prompt string, or the chat messages' roles and text
//     in order; token-id prompts and prompt lists get none) into 64-byte
//     blocks (package prefix), expects an address to hold the leading
//     blocks of the prompts it was sent (an index bounded per address and
//     in all, least recently sent evicted first), and records a prompt's
//     blocks against the address each attempt goes to. Prefill rate,
//     RTT and jitter come from the endpoint's isobar metadata
//     (xdscontract.MetadataPrefillRate, MetadataRTT, MetadataJitter; RTT and
//     jitter also from the locality's), defaults when absent. LBRoundRobin and
//     LBLeastRequest are the baselines: Envoy's ROUND_ROBIN and default
//     LEAST_REQUEST (two choices) over all the cluster's endpoints with
//     equal weights, ignoring localities and priorities. In every mode a
//     host of weight 0 is never picked, and everything else (retries,
//     ejection, caps, shedding) is the same. A pick the previous_hosts
//     predicate or the in-flight cap rejects is drawn again up to the
//     route's host_selection_retry_max_attempts, as Envoy's chooseHost
//     does; where Envoy would then take the last draw anyway, the gateway
//     takes the acceptable endpoint with the fewest requests in flight. An
//     endpoint at its in-flight cap takes no more requests; when every
//     candidate is full the request waits in the flow-control queue (or,
//     with Config.NoQueue, is answered 429). The cap (balancer.capOf) is
//     flowcontrol.EndpointCap: the batch the endpoint declares
//     (xdscontract.MetadataMaxNumSeqs) plus the requests that will find a
//     slot free on arrival (max_num_seqs × RTT / slot hold, the slot hold
//     an EWMA of how long a successful request held the endpoint's batch
//     slot), at most Config.MaxInflightPerEndpoint, which is also the cap
//     of an endpoint that declares no batch. What the engine cannot start
//     at once waits at the gateway, where it is ordered by criticality,
//     rather than in the engine's FCFS queue. With Config.NoQueue or
//     HealthOnly (the picker) the cap is MaxInflightPerEndpoint: nothing
//     would wait at the gateway. The in-flight counts,
//     pending tokens and outlier state belong to the address, shared by
//     all the clusters that list it (a cell is in its model's main, local
//     and class clusters), where Envoy would keep one per cluster:
//     least-request then sees a cell's whole load. Not modelled: zone-aware
//     routing (no local cluster), slow start (refused), weighted priority
//     health, and multiple worker threads (below).
//   - Retries: on connect failure, reset, the route's retriable statuses
//     (5xx, gateway-error, retriable-status-codes) and per-try timeout
//     (refused-stream is an HTTP/2 event; upstreams are spoken to in
//     HTTP/1.1, where it does not occur), at
//     most num_retries, each to an endpoint not yet tried when the route
//     has the previous_hosts predicate, after Envoy's jittered back-off
//     (25 ms base unless configured), and only while the cluster's
//     concurrent retries stay below max(budget % of its active requests,
//     min_retry_concurrency) (or max_retries without a budget). A response
//     whose first byte reached the client is never retried; when it breaks
//     later, the client's connection is aborted so it sees a truncated
//     response. A client that leaves is nobody's failure: its attempt is
//     neither retried nor held against the endpoint.
//   - Passive outlier ejection on consecutive_5xx (5xx responses, connect
//     failures, resets and timeouts count, as in Envoy without
//     split_external_local_origin_errors): ejected for base_ejection_time ×
//     the ejection count (decaying by one per interval spent healthy),
//     capped by max_ejection_time, never more than max_ejection_percent of
//     the cluster (at least one host), re-admitted when the time is up.
//     Success-rate and failure-percentage detection are not implemented.
//   - Streaming: response bodies are relayed chunk by chunk, each flushed as
//     it arrives; TTFT is the time from arrival to the first body byte.
//   - Forwarding: a request sent to an endpoint of another region carries
//     Config.HopHeader set to Config.Region and, with Config.HopKey, a fresh
//     proof (xdscontract.HopAuthHeader), so the next gateway serves it
//     locally; no cell is ever sent a proof. Responses carry xdscontract.EndpointHeader (cell id, or the remote
//     ingress address) and xdscontract.RegionHeader; a forwarded response's own
//     xdscontract.EndpointHeader is passed on as xdscontract.UpstreamEndpointHeader.
//   - Reports: a DataPlane.Report stream to the controller, one report per
//     Config.ReportInterval with per-endpoint deltas (requests; errors =
//     connect failures, resets, timeouts and 5xx; rejected = 4xx) and the
//     client-originated demand per model (requests without a proven hop
//     header that matched a route) with the share refused with 429, and
//     its slices by (criticality, residency set), at most 64 per model,
//     adding up to the model's demand; never tenants. Deltas that
//     could not be sent roll into the next report; Stop sends a final one.
//   - Metrics (isobar_gateway_*) on the injected registry, per-endpoint
//     series dropped when the endpoint leaves the configuration.
//   - The pick for another data plane (Gateway.Pick, pick.go): a request's
//     facts routed and picked as the proxy does, held as a Pick whose
//     methods record the response, first byte and end. The ext_proc
//     Endpoint Picker (gateway/extproc, `isobar picker`) runs on it.
//
// # Concurrency
//
// A Gateway owns, between Start and Stop: three subscription goroutines
// (xdsclient.Subscription, each the only reader of its stream), one
// reporter goroutine, the HTTP server's Serve goroutine and its handler
// goroutines. A request waiting in the flow-control queue blocks its own
// handler goroutine on a 1-buffered channel written once by whichever
// goroutine takes it out of the queue (flowQueue.mu guards the queue;
// picks made under it take cluster mutexes inside it, never the reverse).
// Subscriptions apply
// updates under one mutex that rebuilds the table and publishes it through
// an atomic pointer; handlers read the table without locks and share
// atomics (in-flight, pending-token, active and retry counts, ejection
// deadlines), a short per-host mutex for outlier bookkeeping and one mutex
// per cluster around its load balancer. That load balancer is one Envoy
// worker's state (schedules, round-robin indexes, locality schedule, one
// seed drawn from Deps.Rand when the cluster or its LB settings appear),
// kept across table rebuilds by cluster name and shared by every handler
// goroutine under the mutex, so the gateway picks as an Envoy run with
// --concurrency 1; the in-flight counts it reads are the real ones, taken
// after the pick as Envoy's rq_active is. Stop is idempotent and
// blocking: it shuts the HTTP server down gracefully (in-flight requests
// get Config.DrainTimeout, then their connections are closed), sends the
// final report (bounded by one report interval), cancels the streams and
// waits for every goroutine. A Pick is used from one goroutine (gateway/
// extproc's stream goroutine) and shares the host and cluster atomics with
// the handlers.
//
// # Contracts
//
//   - Tables are immutable; a Table handed out stays valid and unchanged.
//   - Timers (route timeouts, retry back-off, ejection times, reports,
//     reconnects) run on Deps.Clock; connect timeouts are real time.
//   - What the gateway does not honour is refused at the xDS level rather
//     than silently ignored, except the listener-level fault filter config
//     (LDS is not read: per-route and per-virtual-host faults apply) and
//     unknown retry host predicates and retry_on tokens (ignored, as
//     Envoy's unknown retry_on tokens are), and a load-balancing policy the
//     gateway does not know (ROUND_ROBIN instead, warned and counted).
//   - Picks, and the seeds of the load balancers' schedules, draw their
//     random values from Deps.Rand (safe for concurrent use); tests inject
//     a seeded source and replay Envoy's sequence. The other draws use
//     math/rand/v2's global generator and so are not replayed: the route's
//     fault-abort shed (handleGenerate and Gateway.Pick)
//     and the outlier detector's enforcing percentage (hosts.go).
package gateway
