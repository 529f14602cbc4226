package cycle

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestRTTDrifted(t *testing.T) {
	for _, tc := range []struct {
		a, b time.Duration
		want bool
	}{
		{0, 0, false},
		{0, time.Microsecond, true}, // became known
		{time.Millisecond, 0, true}, // became unknown
		{400 * time.Microsecond, 1300 * time.Microsecond, false},
		{400 * time.Microsecond, 1500 * time.Microsecond, true},
		{60 * time.Millisecond, 65 * time.Millisecond, false},
		{60 * time.Millisecond, 67 * time.Millisecond, true},
		{60 * time.Millisecond, 53 * time.Millisecond, true},
	} {
		if got := RTTDrifted(tc.a, tc.b); got != tc.want {
			t.Errorf("RTTDrifted(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestLocalPlacement(t *testing.T) {
	cell := func(id string, rtt, jitter time.Duration, probed bool, weight uint32) CellView {
		v := CellView{ID: id, RTT: rtt, Jitter: jitter, RTTOK: probed}
		v.Weight.Published = weight
		return v
	}
	us := time.Microsecond
	loc, apart := LocalPlacement(ptrs([]CellView{
		cell("a", 100*us, 20*us, true, 100),
		cell("b", 250*us, 100*us, true, 100),
		cell("c", 1600*us, 1200*us, true, 100), // a noisy spike, within its jitter
		cell("d", 9*time.Millisecond, 200*us, true, 100),
		cell("e", 300*us, 50*us, false, 100),       // not probed
		cell("f", 40*time.Millisecond, 0, true, 0), // not in the load balancer
	}))
	if loc != (Place{250 * us, 100 * us}) {
		t.Errorf("locality %+v, want the lower medians 250µs and 100µs", loc)
	}
	if len(apart) != 1 || apart["d"] != (Place{9 * time.Millisecond, 200 * us}) {
		t.Errorf("cells apart %+v, want d alone", apart)
	}
	if loc, apart := LocalPlacement(ptrs([]CellView{cell("e", 300*us, 0, false, 100)})); loc != (Place{}) || apart != nil {
		t.Errorf("no probed cell: %+v %+v", loc, apart)
	}
}

// TestPlacementHeld: a round trip within the tolerance of the one sent is
// published as sent; one that drifted, or was never sent, as it is now.
func TestPlacementHeld(t *testing.T) {
	us := time.Microsecond
	sent := Placement{LocalKey: {400 * us, 50 * us}, RemoteKey("r2"): {RTT: 60 * time.Millisecond}}
	for _, tc := range []struct {
		key       string
		now, want Place
	}{
		{LocalKey, Place{700 * us, 80 * us}, Place{400 * us, 50 * us}},
		{LocalKey, Place{1500 * us, 80 * us}, Place{1500 * us, 80 * us}},                         // the RTT drifted
		{LocalKey, Place{400 * us, 2 * time.Millisecond}, Place{400 * us, 2 * time.Millisecond}}, // the jitter did
		{LocalKey, Place{}, Place{}}, // became unknown
		{RemoteKey("r2"), Place{RTT: 63 * time.Millisecond}, Place{RTT: 60 * time.Millisecond}},
		{RemoteKey("r2"), Place{RTT: 90 * time.Millisecond}, Place{RTT: 90 * time.Millisecond}},
		{"cell-a", Place{5 * time.Millisecond, 0}, Place{5 * time.Millisecond, 0}}, // never sent
	} {
		if got := sent.Held(tc.key, tc.now); got != tc.want {
			t.Errorf("Held(%s, %+v) = %+v, want %+v", tc.key, tc.now, got, tc.want)
		}
	}
	if got := Placement(nil).Held(LocalKey, Place{RTT: us}); got != (Place{RTT: us}) {
		t.Errorf("nothing sent: %+v", got)
	}
}

// TestMedianSelects holds median (a selection) to the element a sort puts
// at (n-1)/2, over sizes 1 to 64 and values from all distinct to all
// equal, in sorted, reversed and shuffled orders.
func TestMedianSelects(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for n := 1; n <= 64; n++ {
		for _, spread := range []int{1, 2, 3, n, 1000} {
			for order := range 3 {
				ds := make([]time.Duration, n)
				for i := range ds {
					ds[i] = time.Duration(rng.IntN(spread))
				}
				switch order {
				case 0:
					slices.Sort(ds)
				case 1:
					slices.Sort(ds)
					slices.Reverse(ds)
				}
				want := slices.Clone(ds)
				slices.Sort(want)
				if got := median(ds); got != want[(n-1)/2] {
					t.Fatalf("n %d spread %d order %d: median %v, sorted middle %v", n, spread, order, got, want[(n-1)/2])
				}
				slices.Sort(ds)
				if !slices.Equal(ds, want) {
					t.Fatalf("n %d: median lost or changed elements", n)
				}
			}
		}
	}
}
