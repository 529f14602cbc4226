// Package lab runs isobar's embedded default: a whole simulated fleet in
// one process, every component real and talking over loopback.
//
// By default: an embedded etcd, the global HA pair, 3 regions × 3 cells;
// per cell a simulated vLLM engine, its GPU on the region's fake
// dcgm-exporter and a cellagent; per region a regional controller, a
// gateway (the region's ingress) and a gossip member; emulated WAN paths
// (lab/wan) with delay and jitter between regions, for forwarded requests,
// for regional ↔ global traffic and for gossip; mTLS on every gRPC link and
// on etcd, from a development CA generated for the run; load from clients
// local to each region; a live terminal view and a JSON report.
//
// The load (Config.Workload) is steady by default: Poisson arrivals of
// single streaming completions of mixed sizes, each prompt distinct random
// words drawn from the request's own seeded source (so prompts share no
// prefix by accident and a seed replays the same text). The multiturn
// workload keeps Config.Sessions chat conversations open per region, each
// of up to Config.Turns turns whose requests carry the whole history (user
// messages and the assistant's streamed replies), so each turn's prompt
// extends the previous one's and the engines' prefix caches can reuse it.
// The report adds, per region and in total, the engines' prefix-cache
// queries, hits and hit rate, read from every engine's /metrics when it is
// made; the live view shows each cell's windowed hit rate as its
// cellagent reports it.
// The live view reads the controllers in process, not over their debug
// APIs; its routes line is statusview's summary, as `isobar status` prints
// it.
// With one region the lab runs without etcd and the global pair.
// Config.CriticalityMix and Config.Tenants give each client request a
// criticality and a tenant, drawn from the seed on a stream of their own
// and sent in xdscontract.CriticalityHeader and TenantHeader; the report
// splits the figures by both. Config.Residency (a residency config,
// validated against the lab's regions at Start) goes to every region's
// controller and gateway; the admin API lists its pinned tenants and each
// region's engines' per-tenant request counters (sim.Engine.TenantRequests).
//
// Concurrency: Start builds everything and returns a *Lab; Stop tears it
// down in reverse order and joins every goroutine. A Lab composes parts
// that each own their mutex: the fleet (the handles of the running
// components, which heals replace), the fault injector (one fault at a
// time), the WAN router (routes and paths of the emulated WAN), the plan
// recorder (routings seen, for the report) and the shutdown stack. The
// admin API's contract is package adminapi; the clients' requests go
// through package completion. The steady traffic
// drivers run one goroutine per in-flight request, bounded per region
// (MaxInFlight); the multiturn ones one goroutine per session slot, each
// with at most one request in flight. Their statistics are guarded by a
// mutex and read by the view and the report.
package lab
