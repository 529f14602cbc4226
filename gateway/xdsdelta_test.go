package gateway

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// byAddress returns the table's clusters with their endpoints in address
// order (a delta gateway assembles LEDS collections in name order).
func byAddress(tb *xdsclient.Table) map[string]xdsclient.ClusterView {
	out := make(map[string]xdsclient.ClusterView, len(tb.Clusters))
	for n, c := range tb.Clusters {
		c.Endpoints = slices.Clone(c.Endpoints)
		slices.SortFunc(c.Endpoints, func(a, b xdsclient.Endpoint) int { return strings.Compare(a.Address, b.Address) })
		out[n] = c
	}
	return out
}

// TestGatewayOverDeltaXDSMatchesStateOfTheWorld: a gateway run with
// XDSDelta (--xds-delta) against a controller serving LEDS (--xds-leds)
// holds the same clusters and endpoints as a state-of-the-world gateway,
// initially and after single-endpoint changes.
func TestGatewayOverDeltaXDSMatchesStateOfTheWorld(t *testing.T) {
	eps := []xds.Endpoint{
		endpointOf(t, "a", "127.0.0.1:9001", 10, 8192),
		endpointOf(t, "b", "127.0.0.1:9002", 20, 32768),
	}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{LEDS: true}, oneModel("m", eps...))
	sotw := startGateway(t, ctrl, Config{NodeID: "gw-sotw"}, Deps{})
	delta := startGateway(t, ctrl, Config{NodeID: "gw-delta", XDSDelta: true}, Deps{})
	for i, st := range []xds.State{
		oneModel("m", eps...),
		oneModel("m", eps[0], endpointOf(t, "b", "127.0.0.1:9002", 5, 32768)),                                       // weight
		oneModel("m", eps[0], eps[1], endpointOf(t, "c", "127.0.0.1:9003", 7, 4096)),                                // added
		oneModel("m", endpointOf(t, "c", "127.0.0.1:9003", 7, 4096)),                                                // removed
		oneModel("m", endpointOf(t, "c", "127.0.0.1:9003", 7, 4096), endpointOf(t, "d", "127.0.0.1:9004", 1, 8192)), // added
		// One context length: every cluster of the model names one LEDS
		// collection (regional/xds shared collections).
		oneModel("m", endpointOf(t, "d", "127.0.0.1:9004", 1, 8192), endpointOf(t, "e", "127.0.0.1:9005", 3, 8192),
			endpointOf(t, "f", "127.0.0.1:9006", 2, 8192)),
		oneModel("m", endpointOf(t, "d", "127.0.0.1:9004", 1, 8192), endpointOf(t, "f", "127.0.0.1:9006", 4, 8192)), // one goes, a weight
	} {
		if i > 0 {
			ctrl.push(st)
		}
		want := byAddress(sotw.waitTable(t, "the SotW table", func(tb *xdsclient.Table) bool {
			n := 0
			for _, l := range st.Models[0].Localities {
				n += len(l.Endpoints)
			}
			return len(tb.Clusters[xdscontract.ClusterName("m")].Endpoints) == n
		}))
		delta.waitTable(t, "the delta table to match the SotW one", func(tb *xdsclient.Table) bool {
			return reflect.DeepEqual(byAddress(tb), want)
		})
	}
	// The delta gateway's endpoints came over delta: its state-of-the-world
	// streams carry clusters and routes only.
	clusters := false
	for _, st := range ctrl.xds.Streams() {
		if st.NodeID != "gw-delta" {
			continue
		}
		if _, ok := st.Types[resource.EndpointType]; ok {
			t.Fatal("the delta gateway has a state-of-the-world endpoint stream")
		}
		_, c := st.Types[resource.ClusterType]
		clusters = clusters || c
	}
	if !clusters {
		t.Fatal("the delta gateway has no state-of-the-world cluster stream")
	}
}
