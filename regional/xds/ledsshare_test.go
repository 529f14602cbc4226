package xds

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// servedLEDS checks what the server's LinearCache of kind holds against
// what its delta client c was given: every LbEndpoint resource is in a
// collection some assignment names, each named collection holds exactly
// the endpoints of every locality that names it (in the state-of-the-world
// snapshot: those localities hold the same endpoints), and c holds the
// same resources as the cache (nothing deleted is left behind). It
// returns the number of resources and of collections named.
func servedLEDS(c *deltaClient, s *Server, kind NodeKind) (resources, collections int, err error) {
	c.mu.Lock()
	held := make(map[string]bool, len(c.res[xdscontract.LbEndpointType]))
	for n := range c.res[xdscontract.LbEndpointType] {
		held[n] = true
	}
	clas := make(map[string]*endpoint.ClusterLoadAssignment)
	for n, a := range c.res[resource.EndpointType] {
		var cla endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			c.mu.Unlock()
			return 0, 0, err
		}
		clas[n] = &cla
	}
	c.mu.Unlock()
	sotw := sotwResources(s, kind)[resource.EndpointType]
	want := make(map[string]map[string]bool) // collection → its endpoints' names
	for n, cla := range clas {
		src, ok := sotw[n].(*endpoint.ClusterLoadAssignment)
		if !ok || len(src.GetEndpoints()) != len(cla.GetEndpoints()) {
			return 0, 0, fmt.Errorf("assignment %q: not the snapshot's", n)
		}
		for i, ll := range cla.GetEndpoints() {
			coll := ll.GetLedsClusterLocalityConfig().GetLedsCollectionName()
			names := make(map[string]bool)
			for _, lb := range src.GetEndpoints()[i].GetLbEndpoints() {
				names[lbName(coll, lb)] = true
			}
			if w, ok := want[coll]; ok && !maps.Equal(w, names) {
				return 0, 0, fmt.Errorf("collection %q is named by localities of different endpoints", coll)
			}
			want[coll] = names
		}
	}
	cached := s.ledsKinds[kindIndex(kind)].cache.GetResources()
	all := make(map[string]bool)
	for _, names := range want {
		maps.Copy(all, names)
	}
	for n := range cached {
		if !all[n] {
			return 0, 0, fmt.Errorf("the cache holds %q, in no collection an assignment names with that endpoint", n)
		}
	}
	if len(cached) != len(all) {
		return 0, 0, fmt.Errorf("the cache holds %d LbEndpoints, the named collections %d", len(cached), len(all))
	}
	if !maps.Equal(held, all) {
		return 0, 0, fmt.Errorf("the delta client holds %d LbEndpoints, the cache %d", len(held), len(all))
	}
	return len(all), len(want), nil
}

