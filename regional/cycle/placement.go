package cycle

import (
	"strings"
	"time"
)

// Round trips for the data plane's least-expected-TTFT pick (the gateway's
// --lb isobar), which adds a host's RTT and jitter to its expected time to
// first token. What matters to it is distance: a remote region's ingress
// tens of milliseconds away against the local cells. The local cells share
// one network and their probed RTTs differ by less than the probes' own
// noise (a handshake through a busy host's kernel and, off Linux, the
// prober's own scheduling), so the local locality carries the median of
// its cells' round trips and jitters, and only a cell whose round trip
// stands apart from it (another zone, a slow link) carries its own: noise
// would otherwise look like a lasting preference, the pick trading about
// a millisecond of it for a request in flight.

// PlacementRepush is the least time between two states offered only
// because a round trip drifted (Drifted): the pick follows the path, not
// every probe.
const PlacementRepush = 5 * time.Second

// RTTTolerance is the least round-trip change worth a push, and the least
// distance from its locality at which a cell's round trip stands apart.
const RTTTolerance = time.Millisecond

// Place is a round trip and its jitter as offered (0: unknown).
type Place struct{ RTT, Jitter time.Duration }

// Placement is the round trips of an offered state by key: a cell id
// (which never holds '/') for a cell that stands apart, LocalKey for the
// local locality, RemoteKey(region) for a remote region's locality.
type Placement map[string]Place

// LocalKey is the Placement key of the local locality.
const LocalKey = "locality/local"

// RemoteKey is the Placement key of a remote region's locality.
func RemoteKey(region string) string { return "region/" + region }

// LocalPlacement returns the local locality's round trip, the medians of
// the probed RTTs and jitters of the cells in the load balancer (zero when
// none is probed), and the cells whose round trip stands apart from it.
func LocalPlacement(views []*CellView) (loc Place, apart map[string]Place) {
	return localPlacement(views, func(v **CellView) (string, Place, bool) {
		return (*v).ID, Place{(*v).RTT, (*v).Jitter}, (*v).Weight.Published > 0 && (*v).RTTOK
	})
}

// localPlacement is LocalPlacement over xs, whose at gives each one's
// cell id, round trip, and whether it counts (in the load balancer, and
// probed).
func localPlacement[T any](xs []T, at func(*T) (id string, p Place, in bool)) (loc Place, apart map[string]Place) {
	n := 0
	for i := range xs {
		if _, _, in := at(&xs[i]); in {
			n++
		}
	}
	if n == 0 {
		return Place{}, nil
	}
	// One buffer of the exact size, for the round trips and then the
	// jitters: at 10,000 cells, appending to two empty slices allocated
	// eight times this.
	ds := make([]time.Duration, 0, n)
	for i := range xs {
		if _, p, in := at(&xs[i]); in {
			ds = append(ds, p.RTT)
		}
	}
	loc.RTT = median(ds)
	ds = ds[:0]
	for i := range xs {
		if _, p, in := at(&xs[i]); in {
			ds = append(ds, p.Jitter)
		}
	}
	loc.Jitter = median(ds)
	for i := range xs {
		if id, c, in := at(&xs[i]); in && standsApart(c, loc) {
			if apart == nil {
				apart = map[string]Place{}
			}
			apart[id] = c
		}
	}
	return loc, apart
}

// median returns the middle of ds (the lower one of an even count): the
// element sorting would put at (len(ds)-1)/2, found by selection in
// linear expected time (Hoare's quickselect, with a median-of-three pivot
// and a three-way partition), which reorders ds. A push used to sort the
// round trips and the jitters of every cell in the load balancer.
func median(ds []time.Duration) time.Duration {
	k := (len(ds) - 1) / 2
	lo, hi := 0, len(ds)-1
	for lo < hi {
		// Median of three, left at hi as the pivot.
		mid := lo + (hi-lo)/2
		if ds[mid] < ds[lo] {
			ds[mid], ds[lo] = ds[lo], ds[mid]
		}
		if ds[hi] < ds[lo] {
			ds[hi], ds[lo] = ds[lo], ds[hi]
		}
		if ds[mid] < ds[hi] {
			ds[mid], ds[hi] = ds[hi], ds[mid]
		}
		pivot := ds[hi]
		// Three-way partition: < pivot, == pivot, > pivot (many equal
		// round trips must not make it quadratic).
		lt, i, gt := lo, lo, hi
		for i <= gt {
			switch {
			case ds[i] < pivot:
				ds[lt], ds[i] = ds[i], ds[lt]
				lt++
				i++
			case ds[i] > pivot:
				ds[i], ds[gt] = ds[gt], ds[i]
				gt--
			default:
				i++
			}
		}
		switch {
		case k < lt:
			hi = lt - 1
		case k > gt:
			lo = gt + 1
		default:
			return pivot
		}
	}
	return ds[k]
}

// standsApart reports whether a cell's round trip differs from its
// locality's by more than RTTTolerance and more than twice their jitters
// together: a difference the probes' noise does not explain.
func standsApart(c, loc Place) bool {
	return (c.RTT - loc.RTT).Abs() > max(RTTTolerance, 2*(c.Jitter+loc.Jitter))
}

// Drifted reports whether the round trips to offer, those of views and of
// the remote regions (rtts), moved materially (RTTDrifted) from sent, the
// last offered: the local locality's, a cell's that stands apart (or
// stopped or started to), a remote region's.
func Drifted(sent Placement, views []*CellView, rtts map[string]time.Duration) bool {
	loc, apart := LocalPlacement(views)
	if got := sent[LocalKey]; RTTDrifted(got.RTT, loc.RTT) || RTTDrifted(got.Jitter, loc.Jitter) {
		return true
	}
	for i := range views {
		v := views[i]
		if v.Weight.Published == 0 {
			continue
		}
		want, got := apart[v.ID], sent[v.ID]
		if RTTDrifted(got.RTT, want.RTT) || RTTDrifted(got.Jitter, want.Jitter) {
			return true
		}
	}
	for k, got := range sent {
		if region, ok := strings.CutPrefix(k, RemoteKey("")); ok && RTTDrifted(got.RTT, rtts[region]) {
			return true
		}
	}
	return false
}

// Held is the round trip to publish under key: the one sent there last
// (s, the last offer's Placement) while now has not drifted from it
// (RTTDrifted, the rule Drifted repushes by), else now. Without it every
// push carried the probes' latest medians: a change of microseconds in
// the local locality's metadata made every assignment of the model new,
// so a delta client was resent, and decoded again, every endpoint of every
// cluster for one cell's death.
func (s Placement) Held(key string, now Place) Place {
	if got, ok := s[key]; ok && !RTTDrifted(got.RTT, now.RTT) && !RTTDrifted(got.Jitter, now.Jitter) {
		return got
	}
	return now
}

// RTTDrifted: b became known or unknown (0), or differs from a by more
// than RTTTolerance and a tenth of a.
func RTTDrifted(a, b time.Duration) bool {
	if (a > 0) != (b > 0) {
		return true
	}
	return (b - a).Abs() > max(RTTTolerance, a/10)
}
