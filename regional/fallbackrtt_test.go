package regional

import (
	"math"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// The fallback's matrix: this region's own measurements for its row; for
// the pairs between peers, what summary.RTTMatrix makes of their
// summaries (a pair either listed, else the coordinates' distance, else
// +Inf), as the global does.
func TestFallbackRTTMatrix(t *testing.T) {
	coord := func(x float64) *isobarpb.NetworkCoordinate {
		return &isobarpb.NetworkCoordinate{Vec: []float64{x, 0}, Error: 0.3}
	}
	fr := fallbackRegions{
		names: []string{"a", "b", "c", "d"}, self: 0,
		sums: map[string]*isobarpb.RegionSummary{
			// a's own summary lists only its nearest; its gossip measured more.
			"a": {Region: "a", Rtt: []*isobarpb.PeerRTT{{Region: "b", RttMs: 99}}, Coordinate: coord(0)},
			"b": {Region: "b", Rtt: []*isobarpb.PeerRTT{{Region: "a", RttMs: 99}}, Coordinate: coord(0.010)},
			"c": {Region: "c", Coordinate: coord(0.045)},
			"d": {Region: "d"}, // a pre-issue-26 peer listing nothing here, no coordinate
		},
		rtt: map[string]time.Duration{"b": 10 * time.Millisecond, "c": 40 * time.Millisecond, "d": 70 * time.Millisecond},
	}
	mat := fr.rttMatrix()
	want := [][]float64{
		{0, 10, 40, 70},
		{10, 0, 35, math.Inf(1)},
		{40, 35, 0, math.Inf(1)},
		{70, math.Inf(1), math.Inf(1), 0},
	}
	for i := range want {
		for j := range want[i] {
			if got := mat[i][j]; math.Abs(got-want[i][j]) > 1e-9 && got != want[i][j] {
				t.Errorf("%s–%s = %v ms, want %v", fr.names[i], fr.names[j], got, want[i][j])
			}
		}
	}
}

// coordGossip is peerGossip that also keeps a network coordinate, as
// gossip.Node does.
type coordGossip struct{ peerGossip }

func (coordGossip) Coordinate() *coordinate.Coordinate {
	return &coordinate.Coordinate{Vec: []float64{0.01, 0.02}, Error: 0.4, Height: 1e-5}
}

// The summary builder sends the NearestRTT nearest measured RTTs and the
// gossip node's coordinate; a gossip stand-in without one sends none.
func TestSummaryNearestRTTAndCoordinate(t *testing.T) {
	f := newFixtureWith(t, func(*Config) {}, func(*Registry) {})
	g := f.reg.cfg.Global
	g.NearestRTT = 2
	s := newTestSyncer(g, "r1", f.reg, syncDeps{Gossip: coordGossip{peerGossip{clock: f.clock.Now}}, Clock: f.clock, Metrics: f.m})
	sm := s.summary.build(f.clock.Now())
	// peerGossip: r4 1 ms, r3 20 ms, r2 30 ms.
	if len(sm.GetRtt()) != 2 || sm.GetRtt()[0].GetRegion() != "r3" || sm.GetRtt()[1].GetRegion() != "r4" {
		t.Errorf("rtt %v, want r3 and r4 (the 2 nearest)", sm.GetRtt())
	}
	if c := sm.GetCoordinate(); c == nil || len(c.GetVec()) != 2 || c.GetVec()[1] != 0.02 {
		t.Errorf("coordinate %v, want the gossip node's", c)
	}
	plain := newTestSyncer(g, "r1", f.reg, syncDeps{Gossip: peerGossip{clock: f.clock.Now}, Clock: f.clock, Metrics: f.m})
	if c := plain.summary.build(f.clock.Now()).GetCoordinate(); c != nil {
		t.Errorf("coordinate %v from a source without one", c)
	}
}
