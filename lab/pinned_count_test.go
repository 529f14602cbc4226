package lab

import (
	"maps"
	"slices"
	"testing"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// TestPinnedEndpointsCountsThePinnedClusterOnly: a residency set's class
// clusters (xdscontract.PinnedClassClusterName) carry the set's residency
// metadata too; the per-set count is the plain pinned cluster's, never
// theirs, nor another set's or the unpinned clusters'.
func TestPinnedEndpointsCountsThePinnedClusterOnly(t *testing.T) {
	eps := func(n int) []xdsclient.Endpoint {
		out := make([]xdsclient.Endpoint, n)
		for i := range out {
			out[i].Region = []string{"eu-west", "eu-central"}[i%2]
		}
		return out
	}
	pinned := func(set string) xdsclient.ClusterPolicy {
		return xdsclient.ClusterPolicy{Residency: set, AllowedRegions: []string{"eu-west"}}
	}
	tab := &xdsclient.Table{Clusters: map[string]xdsclient.ClusterView{
		xdscontract.ClusterName("m"):                            {Endpoints: eps(5)},
		xdscontract.ClassClusterName("m", 8192):                 {Endpoints: eps(4)},
		xdscontract.PinnedClusterName("m", "eu"):                {Policy: pinned("eu"), Endpoints: eps(2)},
		xdscontract.PinnedClassClusterName("m", "eu", 1024):     {Policy: pinned("eu"), Endpoints: eps(2)},
		xdscontract.PinnedClassClusterName("m", "eu", 8192):     {Policy: pinned("eu"), Endpoints: eps(1)},
		xdscontract.PinnedClassClusterName("m", "eu", 131072):   {Policy: pinned("eu")},
		xdscontract.PinnedClusterName("m", "none"):              {Policy: pinned("none")},
		xdscontract.PinnedClusterName("other", "eu"):            {Policy: pinned("eu"), Endpoints: eps(9)},
		xdscontract.PinnedClassClusterName("other", "eu", 4096): {Policy: pinned("eu"), Endpoints: eps(9)},
	}}
	got, regions := pinnedEndpoints(tab, "m")
	if want := map[string]int{"eu": 2, "none": 0}; !maps.Equal(got, want) {
		t.Errorf("pinnedEndpoints = %v, want %v", got, want)
	}
	if len(regions) != 2 || !slices.Equal(regions["eu"], []string{"eu-central", "eu-west"}) || len(regions["none"]) != 0 {
		t.Errorf("pinned regions = %v, want eu: [eu-central eu-west], none: []", regions)
	}
}
