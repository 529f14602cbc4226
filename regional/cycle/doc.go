// Package cycle is the regional controller's per-cycle decision, as pure
// functions: the mapping from what the registry knows of each cell (its
// heartbeat's signals, the probe's round trip, the data plane's error
// window) to the scorer's input and projection.Cell (Map), the cell views
// the controller publishes (CellView, Scored, Weighted), the round trips
// the data plane's pick is given and when they drifted enough to push
// again (LocalPlacement, Drifted), and the xDS state built from the
// weighted views and the cross-region routes (BuildState; from each
// view's Slot, kept by a caller that remakes only the changed views'
// slots, BuildStateSlots), with each
// model's shed share per criticality, its pinned residency sets
// (pinned.go: only localities of the regions a set allows, whatever the
// routes say or whether there are any) and its retry budget.
//
// It owns the mapping and nothing else. The projection's hysteresis
// (projection.Projector) is state and stays with its caller, as do the
// registry's records, the last offered state and the metrics and logs:
// the registry's single-writer loop (package regional) calls these
// functions and does the writes itself from the values they return. The
// paper and scale benchmarks (bench/paper, bench/scale) call the same
// functions, so what they measure is the mapping production runs.
//
// Every function reads only its arguments and returns new values: no
// clock, no I/O, no logging, no metrics, no package state. The package
// holds no state, so its functions are safe for concurrent use on
// arguments that are not shared with a writer. Maps and slices in the
// results are new; the *isobarpb.Signals a CellView carries is shared
// with its caller and read only.
package cycle
