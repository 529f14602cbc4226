// Package paper runs the published evaluation of multi-site LLM routing —
// calibration, SLO throughput, hardware-telemetry lead time, failover,
// burst, capability mismatch, telemetry-exporter failure and network-aware
// placement — for round-robin, least-request and isobar on the same
// requests, and writes the report (JSON, Markdown, PNG charts).
//
// # What runs
//
// The flat topology of the published evaluation: one ingress in front of 9
// cells in 3 sites at 2, 12 and 20 ms one way. It runs in virtual time, so
// a bisection over load levels that would take hours of wall time takes
// seconds, and every policy sees exactly the same requests:
//
//   - each cell is the simulator's continuous-batching engine (sim.Batcher
//     with the frozen sim.Profile70B, the timing model the live lab's
//     engines run) and its GPU model (sim.GPU on a fake clock: utilisation,
//     DRAM activity, temperature, throttle bits, thermal and PCIe faults
//     with the hardware signals leading the slowdown);
//   - the isobar policies run isobar's own control code every heartbeat:
//     the cellagent's signal window, regional/score for the pressure and
//     regional/projection (hysteresis, rate limit, outlier penalties) for
//     the weights, and the ingress follows the cluster isobar pushes
//     (weighted least-request, retry on connect failure, ejection on one
//     local-origin failure);
//   - the baselines are Envoy's ROUND_ROBIN and LEAST_REQUEST with active
//     health checks, as deployed without a control plane.
//
// The fixed parameters (DataPlane) are documented and the same for every
// policy. What the simulation cannot show — real sockets, real xDS, real
// processes — the live lab's chaos drills (package chaos) measure; the
// report says which figures come from where.
//
// # Concurrency
//
// A run is one goroutine owning its event queue, engines and scorer; Run
// runs the trials of a stage one after another and shares nothing between
// them. No real clock drives any decision; wall time is read only for the
// routing-update cost figure.
package paper
