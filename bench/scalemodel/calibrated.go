package scalemodel

// CalibratedSource names the runs Calibrated was fitted on.
const CalibratedSource = "frozen 2026-12-05 from bench/scalemodel/testdata/scale.json: the 19 measured points (10–1,000 cells; 1, 10, 100 regions and flat; 18 used, one accepted only 89 % of its heartbeats) " +
	"of two `isobar bench scale` runs on the 2-core AMD EPYC helper machine (go1.26.8, load average 6–8 from other work), " +
	"started 2026-12-05T11:19:40Z and 11:24:04Z, cells in child processes, heartbeat 500 ms, cycle 100 ms, summary 1 s"

// CalibratedNearestRTT is the peers' RTTs the calibration runs' summaries
// carried (0: every peer; they predate issue 26 item 4).
const CalibratedNearestRTT = 0

// Calibrated is the model's constants, fitted by Fit on the runs
// CalibratedSource names and frozen: a later run does not move them, and
// TestCalibratedMatchesFixture checks they are what the rules give on that
// fixture. Values rounded to 6 significant digits.
func Calibrated() Params {
	return Params{
		HeartbeatCPUUs:          274.936,                             // µs per heartbeat at 1,000 hb/s, cycles' per-cell share folded in
		HeartbeatCPUExp:         0.8,                                 // ingest CPU ∝ rate^0.8 (least residual on the grid; 0.7–1.0 within 3 %)
		ControllerCPUMsPerS:     1.45396,                             // ms/s per controller
		ProcessCPUMsPerS:        14.9194,                             // ms/s, the measuring process
		FullCycle:               Linear{A: 0.0156293, B: 0.00197488}, // ms, linear won over n·log₂n
		CycleSpread:             1.34246,                             // σ: P99/P50 ≈ 22.7×
		LiveCycle:               Linear{A: 0.039175, B: 0.0108823},
		LiveBuild:               Linear{A: 0.204421, B: 0.00299013},
		PushesPerControllerPerS: 0.999128,
		HeartbeatBytes:          244.822,
		SummaryBaseBytes:        265.684,
		SummaryPerRTTBytes:      16.9893,
		Solve:                   Power{C: 0.00182089, P: 1.46332},
	}
}
