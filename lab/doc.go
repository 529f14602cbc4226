// Package lab runs isobar's embedded default: a simulated fleet in one
// process, with real components talking over loopback — simulated vLLM
// engines with a fake dcgm-exporter, a cellagent per cell streaming
// heartbeats over gRPC, a regional controller serving xDS, and a traffic
// driver that routes by the weights it receives over ADS — plus a live
// terminal view and a JSON report.
//
// Today the lab is one region; the multi-region mesh (global HA pair,
// gateways, emulated WAN) extends it.
//
// Concurrency: Run owns every component and stops them all, in reverse
// order, before it returns. The traffic driver runs one goroutine per
// in-flight request, bounded by Config.MaxInFlight; its statistics are
// guarded by a mutex and read by the view once per second.
package lab
