package xdsclient

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// ledsLayout is the LEDS form of EDS assignments, as regional/xds
// (leds.go newEntry) serves it: each locality names a collection
// (xdscontract.LEDSCollection), that of an earlier cluster's locality
// holding the very same LbEndpoint messages when there is one (the
// controller's shared collections), else its own; each endpoint is an
// LbEndpoint resource named xdscontract.LEDSEndpointName.
func ledsLayout(clas []*endpoint.ClusterLoadAssignment) ([]*endpoint.ClusterLoadAssignment, map[string]*endpoint.LbEndpoint) {
	lbs := make(map[string]*endpoint.LbEndpoint)
	var out []*endpoint.ClusterLoadAssignment
	type owned struct {
		coll string
		lbs  []*endpoint.LbEndpoint
	}
	var owners []owned
	for _, cla := range clas {
		o := &endpoint.ClusterLoadAssignment{ClusterName: cla.GetClusterName(), Policy: cla.GetPolicy()}
		for _, ll := range cla.GetEndpoints() {
			coll := ""
			for _, ow := range owners {
				if slices.Equal(ow.lbs, ll.GetLbEndpoints()) {
					coll = ow.coll
				}
			}
			if coll == "" {
				coll = xdscontract.LEDSCollection(cla.GetClusterName(), ll.GetLocality().GetRegion(), ll.GetLocality().GetZone())
				owners = append(owners, owned{coll, ll.GetLbEndpoints()})
				for _, lb := range ll.GetLbEndpoints() {
					sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
					lbs[xdscontract.LEDSEndpointName(coll, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))] = lb
				}
			}
			o.Endpoints = append(o.Endpoints, &endpoint.LocalityLbEndpoints{Locality: ll.GetLocality(), LoadBalancingWeight: ll.GetLoadBalancingWeight(),
				Priority: ll.GetPriority(), Metadata: ll.GetMetadata(),
				LbConfig: &endpoint.LocalityLbEndpoints_LedsClusterLocalityConfig{LedsClusterLocalityConfig: &endpoint.LedsClusterLocalityConfig{
					LedsCollectionName: coll}}})
		}
		out = append(out, o)
	}
	return out, lbs
}

// ledsBenchState is a delta state holding the controller's assignments of
// one model with n cells in one locality (the Builder's main, local and
// context-class clusters), in the LEDS layout, and the LbEndpoint names
// of cell 0 in every collection. The cells' context lengths are mixed (the
// class clusters hold different cells, so their collections are their
// own) or, uniform, all the same (every cluster names one collection).
func ledsBenchState(b *testing.B, n int, uniform bool) (*deltaState, map[string]*endpoint.LbEndpoint, []string) {
	bld, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		b.Fatal(err)
	}
	loc := xds.Locality{Weight: 1}
	for i := range n {
		loc.Endpoints = append(loc.Endpoints, xds.Endpoint{CellID: fmt.Sprint("c", i), Host: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255),
			Port: 8000, Weight: uint32(1 + i%7), MaxModelLen: []uint32{4096, 32768, 131072}[i%3]})
		if uniform {
			loc.Endpoints[i].MaxModelLen = 32768
		}
	}
	res, err := bld.Build(xds.State{Models: []xds.Model{{Name: "m", Localities: []xds.Locality{loc}}}})
	if err != nil {
		b.Fatal(err)
	}
	clas, lbs := ledsLayout(res.Envoy.Endpoints)
	st := newDeltaState()
	if _, _, err := st.apply(claResp(b, nil, clas...)); err != nil {
		b.Fatal(err)
	}
	if _, _, err := st.apply(lbResp(b, lbs)); err != nil {
		b.Fatal(err)
	}
	if !st.complete() {
		b.Fatal("incomplete")
	}
	cell0 := make(map[string]*endpoint.LbEndpoint)
	var names []string
	for n, lb := range lbs {
		if c, _ := xdscontract.EndpointMetadata(lb.GetMetadata()); c == "c0" {
			cell0[n] = lb
			names = append(names, n)
		}
	}
	b.Logf("%d assignments, %d LbEndpoints", len(clas), len(lbs))
	return st, cell0, names
}

// BenchmarkDeltaEndpointRemoved is the client's cost of one cell's death
// over delta xDS with LEDS: a response removing its LbEndpoint from every
// collection (every other op adds it back), applied and handed out, by the
// incremental view (decoded; decoded+watcher: and taken by the Watcher,
// which bench/scale times deaths with) and by the full path (reassembled
// and DecodeAssignments, what Apply gets without ApplyDecoded).
func BenchmarkDeltaEndpointRemoved(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		for _, fleet := range []string{"mixed", "uniform"} {
			for _, path := range []string{"full", "decoded", "decoded+watcher"} {
				b.Run(fmt.Sprintf("cells=%d/%s/%s", n, fleet, path), func(b *testing.B) {
					st, cell0, names := ledsBenchState(b, n, fleet == "uniform")
					resps := []*discovery.DeltaDiscoveryResponse{lbResp(b, nil, names...), lbResp(b, cell0)}
					w := &Watcher{deps: WatchDeps{Clock: clockwork.NewFakeClock()}, changed: make(chan struct{})}
					if cs, changed := st.view.handOut(); w.applyDecoded(cs, changed, "") != nil {
						b.Fatal("watcher refused")
					}
					clear(st.view.dirty)
					i := 0
					for b.Loop() {
						if _, _, err := st.apply(resps[i%2]); err != nil {
							b.Fatal(err)
						}
						i++
						if path != "full" {
							cs, changed := st.view.handOut()
							if len(cs) == 0 || path != "decoded" && w.applyDecoded(cs, changed, "") != nil {
								b.Fatal("not applied")
							}
							clear(st.view.dirty)
							continue
						}
						rs, err := st.assembled()
						if err != nil {
							b.Fatal(err)
						}
						if _, err := DecodeAssignments(rs); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
