// Package adminapi is the contract of a fleet's admin API: the paths, the
// fault kinds an operator may inject and heal, and the wire types of the
// fleet's observed state (with the residency pins and the engines'
// per-tenant request counters a residency drill compares).
//
// A fleet that can be drilled (the lab, package lab) serves this API; the
// drill runner (package chaos) calls it. Both import this package and
// neither imports the other, so the arrows run chaos → lab's contract and
// lab → its contract, never lab → chaos.
//
// Concurrency: the package holds no state. Its values are plain data; a
// FleetState is not safe for concurrent mutation, like any struct.
package adminapi
