package global

import (
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// TestForRegionKeepsSliceDestinations: a region's copy of the plan
// carries the ingress address of every region its model plans route to,
// its slices' routes included (a pinned slice may route to a region the
// unpinned routes do not name; without its address the region refuses
// the plan), and no other.
func TestForRegionKeepsSliceDestinations(t *testing.T) {
	p := &isobarpb.RoutingPlan{
		Plans: []*isobarpb.ModelPlan{{Model: "m", IngressRegion: "a", Routes: []*isobarpb.Route{{Destination: "a", Fraction: 1}},
			Slices: []*isobarpb.SlicePlan{{AllowedRegions: []string{"eu"}, Routes: []*isobarpb.Route{{Destination: "eu", Fraction: 1}}}}}},
		Ingress: []*isobarpb.RegionIngress{{Region: "a", Address: "10.0.0.1:1"}, {Region: "eu", Address: "10.0.0.2:1"}, {Region: "b", Address: "10.0.0.3:1"}},
	}
	got := map[string]bool{}
	for _, in := range forRegion(p, "a", time.Unix(0, 0)).GetIngress() {
		got[in.GetRegion()] = true
	}
	if !got["a"] || !got["eu"] || got["b"] {
		t.Errorf("ingress kept %v, want a and eu (a slice's destination), not b", got)
	}
}
