package summary

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/hashicorp/serf/coordinate"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// A summary's size must not grow with the number of regions (issue 26):
// it lists the measured RTT to its NearestRTT nearest regions only and
// carries the region's Vivaldi network coordinate (hashicorp/serf
// coordinate, computed by regional/gossip from memberlist's probes), from
// which a receiver estimates the RTT to every other region. RTTMatrix is
// the one place where a receiver turns summaries back into the RTT matrix
// the optimiser plans with.
const (
	// DefaultNearestRTT is how many measured RTTs a summary lists when
	// Input.NearestRTT is 0.
	DefaultNearestRTT = 8
	// MaxNearestRTT bounds Input.NearestRTT: a larger value is clamped to
	// it, so the summary stays bounded whatever the configuration.
	MaxNearestRTT = 64
	// MaxCoordinateDims bounds a coordinate's dimensions (serf's default
	// is 8).
	MaxCoordinateDims = 16
	// MaxCoordinateSeconds bounds the magnitude of every coordinate
	// component (vec, adjustment, height): MaxRTTMs in seconds.
	MaxCoordinateSeconds = MaxRTTMs / 1000
	// MaxCoordinateError bounds a coordinate's error. serf starts a node
	// at its VivaldiErrorMax (1.5) and never raises it above that.
	MaxCoordinateError = 1.5
)

// nearestRTT returns the measured RTTs of in to its k nearest other regions
// (ties by name), sorted by region: k is in.NearestRTT (0: DefaultNearestRTT,
// above MaxNearestRTT: MaxNearestRTT, negative: every peer up to MaxRegions,
// the pre-issue-26 full list).
func nearestRTT(in Input) []*isobarpb.PeerRTT {
	k := in.NearestRTT
	switch {
	case k == 0:
		k = DefaultNearestRTT
	case k < 0:
		k = MaxRegions
	case k > MaxNearestRTT:
		k = MaxNearestRTT
	}
	peers := make([]*isobarpb.PeerRTT, 0, len(in.RTT))
	for r, d := range in.RTT {
		if r != in.Region && ValidName(r) {
			peers = append(peers, &isobarpb.PeerRTT{Region: r, RttMs: saturate(float64(d)/float64(time.Millisecond), MaxRTTMs)})
		}
	}
	slices.SortFunc(peers, func(a, b *isobarpb.PeerRTT) int {
		return cmp.Or(cmp.Compare(a.GetRttMs(), b.GetRttMs()), cmp.Compare(a.GetRegion(), b.GetRegion()))
	})
	if len(peers) > k {
		peers = peers[:k]
	}
	slices.SortFunc(peers, func(a, b *isobarpb.PeerRTT) int { return cmp.Compare(a.GetRegion(), b.GetRegion()) })
	return peers
}

// CoordinateProto is c on the wire, or nil when c is nil or would not
// pass ValidateCoordinate (not finite, out of bounds). Whether a
// coordinate has been placed by probes at all is its source's call
// (regional/gossip Node.Coordinate is nil until then).
func CoordinateProto(c *coordinate.Coordinate) *isobarpb.NetworkCoordinate {
	if c == nil {
		return nil
	}
	pb := &isobarpb.NetworkCoordinate{Vec: slices.Clone(c.Vec), Error: c.Error, Adjustment: c.Adjustment, Height: c.Height}
	if ValidateCoordinate(pb) != nil {
		return nil
	}
	return pb
}

// Coordinate is pb as a serf coordinate, or nil when pb is nil.
func Coordinate(pb *isobarpb.NetworkCoordinate) *coordinate.Coordinate {
	if pb == nil {
		return nil
	}
	return &coordinate.Coordinate{Vec: slices.Clone(pb.GetVec()), Error: pb.GetError(), Adjustment: pb.GetAdjustment(), Height: pb.GetHeight()}
}

// ValidateCoordinate checks a received coordinate: 1 to MaxCoordinateDims
// dimensions, every component finite and within ±MaxCoordinateSeconds, the
// height in [0, MaxCoordinateSeconds] and the error in
// [0, MaxCoordinateError]. The error wraps ErrInvalid and names the field.
// regional/gossip checks the coordinates in probe acks with it too.
func ValidateCoordinate(c *isobarpb.NetworkCoordinate) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: coordinate: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if n := len(c.GetVec()); n == 0 || n > MaxCoordinateDims {
		return bad("%d dimensions; want 1 to %d", n, MaxCoordinateDims)
	}
	for i, v := range c.GetVec() {
		if !isFinite(v) || math.Abs(v) > MaxCoordinateSeconds {
			return bad("vec[%d] is %v s; want a finite value in [-%d, %d]", i, v, MaxCoordinateSeconds, MaxCoordinateSeconds)
		}
	}
	if a := c.GetAdjustment(); !isFinite(a) || math.Abs(a) > MaxCoordinateSeconds {
		return bad("adjustment is %v s; want a finite value in [-%d, %d]", a, MaxCoordinateSeconds, MaxCoordinateSeconds)
	}
	if h := c.GetHeight(); !isFinite(h) || h < 0 || h > MaxCoordinateSeconds {
		return bad("height is %v s; want a finite value in [0, %d]", h, MaxCoordinateSeconds)
	}
	if e := c.GetError(); !isFinite(e) || e < 0 || e > MaxCoordinateError {
		return bad("error is %v; want a finite value in [0, %v]", e, MaxCoordinateError)
	}
	return nil
}

