// Package lab runs isobar's embedded default: a whole simulated fleet in
// one process, every component real and talking over loopback.
//
// By default: an embedded etcd, the global HA pair, 3 regions × 3 cells;
// per cell a simulated vLLM engine, its GPU on the region's fake
// dcgm-exporter and a cellagent; per region a regional controller, a
// gateway (the region's ingress) and a gossip member; emulated WAN paths
// (lab/wan) with delay and jitter between regions, for forwarded requests,
// for regional ↔ global traffic and for gossip; mTLS on every gRPC link and
// on etcd, from a development CA generated for the run; a steady mixed load
// from clients local to each region; a live terminal view and a JSON report.
// The live view reads the controllers in process, not over their debug
// APIs; its routes line is statusview's summary, as `isobar status` prints
// it.
// With one region the lab runs without etcd and the global pair.
//
// Concurrency: Start builds everything and returns a *Lab; Stop tears it
// down in reverse order and joins every goroutine. The traffic drivers run
// one goroutine per in-flight request, bounded per region; their statistics
// are guarded by a mutex and read by the view and the report.
package lab
