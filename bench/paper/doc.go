// Package paper runs the published evaluation of multi-site LLM routing —
// calibration, SLO throughput, hardware-telemetry lead time, failover,
// burst, capability mismatch, telemetry-exporter failure and network-aware
// placement, and issue 25's overload priority and retry storm — for stock
// Envoy round-robin and least-request, isobar and
// an oracle, on the same requests, on several grounds at several seeds,
// and writes the report (JSON, Markdown, PNG charts).
//
// # What runs
//
// The flat topology of the published evaluation: one ingress in front of 9
// cells in 3 sites at 2, 12 and 20 ms one way, in virtual time, so a
// bisection over load levels that would take hours of wall time takes
// seconds:
//
//   - each cell is the simulator's continuous-batching engine (sim.Batcher
//     with the ground's profile: the physics engine, sim.PhysicsProfile,
//     or the frozen sim.Profile70BFlat) and its GPU model (sim.GPU on a
//     fake clock: utilisation, DRAM activity, temperature, throttle bits,
//     thermal and PCIe faults with the hardware signals leading the
//     slowdown);
//   - the baselines pick through gateway/lb, which reproduces Envoy's
//     ROUND_ROBIN and LEAST_REQUEST pick for pick (round_robin_lb.h,
//     least_request_lb.cc, edf_scheduler.h), on DataPlane.Workers worker
//     threads that keep their own round-robin index and EDF schedule and
//     share the requests in flight; they get active health checks and the
//     same retries, retry budget and outlier detection as isobar's cluster
//     (rr-plain, in the failover stage, has health checks only);
//   - the isobar policies run isobar's own control code every heartbeat:
//     the cellagent's signal window, the regional controller's mapping
//     (regional/cycle: score and projection cell, the error rate the worse
//     of the engine's and the data plane's) and regional/projection for
//     the weights; the ingress picks as isobar's
//     gateway does (gateway/placement: least expected TTFT), or, for
//     isobar-envoy, as stock Envoy's LEAST_REQUEST does with those weights;
//   - the oracle sends each request where its predicted TTFT, from the true
//     state of every engine and of the network, is lowest: the limit every
//     policy is reported against.
//
// Issue 25's stages (overload that protects what matters):
//
//   - overload_priority runs baseline_mixed at 150 % of the fleet's
//     measured capacity (the oracle's sustainable baseline_mixed rate at
//     the seed, slo_throughput's figure, bisected here when that stage
//     did not run), each request's criticality (20 % critical, 50 %
//     standard, 30 % sheddable) and tenant (a loud one sending 5× the
//     quiet one) drawn from a source keyed by (seed, request) of its own.
//     The isobar policies sit behind isobar gateway's per-endpoint
//     in-flight cap: an arrival whose every eligible endpoint is at it is
//     saturated. isobar-nocrit is the gateway before issue 25: the
//     configured cap (DataPlane.MaxInflightPerEndpoint, the gateway's 64)
//     on every endpoint, 429 when saturated. isobar caps each endpoint at
//     flowcontrol.EndpointCap of its max_num_seqs, the round trip the
//     controller pushed and the slot hold the ingress measures (at most
//     the configured cap), and queues a saturated arrival in the
//     gateway's own flow-control queue (gateway/flowcontrol with its
//     defaults: the most important band first, round-robin between
//     tenants, standard and sheddable newest first and aged out at the
//     1.5 s TTFT objective, displacement from the heaviest tenant, and a
//     less important class yielding free slots while a more important one
//     is short), dispatched as slots free, 429 when evicted or expired.
//     rr and lr are stock Envoy with no cap. The same demand at 75 % of
//     capacity gives the quiet tenant's no-overload figure.
//   - retry_storm runs baseline_mixed at 90 % of that capacity; from the
//     end of the warm-up the nearest site's engines answer 503 (a
//     retriable status, an external error for consecutive-5xx outlier
//     detection) to 30 % of the requests, drawn per (request, attempt).
//     rr, lr and isobar-static-budget keep the static retry budget; isobar
//     runs the one the regional controller publishes, regional/xds
//     RetryBudgetAt at the region's utilisation: its demand (requests at
//     the ingress over the last signal window) over the measured
//     capacity, on its default curve (knee 100/(100+max), minimum at full
//     utilisation: regional/xds retrybudget.go says why).
//
// # Same draws, several seeds
//
// Request i's random draws (arrival gap, class, lengths, frontend latency,
// Envoy worker, network delay and jitter, load-balancer choices, and in
// issue 25's stages its criticality, tenant and brownout draws) come from
// sources keyed by (seed, i), and the health checks, RTT probes and
// control-loop phases have streams of their own, so every policy sees the
// same draws whatever it consumes. Every stage and policy runs at each
// seed; the report gives the median and min–max, and claims a win only
// when every seed agrees.
//
// The fixed parameters (DataPlane) are documented and the same for every
// policy. What the simulation cannot show — real sockets, real xDS, real
// processes — the live lab's chaos drills (package chaos) measure.
//
// # Concurrency
//
// Run starts one job per (ground, seed), at most Options.Parallel at once
// (errgroup). A job is one goroutine owning its runner, its fleets' event
// queues, engines, scorer and load balancers; jobs share nothing but their
// read-only Config, and Run aggregates their figures after all have
// ended. No real clock drives any decision; wall time is read only for
// the routing-update cost figure and progress lines.
package paper
