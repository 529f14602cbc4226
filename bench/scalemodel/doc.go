// Package scalemodel is a virtual-time model of isobar's control plane for
// fleet sizes no one machine here can hold (issue 26 item 5: 100,000 cells
// over 100 and 1,000 regions).
//
// It owns three things:
//
//   - Fit: per-operation costs fitted, by rules written on each constant
//     (fit.go), from the points `isobar bench scale` measured (its
//     scale.json, read with bench/scale's Report): CPU per heartbeat,
//     per-controller and per-process CPU, the full-push and live cycle
//     costs as functions of the cells per controller, their spread, the
//     summary and heartbeat bytes and the optimiser's solve time as a
//     function of regions.
//   - Calibrated: those constants, frozen from one named run
//     (calibrated.go), so the model's extrapolation does not move when a
//     later, noisier run is made; TestCalibratedMatchesFixture refits them
//     from the trimmed run in testdata and checks they agree.
//   - Run: a discrete-event simulation in virtual time, deterministic by
//     seed, of the controllers' CPU (C cores, processor sharing): every
//     cell's heartbeat at a seeded phase each interval, each controller's
//     cycle every cycle interval and its pushes, a full-push cycle timed
//     back to back on the busiest controller (as bench scale times it),
//     summary publishes into the global, and the solve time of the region
//     count. Validate puts its figures beside a measured point.
//
// What it leaves out (docs/issue26-model.md): garbage collection pauses
// and the Go scheduler's unfairness (only folded into the fitted spread of
// cycle times), memory and its bandwidth, the NIC and the kernel's network
// stack beyond what the measured per-heartbeat CPU already holds, the
// global's own CPU for intake, and senders' clocks drifting into bursts.
//
// Concurrency: none. Every function is pure and single-goroutine; a Run
// owns its simulator state and returns values.
package scalemodel
