package xds

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestMemoisedBuildEqualsFresh builds a random churn sequence (endpoints
// added, removed, reweighted, degraded; a residency set pinned and
// unpinned; now and then an invalid state the Builder must refuse) with
// one Builder, and checks every result equals that of a fresh Builder on
// the same state. The memoised Builder reuses its canonical models'
// buffers (keepCanon), its endpoint memo and its resources; none of that
// may leak one state into the next. The caller's state is then
// scribbled over, as a registry reusing its buffers would, before the
// next step.
func TestMemoisedBuildEqualsFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 26))
	memo := mustBuilder(t, testConfig())
	live := fleet("m", 60).Localities[0].Endpoints
	pinned := false
	for step := range 300 {
		switch op := rng.IntN(10); {
		case op < 3 && len(live) > 1: // a cell leaves
			i := rng.IntN(len(live))
			live = slices.Delete(live, i, i+1)
		case op < 5: // a cell joins
			i := 1000 + step
			live = append(live, Endpoint{CellID: fmt.Sprintf("cell-%04d", i), Host: fmt.Sprintf("10.1.%d.%d", i/256%256, i%256),
				Port: 8000, Weight: uint32(1 + rng.IntN(100)), MaxModelLen: []uint32{4096, 32768}[rng.IntN(2)]})
		case op < 8: // weights move
			for range 1 + rng.IntN(5) {
				e := &live[rng.IntN(len(live))]
				e.Weight = uint32(1 + rng.IntN(100))
				e.Degraded = rng.IntN(4) == 0
			}
		default:
			pinned = !pinned
		}
		m := Model{Name: "m", Localities: []Locality{{Weight: 100, Endpoints: slices.Clone(live)}}}
		if pinned {
			m.Pinned = []Pinned{{Set: "us", Regions: []string{"us-east"},
				Localities: []Locality{{Weight: 100, Endpoints: slices.Clone(live)}}}}
		}
		st := State{Models: []Model{m, fleet("b", 3)}}
		if rng.IntN(15) == 0 { // a duplicate address: refused, nothing kept
			bad := State{Models: []Model{{Name: "m", Localities: []Locality{{Weight: 1, Endpoints: append(slices.Clone(live), live[0])}}}}}
			bad.Models[0].Localities[0].Endpoints[len(live)].CellID = "dup"
			if _, err := memo.Build(bad); err == nil {
				t.Fatalf("step %d: a duplicate address was accepted", step)
			}
		}
		got, err := memo.Build(st)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		want, err := mustBuilder(t, testConfig()).Build(st)
		if err != nil {
			t.Fatalf("step %d: fresh builder: %v", step, err)
		}
		if kind := differs(got, want); kind != "" {
			t.Fatalf("step %d: the memoised builder's %s resources differ from a fresh builder's", step, kind)
		}
		if n, used := partsKept(memo.models["m"]); n != used {
			t.Fatalf("step %d: the endpoint memo keeps %d parts, the last build used %d", step, n, used)
		}
		// The caller reuses its buffers: nothing the Builder kept may
		// change with them.
		for _, l := range st.Models[0].Localities {
			for i := range l.Endpoints {
				l.Endpoints[i] = Endpoint{CellID: "scribbled", Host: "10.255.255.255", Port: 1, Weight: 1}
			}
		}
	}
}

// partsKept returns how many endpoint parts e and its residency sets'
// entries keep, and how many distinct ones their last builds used: after
// a build they must be equal (forgetUnused), or the memo grows with churn.
func partsKept(e *modelEntry) (kept, used int) {
	seen := map[*endpointParts]bool{}
	for _, ps := range e.pos {
		for _, p := range ps {
			seen[p] = true
		}
	}
	kept, used = len(e.parts), len(seen)
	for _, pe := range e.pins {
		k, u := partsKept(pe)
		kept, used = kept+k, used+u
	}
	return kept, used
}

// differs names the node kind ("envoy", "grpc") whose resources differ
// between a and b; "" when none does.
func differs(a, b *Resources) string {
	for _, k := range []struct {
		name string
		a, b *Set
	}{{"envoy", &a.Envoy, &b.Envoy}, {"grpc", &a.GRPC, &b.GRPC}} {
		if !sameMessages(k.a.Endpoints, k.b.Endpoints) || !sameMessages(k.a.Clusters, k.b.Clusters) ||
			!sameMessages(k.a.Routes, k.b.Routes) || !sameMessages(k.a.Listeners, k.b.Listeners) {
			return k.name
		}
	}
	return ""
}

func sameMessages[M proto.Message](a, b []M) bool {
	return slices.EqualFunc(a, b, func(x, y M) bool { return proto.Equal(x, y) })
}
