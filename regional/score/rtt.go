package score

import "time"

// RTTEstimate is the RTT and jitter signals' estimator: an EWMA of probe
// RTT samples and of |ΔRTT| between consecutive samples (jitter, as in RFC
// 3550 but with a faster gain so a jittery path shows within a few
// probes). The zero value is ready; not safe for concurrent use.
type RTTEstimate struct {
	// RTT and Jitter are the current estimates; N counts samples.
	RTT, Jitter time.Duration
	N           int
	last        time.Duration
}

// RTTGain is the EWMA gain of both estimates.
const RTTGain = 0.25

// Add folds one RTT sample into the estimates.
func (e *RTTEstimate) Add(sample time.Duration) {
	if e.N == 0 {
		e.RTT, e.last, e.N = sample, sample, 1
		return
	}
	d := sample - e.last
	if d < 0 {
		d = -d
	}
	e.RTT += time.Duration(RTTGain * float64(sample-e.RTT))
	e.Jitter += time.Duration(RTTGain * float64(d-e.Jitter))
	e.last = sample
	e.N++
}
