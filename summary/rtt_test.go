package summary

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

func peersRTT(n int) map[string]time.Duration {
	m := map[string]time.Duration{}
	for i := range n {
		// p000 is the farthest: nearest-first is not name order.
		m[fmt.Sprintf("p%03d", i)] = time.Duration(n-i) * time.Millisecond
	}
	return m
}

// The summary lists the k nearest measured RTTs, in name order, k bounded
// whatever the configuration; negative keeps the pre-issue-26 full list.
func TestNearestRTT(t *testing.T) {
	cases := []struct {
		name          string
		peers, k      int
		want          int
		nearestRegion string
	}{
		{"default", 100, 0, DefaultNearestRTT, "p099"},
		{"fewer peers than k", 3, 0, 3, "p002"},
		{"k=2", 100, 2, 2, "p099"},
		{"clamped", 1000, 10_000, MaxNearestRTT, "p999"},
		{"full list", 100, -1, 100, "p099"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := fleet(3)
			in.RTT, in.NearestRTT = peersRTT(tc.peers), tc.k
			s := Aggregate(in)
			if err := Validate(s); err != nil {
				t.Fatal(err)
			}
			if len(s.Rtt) != tc.want {
				t.Fatalf("%d entries, want %d", len(s.Rtt), tc.want)
			}
			var max float64
			for i, p := range s.Rtt {
				if i > 0 && s.Rtt[i-1].Region >= p.Region {
					t.Errorf("not in name order: %v", s.Rtt)
				}
				max = math.Max(max, p.RttMs)
			}
			if max != float64(tc.want) {
				t.Errorf("farthest listed is %v ms, want the %d nearest (up to %d ms)", max, tc.want, tc.want)
			}
			if s.Rtt[len(s.Rtt)-1].Region != tc.nearestRegion {
				t.Errorf("last entry %s, want %s", s.Rtt[len(s.Rtt)-1].Region, tc.nearestRegion)
			}
		})
	}
}

// A summary's size stops growing with regions once a region has
// DefaultNearestRTT peers: 20 and 2,000 peers give the same bytes (names
// of equal length), while the full list grows.
func TestSizeFlatInRegions(t *testing.T) {
	size := func(peers, k int) int {
		in := fleet(10)
		in.RTT, in.NearestRTT = map[string]time.Duration{}, k
		for i := range peers {
			in.RTT[fmt.Sprintf("p%04d", i)] = time.Duration(1+i%97) * time.Millisecond
		}
		return proto.Size(Aggregate(in))
	}
	small, large := size(20, 0), size(2000, 0)
	t.Logf("summary bytes: 20 peers %d, 2,000 peers %d (full list: %d, %d)", small, large, size(20, -1), size(2000, -1))
	if small != large {
		t.Errorf("20 peers → %d bytes, 2,000 peers → %d: grows with regions", small, large)
	}
	if size(2000, -1) < 10*large {
		t.Errorf("the full list (%d bytes) should dwarf the reduced one (%d)", size(2000, -1), large)
	}
}

// A pre-issue-26 region sends every RTT and no coordinate: still valid
// (a mixed-version fleet during an upgrade), and the matrix uses every
// pair as measured.
func TestOldFullSummaryAccepted(t *testing.T) {
	in := fleet(3)
	in.RTT, in.NearestRTT, in.Coordinate = peersRTT(MaxRegions-1), -1, nil
	s := Aggregate(in)
	if len(s.Rtt) != MaxRegions-1 || s.Coordinate != nil {
		t.Fatalf("%d entries, coordinate %v", len(s.Rtt), s.Coordinate)
	}
	if err := Validate(s); err != nil {
		t.Fatalf("full list refused: %v", err)
	}
}

// CoordinateProto leaves out what a receiver could not use: nil,
// non-finite or out-of-bounds coordinates.
func TestCoordinateProto(t *testing.T) {
	placed := &coordinate.Coordinate{Vec: []float64{0.01, 0.02}, Error: 0.4, Height: 1e-5}
	for name, c := range map[string]*coordinate.Coordinate{
		"nil":           nil,
		"17 dimensions": {Vec: make([]float64, 17), Error: 0.4},
		"NaN":           {Vec: []float64{math.NaN()}, Error: 0.4},
		"absurd":        {Vec: []float64{1e9}, Error: 0.4},
	} {
		if pb := CoordinateProto(c); pb != nil {
			t.Errorf("%s: got %v, want none", name, pb)
		}
	}
	pb := CoordinateProto(placed)
	if pb == nil || ValidateCoordinate(pb) != nil {
		t.Fatalf("placed coordinate: %v", pb)
	}
	back := Coordinate(pb)
	if back.DistanceTo(placed) != 2*time.Duration(1e-5*float64(time.Second)) {
		t.Errorf("round trip moved the coordinate: %+v", back)
	}
}

