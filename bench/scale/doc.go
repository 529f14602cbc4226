// Package scale owns `isobar bench scale`: the control plane's cost as the
// fleet grows, for a hierarchical topology (cells split over R regional
// controllers, each publishing a compact summary to the global) and for a
// flat one (one controller that ingests every cell's heartbeats, as if
// there were no hierarchy).
//
// Each point (cells, regions, topology) runs, in this process, the real
// regional controllers (regional.Controller: heartbeat service, registry,
// scoring, projection, xDS server, summary loop), and the synthetic cells
// of package bench, each a real CellRegistry.Heartbeat gRPC stream over
// its own TCP connection on 127.0.0.1, plaintext. The cells run in child
// processes when Deps.CellProcess is set (`isobar bench scale cells`:
// ServeCells, Config.CellProcs of them, the cells dealt round-robin), else
// in this process beside the controllers. Each child raises its descriptor
// limit to its hard limit and says so in its hello; the parent controls it
// with JSON lines over its stdin and stdout (start cells against given
// controllers, kill or silence a cell, is it up, sent totals and CPU) and
// reaps it when the point ends, also on error and cancellation; a child
// whose stdin ends (its parent gone) stops its cells and exits. A point
// measures:
//
//   - heartbeat ingest: heartbeats the controllers accepted per second over
//     the window (isobar_regional_heartbeats_total), beside the offered
//     (cells / interval) and what the cells sent;
//   - CPU: this process's CPU seconds (getrusage, user+system) per second
//     of the window, per 1,000 cells: the controllers' (and the harness's
//     xDS client), the senders' too when they run here; the cell
//     processes' own CPU apart (each child's getrusage). The controllers'
//     RTT probes of a cell connect to a sink in the process that runs it
//     (its hello names the sink), so a probe's accept, the cell's side,
//     is counted with the cells; with the cells here, one sink here
//     answers them all;
//   - footprint: what the cells added to this process's RSS and goroutines
//     (per 1,000 cells, per cell) since just before they started;
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
//     client, through xdsclient.Watcher) receives an assignment without it,
//     broken down at the wire by gRPC stats handlers on region 0's
//     controller and on the client (wire.go): kill → the controller wrote
//     the ADS response (sent) → the client read it (received) → decoded and
//     applied; apart, a silent cell (stream open, no more heartbeats: a
//     hung agent), removed by the TTL.
//
// Points beyond what the machine allows (file descriptors, in this process
// or in a cell process, which reports its limit) or beyond Config.MaxCells
// are skipped with the reason written in the report, never dropped
// silently and never left to hang.
//
// Concurrency model: Run is the composition root and runs one point at a
// time; runPoint owns everything the point starts (cell processes,
// controllers, one goroutine per cell when they run here, the probe sink,
// the xDS watcher) and joins it all before it returns, also on
// cancellation: each child is stopped (stdin closed, killed after a bound)
// and reaped. The cells' goroutines own their streams; the harness only
// signals them (Kill, Silence, Revive), directly or through the child's
// control pipe, whose calls are serialised per child; each child's reader
// goroutine owns its stdout and reaps it. Controllers'
// figures are read through their metrics, their published views and the
// summaries their gossip hook captured (under its own mutex). Time comes
// from Deps.Clock (the real clock by default); measurements are wall time.
package scale
