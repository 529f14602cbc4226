package xdsclient

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// lbEp is an LbEndpoint at 10.0.0.i:8000 of cell c, with weight w,
// health h and an RTT metadata value rtt (0: none).
func lbEp(i int, c string, w uint32, h core.HealthStatus, rtt float64) *endpoint.LbEndpoint {
	f := map[string]any{xdscontract.MetadataCell: c, xdscontract.MetadataMaxModelLen: 4096}
	if rtt > 0 {
		f[xdscontract.MetadataRTT] = rtt
	}
	md, err := structpb.NewStruct(f)
	if err != nil {
		panic(err)
	}
	return &endpoint.LbEndpoint{HealthStatus: h, LoadBalancingWeight: wrapperspb.UInt32(w),
		Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: md}},
		HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{
			Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250),
				PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8000}}}}}}}
}

// ledsCLA is cluster name's assignment with one LEDS locality per zone
// (priority: its index, reversed for odd clusters so the sort matters).
func ledsCLA(name string, zones ...string) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	for i, z := range zones {
		md, _ := structpb.NewStruct(map[string]any{xdscontract.MetadataRTT: float64(10 * (i + 1))})
		cla.Endpoints = append(cla.Endpoints, &endpoint.LocalityLbEndpoints{
			Locality: &core.Locality{Region: "r1", Zone: z}, LoadBalancingWeight: wrapperspb.UInt32(uint32(i + 1)),
			Priority: uint32(len(zones) - 1 - i),
			Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: md}},
			LbConfig: &endpoint.LocalityLbEndpoints_LedsClusterLocalityConfig{LedsClusterLocalityConfig: &endpoint.LedsClusterLocalityConfig{
				LedsCollectionName: xdscontract.LEDSCollection(name, "r1", z)}},
		})
	}
	return cla
}

func epName(cluster, zone string, i int) string {
	return xdscontract.LEDSEndpointName(xdscontract.LEDSCollection(cluster, "r1", zone), fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250))
}

func packAny(t testing.TB, m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func claResp(t testing.TB, removed []string, clas ...*endpoint.ClusterLoadAssignment) *discovery.DeltaDiscoveryResponse {
	r := &discovery.DeltaDiscoveryResponse{TypeUrl: resource.EndpointType, RemovedResources: removed}
	for _, c := range clas {
		r.Resources = append(r.Resources, &discovery.Resource{Name: c.GetClusterName(), Resource: packAny(t, c)})
	}
	return r
}

func lbResp(t testing.TB, added map[string]*endpoint.LbEndpoint, removed ...string) *discovery.DeltaDiscoveryResponse {
	r := &discovery.DeltaDiscoveryResponse{TypeUrl: xdscontract.LbEndpointType, RemovedResources: removed}
	for _, n := range sortedKeys(added) {
		r.Resources = append(r.Resources, &discovery.Resource{Name: n, Resource: packAny(t, added[n])})
	}
	return r
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// checkView: the decoded view equals DecodeAssignments of the assembled
// assignments (the full path), and changed covers every cluster whose
// list differs from the last hand-out.
func checkView(t *testing.T, step string, st *deltaState, last map[string][]Endpoint) map[string][]Endpoint {
	t.Helper()
	rs, err := st.assembled()
	if err != nil {
		t.Fatalf("%s: assembled: %v", step, err)
	}
	want, err := DecodeAssignments(rs)
	if err != nil {
		t.Fatalf("%s: the full path refuses the state: %v", step, err)
	}
	got, changed := st.view.handOut()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: incremental view differs from the full path:\n got %v\nwant %v", step, got, want)
	}
	for n, eps := range got {
		if !reflect.DeepEqual(eps, last[n]) || last[n] == nil && eps != nil {
			found := false
			for _, c := range changed {
				found = found || c == n
			}
			if !found {
				t.Fatalf("%s: cluster %q changed but not named in %v", step, n, changed)
			}
		}
	}
	clear(st.view.dirty)
	return got
}

// TestDeltaViewMatchesFullPath: over a churn of LEDS resources, the
// incremental view is after every step what DecodeAssignments makes of the
// assembled assignments; refused responses change nothing.
func TestDeltaViewMatchesFullPath(t *testing.T) {
	st := newDeltaState()
	apply := func(step string, r *discovery.DeltaDiscoveryResponse) { t.Helper(); mustApply(t, st, step, r) }
	healthy := core.HealthStatus_HEALTHY
	initial := map[string]*endpoint.LbEndpoint{}
	for i := range 6 {
		initial[epName("isobar/a", "z1", i)] = lbEp(i, fmt.Sprint("a", i), uint32(i+1), healthy, 0)
		initial[epName("isobar/a", "z2", 100+i)] = lbEp(100+i, fmt.Sprint("b", i), 1, healthy, 5)
		initial[epName("isobar/b", "z1", i)] = lbEp(i, fmt.Sprint("a", i), 2, healthy, 0)
	}
	apply("assignments", claResp(t, nil, ledsCLA("isobar/a", "z1", "z2"), ledsCLA("isobar/b", "z1")))
	apply("endpoints", lbResp(t, initial))
	last := checkView(t, "initial", st, nil)
	steps := []struct {
		name string
		resp *discovery.DeltaDiscoveryResponse
	}{
		{"add", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 50): lbEp(50, "n", 3, healthy, 0)})},
		{"remove", lbResp(t, nil, epName("isobar/a", "z1", 2), epName("isobar/b", "z1", 0))},
		{"weight", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 1): lbEp(1, "a1", 9, healthy, 0)})},
		{"unhealthy", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 3): lbEp(3, "a3", 4, core.HealthStatus_UNHEALTHY, 0)})},
		{"degraded", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 3): lbEp(3, "a3", 4, core.HealthStatus_DEGRADED, 0)})},
		{"draining", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/b", "z1", 4): lbEp(4, "a4", 2, core.HealthStatus_DRAINING, 0)})},
		{"metadata", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z2", 101): lbEp(101, "b1x", 1, healthy, 7)})},
		{"re-sent unchanged", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 0): lbEp(0, "a0", 1, healthy, 0)})},
		{"added and removed at once", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/b", "z1", 60): lbEp(60, "x", 1, healthy, 0)},
			epName("isobar/b", "z1", 60), epName("isobar/b", "z1", 1))},
		{"remove unknown", lbResp(t, nil, epName("isobar/b", "z1", 99))},
		{"locality moves", claResp(t, nil, ledsCLA("isobar/a", "z2", "z1"))},
		{"locality added", claResp(t, nil, ledsCLA("isobar/b", "z1", "z3"))},
		{"its endpoints", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/b", "z3", 7): lbEp(7, "z3", 1, healthy, 0)})},
		{"collection removed", claResp(t, nil, ledsCLA("isobar/a", "z1"))},
		{"cluster removed", claResp(t, []string{"isobar/b"})},
		{"cluster back", claResp(t, nil, ledsCLA("isobar/b", "z1"))},
		{"its endpoints back", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/b", "z1", 8): lbEp(8, "b8", 1, healthy, 0)})},
	}
	for _, s := range steps {
		apply(s.name, s.resp)
		last = checkView(t, s.name, st, last)
	}
}

