package regional

import (
	"math"
	"time"
)

// demandSmoother turns the measured ingress demand (requests/s per model,
// each a rate over the last data-plane window) into the demand the region
// reports for planning: an exponentially weighted mean with time constant
// tau, robust to Poisson noise and to bursts.
//
// Each new sample is first clipped to an upper bound above the current
// estimate, est + z·√(est/window) + floor: z standard deviations of a
// Poisson rate measured over the window, so one noisy or bursty sample
// moves the estimate by at most a fraction of that bound. A rise that
// holds above the bound for a whole window (successive samples of one
// window overlap, so fewer would still be one noisy window) is real: the
// sample is taken unclipped and followed with the time constant
// tau/riseSpeedup, so an overload is planned for within about a window
// and a few seconds, not minutes. Falls are
// not clipped: less demand never causes a shed. A model that stops
// appearing decays toward 0 and is dropped below minDemand.
//
// Owned by the syncer's summaries goroutine; not safe for concurrent use.
type demandSmoother struct {
	tau    time.Duration
	window time.Duration
	z      float64
	floor  float64
	est    map[string]float64
	above  map[string]time.Time // since when the samples are above the bound
	last   time.Time
}

// riseSpeedup: a real rise is followed this many times faster than tau.
const riseSpeedup = 10

// minDemand is the estimate below which a model's demand is dropped.
const minDemand = 1e-3

func newDemandSmoother(tau, window time.Duration) *demandSmoother {
	return &demandSmoother{tau: tau, window: window, z: 3, floor: 0.5, est: map[string]float64{}, above: map[string]time.Time{}}
}

// update folds the samples measured at now into the estimates and returns
// a copy of them. A model seen for the first time starts at its sample.
// With tau 0 the samples pass through unchanged.
func (d *demandSmoother) update(now time.Time, raw map[string]float64) map[string]float64 {
	if d.tau <= 0 {
		return raw
	}
	dt := now.Sub(d.last)
	if d.last.IsZero() || dt < 0 {
		dt = 0
	}
	d.last = now
	alpha := 1 - math.Exp(-dt.Seconds()/d.tau.Seconds())
	fast := 1 - math.Exp(-dt.Seconds()*riseSpeedup/d.tau.Seconds())
	w := max(d.window.Seconds(), 1)
	for m, v := range raw {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			continue // validated downstream too; never folded in
		}
		e, ok := d.est[m]
		if !ok {
			d.est[m] = v
			continue
		}
		upper := e + d.z*math.Sqrt(e/w) + d.floor
		if v <= upper {
			delete(d.above, m)
			d.est[m] = e + alpha*(v-e)
			continue
		}
		since, ok := d.above[m]
		if !ok {
			since = now
			d.above[m] = now
		}
		if now.Sub(since) >= d.window {
			d.est[m] = e + fast*(v-e) // a sustained rise: follow it
		} else {
			d.est[m] = e + alpha*(upper-e)
		}
	}
	for m, e := range d.est {
		if _, ok := raw[m]; !ok {
			e -= alpha * e
			if e < minDemand {
				delete(d.est, m)
				delete(d.above, m)
				continue
			}
			d.est[m] = e
		}
	}
	if len(d.est) == 0 {
		return nil
	}
	out := make(map[string]float64, len(d.est))
	for m, e := range d.est {
		out[m] = e
	}
	return out
}
