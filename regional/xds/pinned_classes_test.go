package xds

import (
	"slices"
	"strconv"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// protoEqualMetadata reports whether c carries pinned's cluster metadata
// (the residency set and its allowed regions), and some.
func protoEqualMetadata(c, pinned *cluster.Cluster) bool {
	return c.GetMetadata() != nil && proto.Equal(c.GetMetadata(), pinned.GetMetadata())
}

// drillState is the residency drill's shape: model m served locally by
// cell a, and residency set "eu" pinned to eu-west, whose locality holds a
// short engine (max_model_len 1024) and a long one (32768). The set sheds
// 10 % of its standard requests.
func drillState() State {
	return State{Models: []Model{{Name: "m",
		Localities: []Locality{local(Endpoint{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 1, MaxModelLen: 32768})},
		Pinned: []Pinned{{Set: "eu", Regions: []string{"eu-west"}, Shed: 0.1, Localities: []Locality{
			{Region: "eu-west", Zone: "eu-west", Weight: 1, Endpoints: []Endpoint{
				{CellID: "eu-short", Host: "10.8.0.1", Port: 8000, Weight: 1, MaxModelLen: 1024},
				{CellID: "eu-long", Host: "10.8.0.2", Port: 8000, Weight: 1, MaxModelLen: 32768},
			}},
		}}},
	}}}
}

// pinnedHeaders are a client request of model m pinned to set with a
// prompt of tokens (in PromptTokensHeader, or as content-length when
// bytes).
func pinnedHeaders(set string, tokens int, bytes bool) map[string]string {
	h := map[string]string{xdscontract.DefaultModelHeader: "m", xdscontract.ResidencyHeader: set}
	if bytes {
		h["content-length"] = strconv.Itoa(tokens * xdscontract.BytesPerToken)
	} else {
		h[xdscontract.PromptTokensHeader] = strconv.Itoa(tokens)
	}
	return h
}

func TestPinnedClassClusters(t *testing.T) {
	b := mustBuilder(t, testConfig())
	res, err := b.Build(drillState())
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	checkSet(t, KindGRPC, &res.GRPC)
	pin := xdscontract.PinnedClusterName("m", "eu")
	want := map[string][]string{
		pin: {"eu-long", "eu-short"},
		xdscontract.PinnedClassClusterName("m", "eu", 1024):   {"eu-long", "eu-short"},
		xdscontract.PinnedClassClusterName("m", "eu", 4096):   {"eu-long"},
		xdscontract.PinnedClassClusterName("m", "eu", 8192):   {"eu-long"},
		xdscontract.PinnedClassClusterName("m", "eu", 32768):  {"eu-long"},
		xdscontract.PinnedClassClusterName("m", "eu", 131072): nil, // nothing fits: left out
	}
	pinned := clusterByName(&res.Envoy, pin)
	for name, cells := range want {
		c, cla := clusterByName(&res.Envoy, name), claByName(&res.Envoy, name)
		if cells == nil {
			if c != nil || cla != nil {
				t.Errorf("%s present, want it left out", name)
			}
			continue
		}
		if c == nil || cla == nil {
			t.Fatalf("%s missing", name)
		}
		if got := cellsOf(cla); !slices.Equal(got, cells) {
			t.Errorf("%s holds %v, want %v", name, got, cells)
		}
		// The pinned cluster's settings and residency metadata, under the
		// class cluster's own names.
		if c.GetEdsClusterConfig().GetServiceName() != name {
			t.Errorf("%s: EDS service name %q", name, c.GetEdsClusterConfig().GetServiceName())
		}
		if name != pin {
			if want := "isobar_m_pin_eu_ctx_" + name[len(pin)+len("/ctx-"):]; c.GetAltStatName() != want {
				t.Errorf("%s: alt_stat_name %q, want %q", name, c.GetAltStatName(), want)
			}
		}
		if !protoEqualMetadata(c, pinned) {
			t.Errorf("%s: metadata %v, want the pinned cluster's %v", name, c.GetMetadata(), pinned.GetMetadata())
		}
		if pct, minConc := budgetOf(c); pct != 20 || minConc != 3 {
			t.Errorf("%s: retry budget %v%% min %d", name, pct, minConc)
		}
	}
	// The unpinned model's own classes are untouched by the set's 1024.
	if clusterByName(&res.Envoy, xdscontract.ClassClusterName("m", 1024)) != nil {
		t.Error("the set's declared class leaked into the model's unpinned classes")
	}
	for _, c := range res.GRPC.Clusters {
		if c.GetName() != xdscontract.ClusterName("m") {
			t.Errorf("the gRPC set holds %s", c.GetName())
		}
	}
}

// The drill's failure: a 6,000-token prompt pinned to eu must not be able
// to reach the 1,024-token engine. By token header and by content-length,
// a pinned prompt goes to the set's smallest class that holds it, with the
// set's 503 shed; a prompt above every class, or of no size, to the plain
// pinned cluster.
func TestPinnedLongPromptAvoidsShortEngine(t *testing.T) {
	res, err := mustBuilder(t, testConfig()).Build(drillState())
	if err != nil {
		t.Fatal(err)
	}
	rc := res.Envoy.Routes[0]
	class := func(n uint32) string { return xdscontract.PinnedClassClusterName("m", "eu", n) }
	for _, tc := range []struct {
		tokens int
		want   string
	}{{500, class(1024)}, {1024, class(1024)}, {1025, class(4096)}, {6000, class(8192)}, {20000, class(32768)},
		{200000, xdscontract.PinnedClusterName("m", "eu")}} {
		for _, bytes := range []bool{false, true} {
			h := pinnedHeaders("eu", tc.tokens, bytes)
			r := matchRoute(t, rc, h)
			if r == nil {
				t.Fatalf("%v: no route", h)
			}
			if got := r.GetRoute().GetCluster(); got != tc.want {
				t.Errorf("%v: route %s to %s, want %s", h, r.GetName(), got, tc.want)
			}
			if v, ok := headerValue(r, xdscontract.ResidencyHeader); !ok || v != "eu" {
				t.Errorf("%v: route %s does not require the set", h, r.GetName())
			}
			if ppm, status, ok := abortOf(t, r); !ok || ppm != 100000 || status != 503 {
				t.Errorf("%v: route %s aborts %d per million with %d, want the set's 100000 with 503", h, r.GetName(), ppm, status)
			}
			cells := cellsOf(claByName(&res.Envoy, r.GetRoute().GetCluster()))
			if tc.tokens > 1024 && tc.tokens <= 32768 && slices.Contains(cells, "eu-short") {
				t.Errorf("%v: a %d-token prompt may reach eu-short (max_model_len 1024): cluster %s holds %v",
					h, tc.tokens, r.GetRoute().GetCluster(), cells)
			}
		}
	}
	// No size at all: the plain pinned route.
	r := matchRoute(t, rc, map[string]string{xdscontract.DefaultModelHeader: "m", xdscontract.ResidencyHeader: "eu"})
	if r.GetRoute().GetCluster() != xdscontract.PinnedClusterName("m", "eu") {
		t.Errorf("a pinned request of no size goes to %s", r.GetRoute().GetCluster())
	}
	// A set the model does not list still matches nothing, long or short.
	if r := matchRoute(t, rc, pinnedHeaders("ap", 6000, false)); r != nil {
		t.Errorf("residency ap: route %s, want none", r.GetName())
	}
	// Unpinned traffic never reaches a pinned class route.
	h := pinnedHeaders("eu", 6000, false)
	delete(h, xdscontract.ResidencyHeader)
	if r := matchRoute(t, rc, h); r.GetRoute().GetCluster() != xdscontract.ClassClusterName("m", 8192) {
		t.Errorf("unpinned 6000 tokens: %s", r.GetRoute().GetCluster())
	}
}

// Make-before-break: the set's class clusters stay while their classes
// do, after the endpoints that fitted them left, so a data plane applying
// CDS before RDS never holds a route naming a missing cluster; the routes
// stop naming them at once. They go with the set.
func TestPinnedClassClustersOutliveTheirEndpoints(t *testing.T) {
	b := mustBuilder(t, testConfig())
	first, err := b.Build(drillState())
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, r := range first.Envoy.Routes[0].GetVirtualHosts()[0].GetRoutes() {
		named[r.GetRoute().GetCluster()] = true
	}
	if !named[xdscontract.PinnedClassClusterName("m", "eu", 8192)] {
		t.Fatal("no route names the set's class 8192")
	}
	// The long engine leaves: only the short one is pinned.
	st := drillState()
	eps := &st.Models[0].Pinned[0].Localities[0].Endpoints
	*eps = (*eps)[:1]
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	for c := range named {
		if clusterByName(&res.Envoy, c) == nil || claByName(&res.Envoy, c) == nil {
			t.Errorf("cluster %s, named by the previous routes, is gone", c)
		}
	}
	if cells := cellsOf(claByName(&res.Envoy, xdscontract.PinnedClassClusterName("m", "eu", 8192))); len(cells) != 0 {
		t.Errorf("pinned class 8192 holds %v, want it empty", cells)
	}
	for _, r := range res.Envoy.Routes[0].GetVirtualHosts()[0].GetRoutes() {
		if c := r.GetRoute().GetCluster(); len(claByName(&res.Envoy, c).GetEndpoints()) == 0 {
			t.Errorf("route %s names the empty cluster %s", r.GetName(), c)
		}
	}
	r := matchRoute(t, res.Envoy.Routes[0], pinnedHeaders("eu", 6000, false))
	if got := r.GetRoute().GetCluster(); got != xdscontract.PinnedClusterName("m", "eu") {
		t.Errorf("6000 tokens with no class of the set holding them: %s, want the plain pinned cluster", got)
	}
	// The set goes: its class clusters go with it.
	st.Models[0].Pinned = nil
	gone, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &gone.Envoy)
	for _, c := range gone.Envoy.Clusters {
		if c.GetMetadata() != nil {
			t.Errorf("cluster %s of a dropped set is still served", c.GetName())
		}
	}
}