// TestDeltaViewRefusesWithoutChange: a response with a bad LbEndpoint, a
// name outside isobar's collections or a bad assignment is refused, and
// nothing held changes.
func TestDeltaViewRefusesWithoutChange(t *testing.T) {
	st := newDeltaState()
	if _, _, err := st.apply(claResp(t, nil, ledsCLA("isobar/a", "z1"))); err != nil {
		t.Fatal(err)
	}
	good := lbEp(1, "a1", 1, core.HealthStatus_HEALTHY, 0)
	if _, _, err := st.apply(lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 1): good})); err != nil {
		t.Fatal(err)
	}
	before, _ := st.view.handOut()
	lbsBefore, clasBefore := maps.Clone(st.lbs), maps.Clone(st.clas)
	badAddr := lbEp(2, "a2", 1, core.HealthStatus_HEALTHY, 0)
	badAddr.GetEndpoint().GetAddress().GetSocketAddress().Address = "not-an-ip"
	badWeight := lbEp(3, "a3", 0, core.HealthStatus_HEALTHY, 0) // load_balancing_weight 0: PGV refuses
	badCLA := ledsCLA("isobar/a", "z1")
	badCLA.Endpoints[0].Priority = 1000 // PGV: priority ≤ 128
	wrongName := claResp(t, nil, ledsCLA("isobar/a", "z2"))
	wrongName.Resources[0].Name = "isobar/other"
	for name, r := range map[string]*discovery.DeltaDiscoveryResponse{
		"bad address": lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 9): good, epName("isobar/a", "z1", 2): badAddr},
			epName("isobar/a", "z1", 1)),
		"bad weight":         lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/a", "z1", 3): badWeight}, epName("isobar/a", "z1", 1)),
		"unknown collection": lbResp(t, map[string]*endpoint.LbEndpoint{"xdstp://other/x/1": good}, epName("isobar/a", "z1", 1)),
		"bad assignment":     claResp(t, nil, badCLA),
		"name mismatch":      wrongName,
		"unrequested type":   {TypeUrl: resource.ClusterType},
	} {
		_, _, err := st.apply(r)
		if !errors.Is(err, ErrInvalidResource) {
			t.Errorf("%s: err %v, want ErrInvalidResource", name, err)
		}
		after, _ := st.view.handOut()
		if !reflect.DeepEqual(after, before) || !maps.Equal(st.lbs, lbsBefore) || !maps.Equal(st.clas, clasBefore) {
			t.Errorf("%s: the refused response changed the held state: %v, want %v", name, after, before)
		}
	}
}

