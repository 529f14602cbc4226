package cycle

import (
	"testing"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
)

// TestSlotAfterIsSlotOf: a slot made from the cell's previous slot is the
// slot SlotOf makes, whether the endpoint stayed or moved, and whether
// the cell was or is in the load balancer.
func TestSlotAfterIsSlotOf(t *testing.T) {
	view := func(ep string, published uint32) *CellView {
		return &CellView{ID: "c1", Endpoint: ep, Model: "m", State: lifecycle.Ready, MaxModelLen: 4096,
			Weight: projection.Weight{Published: published}}
	}
	endpoints := []string{"10.0.0.5:8000", "10.0.0.5:8001", "[::ffff:10.0.0.6]:8000", "[2001:db8::1]:9000", ""}
	for _, prevEP := range endpoints {
		for _, prevW := range []uint32{0, 7} {
			prevView := view(prevEP, prevW)
			prev := SlotOf(prevView)
			for _, ep := range endpoints {
				for _, w := range []uint32{0, 3} {
					v := view(ep, w)
					if got, want := SlotAfter(v, &prev, prevView.Endpoint), SlotOf(v); got != want {
						t.Errorf("after %q (weight %d), %q (weight %d): SlotAfter %+v, SlotOf %+v", prevEP, prevW, ep, w, got, want)
					}
				}
			}
		}
	}
}