// Memoisation: an unchanged build returns the same pointers; a change
// elsewhere leaves the set's class resources alone; a change of the set's
// allowed regions rebuilds its clusters (metadata) but not its assignments.
func TestPinnedClassClustersAreMemoised(t *testing.T) {
	b := mustBuilder(t, testConfig())
	first, err := b.Build(drillState())
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.Build(drillState())
	if err != nil {
		t.Fatal(err)
	}
	for typ := range numTypes {
		if !sameResources(&first.Envoy, &again.Envoy, typ) {
			t.Errorf("unchanged state: %s resources rebuilt", typ.label())
		}
	}
	names := []string{xdscontract.PinnedClassClusterName("m", "eu", 1024), xdscontract.PinnedClassClusterName("m", "eu", 8192)}
	// A weight change of the unpinned locality: the set's resources stay.
	st := drillState()
	st.Models[0].Localities[0].Endpoints[0].Weight = 7
	moved, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if c := clusterByName(&moved.Envoy, n); c == nil || c != clusterByName(&first.Envoy, n) {
			t.Errorf("weight change elsewhere: cluster %s rebuilt", n)
		}
		if a := claByName(&moved.Envoy, n); a == nil || a != claByName(&first.Envoy, n) {
			t.Errorf("weight change elsewhere: assignment %s rebuilt", n)
		}
	}
	// The set allows one more region: new clusters with the new metadata,
	// the same assignments.
	st.Models[0].Pinned[0].Regions = []string{"eu-central", "eu-west"}
	wider, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &wider.Envoy)
	pinned := clusterByName(&wider.Envoy, xdscontract.PinnedClusterName("m", "eu"))
	for _, n := range names {
		c := clusterByName(&wider.Envoy, n)
		if c == clusterByName(&moved.Envoy, n) || !protoEqualMetadata(c, pinned) {
			t.Errorf("regions change: cluster %s reused or with stale metadata %v", n, c.GetMetadata())
		}
		if a := claByName(&wider.Envoy, n); a != claByName(&moved.Envoy, n) {
			t.Errorf("regions change: assignment %s rebuilt", n)
		}
	}
	fields := pinned.GetMetadata().GetFilterMetadata()[xdscontract.MetadataKey].GetFields()
	if got := len(fields[xdscontract.MetadataAllowedRegions].GetListValue().GetValues()); got != 2 {
		t.Errorf("pinned cluster allows %d regions, want 2", got)
	}
}
