package score

import "time"

// Reading is one cell's signals as its sources delivered them, with each
// source's health: what the regional controller holds from a heartbeat and
// its own probe, and what bench/paper's simulated fleet measures. InputFrom
// turns it into the scorer's Input, so the rules below are applied once for
// both.
type Reading struct {
	// AppOK: the engine's metrics (vLLM) were read; the application values
	// count only then.
	AppOK bool

	QueueDepth, Running, TTFTP95, ErrorRate, KVCache Value

	// HardwareOK: the GPU telemetry (DCGM) was read; the hardware values,
	// the throttle reasons included, count only then.
	HardwareOK bool

	GPUUtil, VRAM, SMActive, DRAMActive, TemperatureC Value
	ThrottleReasons                                   uint64
	ThrottleOK                                        bool

	// RTT and Jitter: the controller's probe of the cell; RTTOK when it
	// has measured them (both or neither).
	RTT, Jitter time.Duration
	RTTOK       bool

	// DataPlaneErrorRate: the error rate the data plane saw for the cell
	// over its window, when it reported one.
	DataPlaneErrorRate Value
}

// InputFrom maps a reading to the scorer's input. A source that is down
// contributes nothing (the scorer renormalises over what remains); RTT and
// jitter are present together; the error rate is the higher of the
// engine's and the data plane's, the data plane's alone when the engine
// has none (it sees connection failures the engine never counts).
func InputFrom(r Reading) Input {
	var in Input
	if r.AppOK {
		in.QueueDepth, in.Running, in.TTFTP95, in.ErrorRate, in.KVCache = r.QueueDepth, r.Running, r.TTFTP95, r.ErrorRate, r.KVCache
	}
	if r.HardwareOK {
		in.GPUUtil, in.VRAM, in.SMActive, in.DRAMActive, in.TemperatureC = r.GPUUtil, r.VRAM, r.SMActive, r.DRAMActive, r.TemperatureC
		in.ThrottleReasons, in.ThrottleOK = r.ThrottleReasons, r.ThrottleOK
	}
	in.RTT, in.Jitter, in.RTTOK, in.JitterOK = r.RTT, r.Jitter, r.RTTOK, r.RTTOK
	if dp := r.DataPlaneErrorRate; dp.OK && (!in.ErrorRate.OK || dp.V > in.ErrorRate.V) {
		in.ErrorRate = dp
	}
	return in
}
