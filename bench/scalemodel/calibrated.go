package scalemodel

// CalibratedSource names the runs Calibrated was fitted on.
const CalibratedSource = "frozen 2026-12-06 20:40Z from bench/scalemodel/testdata/xeon-scale.json: the 30 measured points (10–10,000 cells; 1, 10, 100 regions and flat; all 30 used, none saturated the machine) " +
	"of two `isobar bench scale` runs on a 2-core Intel Xeon at 2.1 GHz (go1.26.8, nothing else running), " +
	"started 2026-12-06T20:21:57Z and 20:29:13Z, cells in child processes, delta xDS, summaries of the nearest 8, heartbeat 500 ms, cycle 100 ms, summary 1 s, windows of 20 s"

// CalibratedNearestRTT is the peers' RTTs the calibration runs' summaries
// carried (their 8 nearest: issue 26 item 4).
const CalibratedNearestRTT = 8

// Calibrated is the model's constants, fitted by Fit on the runs
// CalibratedSource names and frozen: a later run does not move them, and
// TestCalibratedMatchesFixture checks they are what the rules give on that
// fixture. Values rounded to 6 significant digits.
//
// They were refitted when the code they model changed: the constants
// frozen at 08:22–08:43Z the same day (testdata/xeon-scale-0822.json) came
// from a controller that pushed once a second where today's pushes on
// change (0.05 a second), and whose cycle evaluated every cell. Before
// those (2026-12-05), two runs of 10 to 1,000 cells on a 2-core AMD EPYC
// under a load average of 6–8 (testdata/amd-scale.json); its 10,000-cell
// points all saturated that machine (testdata/amd-scale10k.json), so
// nothing at 10,000 cells could be fitted or checked there.
// docs/scale-model.md keeps all three.
func Calibrated() Params {
	return Params{
		HeartbeatCPUUs:          62.1859,                                           // µs per heartbeat at 1,000 hb/s, cycles' per-cell share folded in
		HeartbeatCPUExp:         0.85,                                              // ingest CPU ∝ rate^0.85 (least residual on the grid)
		ControllerCPUMsPerS:     0.630573,                                          // ms/s per controller
		ProcessCPUMsPerS:        10.762,                                            // ms/s, the measuring process
		FullCycle:               Linear{A: 0.029899, B: 0.000227414, NLogN: true},  // ms, wall time; n·log₂n won over linear
		FullCycleCPU:            Linear{A: 0.0310495, B: 0.000194119, NLogN: true}, // ms, CPU time (the cost); n·log₂n won over linear
		CycleSpread:             0.497147,                                          // σ of the CPU times: P99/P50 ≈ 3.2×
		LiveCycle:               Linear{A: 0.00844117, B: 0.00109632},              // ms, linear won
		LiveBuild:               Linear{A: 0.170082, B: 8.09877e-05, NLogN: true},
		PushesPerControllerPerS: 0.0499964,
		HeartbeatBytes:          245.354,
		SummaryBaseBytes:        361.625,
		SummaryPerRTTBytes:      16.8498,
		Solve:                   Power{C: 0.00116677, P: 1.66155},
	}
}
