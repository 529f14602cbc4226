package regional

import (
	"slices"
	"strings"
	"time"
)

// Round trips for the data plane's least-expected-TTFT pick (the gateway's
// --lb isobar), which adds a host's RTT and jitter to its expected time to
// first token. What matters to it is distance: a remote region's ingress
// tens of milliseconds away against the local cells. The local cells share
// one network and their probed RTTs differ by less than the probes' own
// noise (a TCP connect timed by a busy process), so the local locality
// carries the median of its cells' round trips and jitters, and only a
// cell whose round trip stands apart from it (another zone, a slow link)
// carries its own: noise would otherwise look like a lasting preference,
// the pick trading about a millisecond of it for a request in flight.

// placementRepush is the least time between two states offered only
// because a round trip drifted (placementDrift): the pick follows the
// path, not every probe.
const placementRepush = 5 * time.Second

// rttTolerance is the least round-trip change worth a push, and the least
// distance from its locality at which a cell's round trip stands apart.
const rttTolerance = time.Millisecond

// placeSent is a round trip and its jitter as offered (0: unknown).
type placeSent struct{ rtt, jitter time.Duration }

// Keys of Registry.sentPlace besides cell ids (which never hold '/'): the
// local locality, and a remote region's locality.
const localPlaceKey = "locality/local"

func remotePlaceKey(region string) string { return "region/" + region }

// localPlacement returns the local locality's round trip, the medians of
// the probed RTTs and jitters of the cells in the load balancer (zero when
// none is probed), and the cells whose round trip stands apart from it.
func localPlacement(views []CellView) (loc placeSent, apart map[string]placeSent) {
	var rtts, jitters []time.Duration
	for i := range views {
		if v := &views[i]; v.Weight.Published > 0 && v.RTTOK {
			rtts, jitters = append(rtts, v.RTT), append(jitters, v.Jitter)
		}
	}
	if len(rtts) == 0 {
		return placeSent{}, nil
	}
	loc = placeSent{median(rtts), median(jitters)}
	for i := range views {
		v := &views[i]
		if c := (placeSent{v.RTT, v.Jitter}); v.Weight.Published > 0 && v.RTTOK && standsApart(c, loc) {
			if apart == nil {
				apart = map[string]placeSent{}
			}
			apart[v.ID] = c
		}
	}
	return loc, apart
}

// median returns the middle of ds (the lower one of an even count),
// sorting ds.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[(len(ds)-1)/2]
}

// standsApart reports whether a cell's round trip differs from its
// locality's by more than rttTolerance and more than twice their jitters
// together: a difference the probes' noise does not explain.
func standsApart(c, loc placeSent) bool {
	return (c.rtt - loc.rtt).Abs() > max(rttTolerance, 2*(c.jitter+loc.jitter))
}

// placementDrift reports whether the round trips to offer moved materially
// (rttDrifted) from those last offered: the local locality's, a cell's that
// stands apart (or stopped or started to), a remote region's.
func (r *Registry) placementDrift(views []CellView, rtts map[string]time.Duration) bool {
	loc, apart := localPlacement(views)
	if got := r.sentPlace[localPlaceKey]; rttDrifted(got.rtt, loc.rtt) || rttDrifted(got.jitter, loc.jitter) {
		return true
	}
	for i := range views {
		v := &views[i]
		if v.Weight.Published == 0 {
			continue
		}
		want, got := apart[v.ID], r.sentPlace[v.ID]
		if rttDrifted(got.rtt, want.rtt) || rttDrifted(got.jitter, want.jitter) {
			return true
		}
	}
	for k, got := range r.sentPlace {
		if region, ok := strings.CutPrefix(k, remotePlaceKey("")); ok && rttDrifted(got.rtt, rtts[region]) {
			return true
		}
	}
	return false
}

// rttDrifted: b became known or unknown (0), or differs from a by more
// than rttTolerance and a tenth of a.
func rttDrifted(a, b time.Duration) bool {
	if (a > 0) != (b > 0) {
		return true
	}
	return (b - a).Abs() > max(rttTolerance, a/10)
}