// FuzzDeltaLbEndpoint: whatever bytes an LbEndpoint resource holds, and
// whichever names a response adds and removes, applying it does not
// panic; an accepted response leaves the view equal to the full path's
// decode of the assembled assignments (which accepts it too), and a
// refused one changes nothing.
func FuzzDeltaLbEndpoint(f *testing.F) {
	seed, err := proto.Marshal(lbEp(3, "a3", 4, core.HealthStatus_DEGRADED, 2))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed, uint8(3), uint8(1), false)
	f.Add([]byte{0x0a, 0x00}, uint8(0), uint8(0), true)
	f.Fuzz(func(t *testing.T, value []byte, add, remove uint8, other bool) {
		st := newDeltaState()
		if _, _, err := st.apply(claResp(t, nil, ledsCLA("isobar/a", "z1", "z2"), ledsCLA("isobar/b", "z1"))); err != nil {
			t.Fatal(err)
		}
		initial := map[string]*endpoint.LbEndpoint{}
		for i := range 4 {
			initial[epName("isobar/a", "z1", i)] = lbEp(i, fmt.Sprint("a", i), uint32(i+1), core.HealthStatus_HEALTHY, 0)
			initial[epName("isobar/a", "z2", i)] = lbEp(i, fmt.Sprint("b", i), 1, core.HealthStatus_HEALTHY, 1)
			initial[epName("isobar/b", "z1", i)] = lbEp(i, fmt.Sprint("c", i), 2, core.HealthStatus_HEALTHY, 0)
		}
		if _, _, err := st.apply(lbResp(t, initial)); err != nil {
			t.Fatal(err)
		}
		last := checkView(t, "initial", st, nil)
		lbsBefore := maps.Clone(st.lbs)
		zone := "z1"
		if other {
			zone = "z2"
		}
		r := &discovery.DeltaDiscoveryResponse{TypeUrl: xdscontract.LbEndpointType,
			Resources: []*discovery.Resource{{Name: epName("isobar/a", zone, int(add%8)),
				Resource: &anypb.Any{TypeUrl: xdscontract.LbEndpointType, Value: value}}},
			RemovedResources: []string{epName("isobar/b", "z1", int(remove%8))}}
		if _, _, err := st.apply(r); err != nil {
			if after, _ := st.view.handOut(); !reflect.DeepEqual(after, last) || !maps.Equal(st.lbs, lbsBefore) {
				t.Fatalf("refused (%v) but the held state changed", err)
			}
			return
		}
		checkView(t, "fuzzed", st, last)
	})
}

// sharedLoc is a LEDS locality of zone z naming cluster owner's
// collection, at priority p with locality weight w and RTT metadata rtt.
type sharedLoc struct {
	z, owner string
	p, w     uint32
	rtt      float64
}

// sharedCLA is cluster name's assignment of localities locs.
func sharedCLA(name string, locs ...sharedLoc) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	for _, l := range locs {
		md, _ := structpb.NewStruct(map[string]any{xdscontract.MetadataRTT: l.rtt})
		cla.Endpoints = append(cla.Endpoints, &endpoint.LocalityLbEndpoints{
			Locality: &core.Locality{Region: "r1", Zone: l.z}, LoadBalancingWeight: wrapperspb.UInt32(l.w), Priority: l.p,
			Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: md}},
			LbConfig: &endpoint.LocalityLbEndpoints_LedsClusterLocalityConfig{LedsClusterLocalityConfig: &endpoint.LedsClusterLocalityConfig{
				LedsCollectionName: xdscontract.LEDSCollection(l.owner, "r1", l.z)}},
		})
	}
	return cla
}

// mustApply applies r to st, failing the test (at step) when it is refused.
func mustApply(t *testing.T, st *deltaState, step string, r *discovery.DeltaDiscoveryResponse) {
	t.Helper()
	if _, _, err := st.apply(r); err != nil {
		t.Fatalf("%s: %v", step, err)
	}
}

// deepLists copies every list of a hand-out.
func deepLists(m map[string][]Endpoint) map[string][]Endpoint {
	out := make(map[string][]Endpoint, len(m))
	for n, eps := range m {
		out[n] = slices.Clone(eps)
	}
	return out
}