// RTTMatrix: a pair either side listed is measured (the mean when both
// did), any other pair is the coordinates' distance, and +Inf without
// them; symmetric, zero diagonal, sources reported.
func TestRTTMatrix(t *testing.T) {
	at := func(x float64) *isobarpb.NetworkCoordinate {
		return &isobarpb.NetworkCoordinate{Vec: []float64{x, 0}, Error: 0.2}
	}
	sums := []*isobarpb.RegionSummary{
		{Region: "a", Rtt: []*isobarpb.PeerRTT{{Region: "b", RttMs: 10}}, Coordinate: at(0)},
		{Region: "b", Rtt: []*isobarpb.PeerRTT{{Region: "a", RttMs: 14}, {Region: "unknown", RttMs: 1}}, Coordinate: at(0.012)},
		{Region: "c", Rtt: []*isobarpb.PeerRTT{{Region: "b", RttMs: 30}}, Coordinate: at(0.050)},
		{Region: "d"}, // an older region: no coordinate, listed by nobody
		{Region: "e", Coordinate: &isobarpb.NetworkCoordinate{Vec: []float64{0.1, 0, 0}, Error: 0.2}}, // other dimensions
		nil, // f: no summary
	}
	names := []string{"a", "b", "c", "d", "e", "f"}
	src := make([][]RTTSource, len(names))
	for i := range src {
		src[i] = make([]RTTSource, len(names))
	}
	mat := RTTMatrix(names, sums, src)
	inf := math.Inf(1)
	want := map[[2]int]struct {
		ms  float64
		src RTTSource
	}{
		{0, 1}: {12, RTTMeasured}, {1, 2}: {30, RTTMeasured}, {0, 2}: {50, RTTEstimated},
		{0, 3}: {inf, RTTUnknown}, {0, 4}: {inf, RTTUnknown}, {2, 5}: {inf, RTTUnknown}, {3, 3}: {0, RTTMeasured},
	}
	for ij, w := range want {
		i, j := ij[0], ij[1]
		for _, p := range [][2]int{{i, j}, {j, i}} {
			if got := mat[p[0]][p[1]]; math.Abs(got-w.ms) > 1e-6 && got != w.ms {
				t.Errorf("%s–%s = %v ms, want %v", names[p[0]], names[p[1]], got, w.ms)
			}
			if src[p[0]][p[1]] != w.src {
				t.Errorf("%s–%s source %v, want %v", names[p[0]], names[p[1]], src[p[0]][p[1]], w.src)
			}
		}
	}
}

func BenchmarkAggregateNearest1000Peers(b *testing.B) {
	in := fleet(100)
	in.RTT = peersRTT(1000)
	for b.Loop() {
		_ = Aggregate(in)
	}
}

// estimateRTT is serf's Coordinate.DistanceTo, in ms (to the nanosecond
// DistanceTo rounds to), on random coordinates with negative adjustments
// too.
func TestEstimateIsSerfDistance(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 4))
	rnd := func() *coordinate.Coordinate {
		c := &coordinate.Coordinate{Vec: make([]float64, 8), Error: rng.Float64(), Adjustment: (rng.Float64() - 0.7) * 0.02, Height: rng.Float64() * 0.005}
		for k := range c.Vec {
			c.Vec[k] = (rng.Float64() - 0.5) * 0.2
		}
		return c
	}
	for range 10_000 {
		a, b := rnd(), rnd()
		want := float64(a.DistanceTo(b)) / float64(time.Millisecond)
		if got := estimateRTT(a, b); math.Abs(got-want) > 1e-6 {
			t.Fatalf("estimate %v ms, serf's DistanceTo %v ms for %+v, %+v", got, want, a, b)
		}
	}
}
