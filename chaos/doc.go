// Package chaos runs correlated-site failure drills against an isobar
// fleet and reports what users saw.
//
// It owns the drill registry (Drills), the mTLS client (Client) of the
// admin API a drillable fleet serves (the contract lives in package
// adminapi; the lab serves it with --admin-listen), the load a drill drives
// (Load, whose requests are package completion's) and the report with its
// thresholds (Report, Thresholds).
//
// A drill checks the fleet is healthy, drives load through every region's
// ingress, injects one fault at a recorded instant, polls the fleet's state
// until the controllers show the fault (detect) and the data planes route
// around it (reroute), heals, waits for health, and measures success
// before, during and after. A drill whose faults the target cannot inject
// is refused before anything runs (ErrUnavailable). A staged drill (the
// residency drill, residency.go) runs several such injections in turn,
// each healed and the fleet healthy before the next; the residency drill
// also reads the engines' per-tenant request counters from the fleet's
// state around each stage and fails when a pinned tenant's request
// reached an engine outside its regions.
//
// Concurrency: a Runner runs one drill at a time from the calling
// goroutine; its Load runs one goroutine per request in flight, bounded,
// and Stop joins them all. Nothing here holds global state.
package chaos
