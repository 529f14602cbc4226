// Package bench owns isobar's evaluation and soak harnesses: programs that
// start real control-plane components in one process, drive them, measure
// them and judge the measurements against stated bounds.
//
// The soak harness (RunSoak, behind `isobar bench soak`) runs the control
// plane for a long time under churn and checks that it does not degrade:
// an embedded etcd, the global HA pair, R regional controllers (the real
// regional.Controller) and N synthetic cells, each a real gRPC
// CellRegistry.Heartbeat stream to its region's controller, that die
// abruptly and return on a schedule. It samples process RSS, goroutines,
// heap, open heartbeat streams, cell states and the plan each region
// applied, then checks that memory and goroutines stay flat, that no stream
// leaks and that no plan epoch is lost. Everything runs on loopback without
// TLS.
//
// Concurrency model: RunSoak is the composition root and owner of every
// goroutine it starts; each has a context and a join, and RunSoak returns
// only after all of them have exited. One goroutine per synthetic cell
// owns that cell's stream (a second goroutine per stream reads acks); the
// churner owns the choice of victims and only signals cells through their
// one-slot kill channel; the plan watcher owns the per-region plan
// history; the sampler (RunSoak's own goroutine) reads everything else
// through atomics, the controllers' published views and their metrics.
// Time is injected (clockwork.Clock); the real clock is the default.
package bench