// TestLEDSSharedCollectionsThroughChurn: clusters whose locality holds the
// same endpoints at the same weights name one collection, so a uniform
// model's main, local and class clusters serve each endpoint once; through
// a random churn that makes the clusters' endpoints part and join again
// (context lengths, class weights, a remote locality, models), independent
// delta clients of each kind assemble the state-of-the-world snapshot after
// every step, and the server's cache holds exactly the named collections'
// endpoints (no deleted one is left behind).
func TestLEDSSharedCollectionsThroughChurn(t *testing.T) {
	ts := startServer(t, ledsConfig())
	m := fleet("m", 16)
	st := State{Models: []Model{m, fleet("n", 4)}}
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	conn := dial(t, ts.addr)
	clients := map[NodeKind]*deltaClient{
		KindEnvoy: newDeltaClient(t, conn, gatewayNode("share-envoy")),
		KindGRPC:  newDeltaClient(t, conn, grpcNode("share-grpc")),
	}
	check := func(step string) (resources, collections int) {
		t.Helper()
		for kind, c := range clients {
			awaitSame(t, c, ts.xds, kind, step+" ("+string(kind)+")")
			eventually.NoError(t, testTimeout, step+" ("+string(kind)+"): the served LbEndpoints", func() error {
				var err error
				r, cs, err := servedLEDS(c, ts.xds, kind)
				if kind == KindEnvoy {
					resources, collections = r, cs
				}
				return err
			})
		}
		return resources, collections
	}
	// Uniform: every cluster of a model names the model's collection.
	res, colls := check("initial")
	if res != 20 || colls != 2 {
		t.Fatalf("a uniform fleet of 16 + 4 endpoints is served as %d LbEndpoints in %d collections, want 20 in 2 (one per model)", res, colls)
	}
	rng := rand.New(rand.NewPCG(7, 26))
	next := 100
	mainEps := func() *[]Endpoint { return &st.Models[0].Localities[0].Endpoints }
	steps := []struct {
		name string
		do   func()
	}{
		{"add an endpoint", func() {
			next++
			*mainEps() = append(*mainEps(), ep(fmt.Sprint("new-", next), fmt.Sprintf("10.8.%d.%d", next/250, next%250), 8000, 3))
		}},
		{"remove an endpoint", func() {
			if eps := *mainEps(); len(eps) > 2 {
				i := rng.IntN(len(eps))
				*mainEps() = slices.Delete(slices.Clone(eps), i, i+1)
			}
		}},
		{"change a weight", func() { (*mainEps())[rng.IntN(len(*mainEps()))].Weight = uint32(1 + rng.IntN(50)) }},
		{"degrade or heal", func() { e := &(*mainEps())[rng.IntN(len(*mainEps()))]; e.Degraded = !e.Degraded }},
		{"shorten a context", func() { (*mainEps())[rng.IntN(len(*mainEps()))].MaxModelLen = 4096 }},
		{"restore every context", func() {
			for i := range *mainEps() {
				(*mainEps())[i].MaxModelLen = 32768
			}
		}},
		{"give a class weight", func() { (*mainEps())[rng.IntN(len(*mainEps()))].ClassWeight = uint32(1 + rng.IntN(9)) }},
		{"clear the class weights", func() {
			for i := range *mainEps() {
				(*mainEps())[i].ClassWeight = 0
			}
		}},
		{"add or remove the remote locality", func() {
			if ls := st.Models[0].Localities; len(ls) > 1 {
				st.Models[0].Localities = ls[:1]
				return
			}
			st.Models[0].Localities = append(st.Models[0].Localities, Locality{Region: "eu-west", Zone: "eu-west-1a", Weight: 10, Priority: 1,
				RTT: 80 * time.Millisecond, Endpoints: []Endpoint{ep("eu-1", "192.0.2.1", 443, 5), ep("eu-2", "192.0.2.2", 443, 5)}})
		}},
		{"add or remove a model", func() {
			if len(st.Models) > 1 {
				st.Models = st.Models[:1]
				return
			}
			st.Models = append(st.Models, fleet("n", 1+rng.IntN(6)))
		}},
	}
	for i := range 80 {
		s := steps[rng.IntN(len(steps))]
		// Each Push gets its own copy: the Server must not depend on the
		// caller's slices staying as they were.
		st.Models[0].Localities[0].Endpoints = slices.Clone(*mainEps())
		s.do()
		if _, err := ts.xds.Push(st); err != nil {
			t.Fatalf("step %d, %s: %v", i, s.name, err)
		}
		check(fmt.Sprintf("step %d, %s", i, s.name))
	}
	// Back to uniform: what was shared before and parted since stays
	// apart (a collection's owner keeps it), and is still served right.
	for i := range *mainEps() {
		(*mainEps())[i].MaxModelLen, (*mainEps())[i].ClassWeight = 32768, 0
	}
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	check("uniform again")
}

// TestLEDSOneLocalityAtTwoPriorities: a model may list one region and zone
// at two priorities (the State allows it); their collections must not be
// one, or each locality would be filled with the other's endpoints too.
func TestLEDSOneLocalityAtTwoPriorities(t *testing.T) {
	ts := startServer(t, ledsConfig())
	m := Model{Name: "m", Localities: []Locality{
		{Region: "eu-west", Zone: "eu-west-1a", Weight: 10, Priority: 1, RTT: 80 * time.Millisecond,
			Endpoints: []Endpoint{ep("eu-1", "192.0.2.1", 443, 5)}},
		{Region: "eu-west", Zone: "eu-west-1a", Weight: 10, Priority: 2, RTT: 80 * time.Millisecond,
			Endpoints: []Endpoint{ep("eu-2", "192.0.2.2", 443, 5)}},
		local(ep("c1", "10.0.0.1", 8000, 1)),
	}}
	st := State{Models: []Model{m}}
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	conn := dial(t, ts.addr)
	c := newDeltaClient(t, conn, gatewayNode("two-priorities"))
	awaitSame(t, c, ts.xds, KindEnvoy, "initial")
	eventually.NoError(t, testTimeout, "the served LbEndpoints", func() error {
		_, _, err := servedLEDS(c, ts.xds, KindEnvoy)
		return err
	})
	st.Models[0].Localities[1].Endpoints = append(st.Models[0].Localities[1].Endpoints, ep("eu-3", "192.0.2.3", 443, 5))
	if _, err := ts.xds.Push(st); err != nil {
		t.Fatal(err)
	}
	awaitSame(t, c, ts.xds, KindEnvoy, "an endpoint added at the second priority")
}
