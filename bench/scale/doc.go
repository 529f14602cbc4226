// Package scale owns `isobar bench scale`: the control plane's cost as the
// fleet grows, for a hierarchical topology (cells split over R regional
// controllers, each publishing a compact summary to the global) and for a
// flat one (one controller that ingests every cell's heartbeats, as if
// there were no hierarchy).
//
// Each point (cells, regions, topology) runs, in this process, the real
// regional controllers (regional.Controller: heartbeat service, registry,
// scoring, projection, xDS server, summary builder) and the synthetic cells
// of package bench, each a real CellRegistry.Heartbeat gRPC stream over its
// own TCP connection on 127.0.0.1, plaintext. A point measures:
//
//   - heartbeat ingest: heartbeats the controllers accepted per second over
//     the window (isobar_regional_heartbeats_total);
//   - CPU: process CPU seconds (getrusage, user+system) per second of the
//     window per 1,000 cells; the synthetic cells' senders run in the same
//     process and are included;
//   - cycle cost: the scoring, projection and xDS build+push of one
//     controller's cells, P50/P99 over repeated cycles run with the real
//     regional/cycle (the registry's mapping and state build),
//     regional/score, regional/projection and regional/xds code on the
//     cells the live registry holds, every cell's load changed each cycle
//     so every weight moves and a full push happens (the worst case, as in
//     regional's BenchmarkCycle); beside it the live controllers' own
//     projection and xDS-build histograms give the mean of what they did;
//   - summary bytes: proto.Size of the summaries the real controllers built
//     (captured through their gossip hook), and the global's inbound
//     bytes/s: their sum over regions times the publish rate; for the flat
//     topology the single controller's inbound, the heartbeats' marshalled
//     bytes per second sent over the window;
//   - optimiser solve time: optimize.Solve on an instance of the
//     region count generated as the optimiser's own benchmarks do;
//   - cell death to weight removed: a cell's TCP connection is closed under
//     its stream (as when its agent is SIGKILLed) and the time until an xDS
//     client subscribed to EDS on its controller (go-control-plane's ADS
//     client, through xdsclient.Watcher) receives an assignment without it.
//
// Points beyond what the machine allows (file descriptors: both ends of
// every loopback stream live in this process) or beyond Config.MaxCells are
// skipped with the reason written in the report, never dropped silently.
//
// Concurrency model: Run is the composition root and runs one point at a
// time; runPoint owns everything the point starts (controllers, one
// goroutine per cell, the probe sink, the xDS watcher) and joins it all
// before it returns, also on cancellation. The cells' goroutines own their
// streams; the harness only signals them (Kill, Revive). Controllers'
// figures are read through their metrics, their published views and the
// summaries their gossip hook captured (under its own mutex). Time comes
// from Deps.Clock (the real clock by default); measurements are wall time.
package scale
