package regional

import (
	"math"
	"testing"

	"github.com/isobar-mesh/isobar/reqclass"
)

// TestOrderShed: a blind shed is taken from sheddable first, then
// standard, critical last; pinned demand does not count; with no mix
// every criticality keeps the blind share.
func TestOrderShed(t *testing.T) {
	mix := map[SliceKey]float64{
		{Criticality: reqclass.Critical}: 20, {Criticality: reqclass.Standard}: 50, {Criticality: reqclass.Sheddable}: 30,
		{Criticality: reqclass.Sheddable, Set: "eu"}: 1000, // pinned: not in the unpinned mix
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	for _, tc := range []struct{ shed, crit, std, shd float64 }{
		{0, 0, 0, 0},
		{0.15, 0, 0, 0.5}, // 15 of 100 rps: half the sheddable
		{0.3, 0, 0, 1},    // exactly the sheddable
		{0.55, 0, 0.5, 1}, // then half the standard
		{0.9, 0.5, 1, 1},  // critical only beyond both
		{1, 1, 1, 1},
	} {
		c, s, d := orderShed(tc.shed, mix)
		if !near(c, tc.crit) || !near(s, tc.std) || !near(d, tc.shd) {
			t.Errorf("orderShed(%v) = %v/%v/%v, want %v/%v/%v", tc.shed, c, s, d, tc.crit, tc.std, tc.shd)
		}
	}
	if c, s, d := orderShed(0.2, nil); c != 0.2 || s != 0.2 || d != 0.2 {
		t.Errorf("no mix: %v/%v/%v, want the blind share for all", c, s, d)
	}
	// A sliced plan's shares stand, sheddable never below standard.
	c, s, d := orderedShares(ModelRoutes{Sliced: true, Shed: 0.4, ShedCritical: 0, ShedSheddable: 0.1}, mix)
	if c != 0 || s != 0.4 || d != 0.4 {
		t.Errorf("sliced: %v/%v/%v, want 0/0.4/0.4", c, s, d)
	}
	if c, s, d := orderedShares(ModelRoutes{Shed: 0.3}, mix); c != 0 || s != 0 || d != 1 {
		t.Errorf("blind plan: %v/%v/%v, want 0/0/1", c, s, d)
	}
}