// TestDeltaViewSharedCollections: when several clusters name one
// collection (the controller's shared LEDS collections), the localities
// that decode alike are one segment, and through a churn of endpoints and
// assignments the view is after every step what the full path decodes;
// no list handed out is changed afterwards (the consumers' contract), so
// a segment's list handed out whole is copied before it changes.
func TestDeltaViewSharedCollections(t *testing.T) {
	st := newDeltaState()
	apply := func(step string, r *discovery.DeltaDiscoveryResponse) { t.Helper(); mustApply(t, st, step, r) }
	main := sharedLoc{z: "z1", owner: "isobar/m", p: 0, w: 5, rtt: 1}
	remote := sharedLoc{z: "z2", owner: "isobar/m", p: 1, w: 2, rtt: 30}
	clas := func() []*endpoint.ClusterLoadAssignment {
		other := main
		other.w = 9 // the same collection, another locality weight: decoded apart
		return []*endpoint.ClusterLoadAssignment{
			sharedCLA("isobar/m", main, remote),
			sharedCLA("isobar/m/local", main),
			sharedCLA("isobar/m/ctx-1", main, remote),
			sharedCLA("isobar/m/ctx-2", other),
		}
	}
	apply("assignments", claResp(t, nil, clas()...))
	healthy := core.HealthStatus_HEALTHY
	name := func(z string, i int) string { return epName("isobar/m", z, i) }
	initial := map[string]*endpoint.LbEndpoint{}
	for i := range 8 {
		initial[name("z1", i)] = lbEp(i, fmt.Sprint("c", i), uint32(i+1), healthy, 0)
	}
	initial[name("z2", 100)] = lbEp(100, "r0", 1, healthy, 0)
	apply("endpoints", lbResp(t, initial))
	coll := xdscontract.LEDSCollection("isobar/m", "r1", "z1")
	if segs := st.view.users[coll]; len(segs) != 2 {
		t.Fatalf("collection %s fills %d segments, want 2 (three clusters' alike, one apart)", coll, len(segs))
	}
	if a, b := st.view.clusters["isobar/m"].segs[0], st.view.clusters["isobar/m/local"].segs[0]; a != b {
		t.Fatal("the main and local clusters' alike localities are two segments")
	}
	last := checkView(t, "initial", st, nil)
	type handed struct {
		step       string
		got, saved map[string][]Endpoint
	}
	outs := []handed{{"initial", last, deepLists(last)}}
	steps := []struct {
		name string
		resp *discovery.DeltaDiscoveryResponse
	}{
		{"add", lbResp(t, map[string]*endpoint.LbEndpoint{name("z1", 50): lbEp(50, "n", 3, healthy, 0)})},
		{"remove", lbResp(t, nil, name("z1", 2))},
		{"weight", lbResp(t, map[string]*endpoint.LbEndpoint{name("z1", 1): lbEp(1, "c1", 9, healthy, 0)})},
		{"unhealthy", lbResp(t, map[string]*endpoint.LbEndpoint{name("z1", 3): lbEp(3, "c3", 4, core.HealthStatus_UNHEALTHY, 0)})},
		{"back", lbResp(t, map[string]*endpoint.LbEndpoint{name("z1", 3): lbEp(3, "c3", 4, healthy, 0)})},
		{"remote added", lbResp(t, map[string]*endpoint.LbEndpoint{name("z2", 101): lbEp(101, "r1", 1, healthy, 0)})},
		{"added and removed at once", lbResp(t, map[string]*endpoint.LbEndpoint{name("z1", 60): lbEp(60, "x", 1, healthy, 0)},
			name("z1", 60), name("z1", 0))},
		{"the local cluster takes its own collection", claResp(t, nil, sharedCLA("isobar/m/local", sharedLoc{z: "z1", owner: "isobar/m/local", w: 5, rtt: 1}))},
		{"its endpoints", lbResp(t, map[string]*endpoint.LbEndpoint{epName("isobar/m/local", "z1", 1): lbEp(1, "c1", 9, healthy, 0)})},
		{"the owner goes", claResp(t, []string{"isobar/m"})},
		{"a change the others share", lbResp(t, nil, name("z1", 4))},
		{"all share again", claResp(t, nil, clas()...)},
		{"one more", lbResp(t, map[string]*endpoint.LbEndpoint{name("z1", 70): lbEp(70, "y", 2, healthy, 0)})},
	}
	for _, s := range steps {
		apply(s.name, s.resp)
		last = checkView(t, s.name, st, last)
		outs = append(outs, handed{s.name, last, deepLists(last)})
		for _, h := range outs {
			if !reflect.DeepEqual(deepLists(h.got), h.saved) {
				t.Fatalf("after %s: a list handed out at %s changed in place", s.name, h.step)
			}
		}
	}
}
