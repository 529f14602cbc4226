package cycle

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/isobar-mesh/isobar/regional/lifecycle"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/xds"
)

// An offer built in an earlier offer's buffers (Params.Reuse) equals the
// one built afresh, step after step of cells joining, leaving and moving
// between two models, with residency sets whose localities share the
// local one; the offer in between (the one the data planes are being
// given, as the registry's last) is left alone; and the buffers are
// used: the model's local endpoints land in the earlier offer's array.
func TestBuildStateReuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 26))
	routes := &Routes{Ingress: pinTestIngress, Models: map[string]ModelRoutes{"m": {Routes: map[string]float64{"r1": 0.5, "r4": 0.5}}}}
	p := Params{Region: "r1", Zone: "z", Routes: routes, RTTs: pinTestRTTs, Sets: pinTestSets}
	var prev, last Offer // built two steps and one step ago
	var lastWant Offer   // last, built afresh
	reused := 0
	for step := range 200 {
		n := 20 + rng.IntN(40)
		views := make([]CellView, n)
		for i := range views {
			model := "m"
			if i%5 == 0 {
				model = "n"
			}
			w := uint32(rng.IntN(3) * 50) // some out of the load balancer
			views[i] = CellView{ID: fmt.Sprintf("c%03d", i), Endpoint: fmt.Sprintf("10.0.%d.%d:8000", step%200, i), Model: model,
				State: lifecycle.Ready, Weight: projection.Weight{Published: w, ClassWeight: w / 2}}
		}
		want := BuildState(p, ptrs(views))
		q := p
		q.Reuse = prev
		got := BuildState(q, ptrs(views))
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: an offer built in reused buffers differs from a fresh one:\n got %+v\nwant %+v", step, got.State, want.State)
		}
		if old, cur := localOf(prev, "m"), localOf(got, "m"); cap(old) > 0 && cap(cur) > 0 && sameArray(old, cur) {
			reused++
		}
		if !reflect.DeepEqual(last, lastWant) {
			t.Fatalf("step %d: building in the offer of two steps ago changed the last offer", step)
		}
		prev, last, lastWant = last, got, want
	}
	if reused < 50 {
		t.Errorf("the local endpoints reused the earlier offer's array in %d of 200 steps", reused)
	}
}

// localOf is model's local endpoints in o (nil when none).
func localOf(o Offer, model string) []xds.Endpoint {
	for _, m := range o.State.Models {
		if m.Name != model {
			continue
		}
		for _, l := range m.Localities {
			if l.Region == "r1" {
				return l.Endpoints
			}
		}
	}
	return nil
}