// RTTSource says where an entry of RTTMatrix came from.
type RTTSource uint8

const (
	// RTTUnknown: neither region measured the pair and at least one has
	// no usable coordinate; the entry is +Inf (unreachable).
	RTTUnknown RTTSource = iota
	// RTTMeasured: one or both regions listed the pair (the mean of the
	// two directions when both did).
	RTTMeasured
	// RTTEstimated: the distance between the regions' coordinates.
	RTTEstimated
)

// RTTMatrix is the symmetric RTT matrix (ms) between regions, sums[i]
// being the latest summary of regions[i] (nil: none): a pair either
// region measured is the mean of what they listed; any other pair is the
// distance between their coordinates (hashicorp/serf coordinate
// DistanceTo, bounded by MaxRTTMs) when both carry compatible ones; else
// +Inf. The diagonal is 0. src, when not nil, gets each entry's source.
// This is the one place that decides between measured and estimated RTTs;
// both tiers plan with it (global, regional fallback). A pre-issue-26
// region lists every peer, so a fleet of those plans on measurements
// alone, as before.
func RTTMatrix(regions []string, sums []*isobarpb.RegionSummary, src [][]RTTSource) [][]float64 {
	n := len(regions)
	idx := make(map[string]int, n)
	for i, r := range regions {
		idx[r] = i
	}
	coords := make([]*coordinate.Coordinate, n)
	for i, s := range sums[:min(n, len(sums))] {
		if c := s.GetCoordinate(); c != nil && ValidateCoordinate(c) == nil {
			coords[i] = Coordinate(c)
		}
	}
	cells := make([]float64, n*n)
	out := make([][]float64, n)
	for i := range out {
		out[i] = cells[i*n : (i+1)*n : (i+1)*n]
	}
	// Estimates everywhere, then the measured pairs over them.
	for i := range out {
		for j := i + 1; j < n; j++ {
			v := estimateRTT(coords[i], coords[j])
			out[i][j], out[j][i] = v, v
			if src != nil {
				how := RTTEstimated
				if math.IsInf(v, 1) {
					how = RTTUnknown
				}
				src[i][j], src[j][i] = how, how
			}
		}
		if src != nil {
			src[i][i] = RTTMeasured
		}
	}
	// listed[i*n+j] (i < j) counts the directions that listed the pair:
	// the first sets it, the second makes it their mean (Validate refuses
	// a region listing a peer twice).
	listed := make([]uint8, n*n)
	for i, s := range sums[:min(n, len(sums))] {
		for _, p := range s.GetRtt() {
			j, ok := idx[p.GetRegion()]
			if !ok || j == i {
				continue
			}
			a, b := min(i, j), max(i, j)
			v := p.GetRttMs()
			switch listed[a*n+b] {
			case 0:
			case 1:
				v = (out[a][b] + v) / 2
			default:
				continue
			}
			listed[a*n+b]++
			out[a][b], out[b][a] = v, v
			if src != nil {
				src[a][b], src[b][a] = RTTMeasured, RTTMeasured
			}
		}
	}
	return out
}

// estimateRTT is the RTT (ms) the coordinates a and b predict, bounded by
// MaxRTTMs, or +Inf when either is missing or they differ in dimensions.
// It is serf's Coordinate.DistanceTo (hashicorp/serf coordinate/
// coordinate.go: the Euclidean distance plus both heights, plus both
// adjustments when that stays positive) without its allocation per call:
// the leader evaluates it for about n²/2 pairs every cycle, 5·10⁵ at
// 1,000 regions. TestEstimateIsSerfDistance holds the two equal.
func estimateRTT(a, b *coordinate.Coordinate) float64 {
	if a == nil || b == nil || len(a.Vec) != len(b.Vec) {
		return math.Inf(1)
	}
	var sq float64
	for k, x := range a.Vec {
		d := x - b.Vec[k]
		sq += d * d
	}
	dist := math.Sqrt(sq) + a.Height + b.Height
	if adj := dist + a.Adjustment + b.Adjustment; adj > 0 {
		dist = adj
	}
	return saturate(dist*1000, MaxRTTMs)
}
