package xdsclient

import (
	"errors"
	"slices"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// pinnedSet is the controller's Envoy set for model "m" with three
// residency sets (eu on the remote region, us on the local cells, none on
// nothing) and shed shares that differ by criticality.
func pinnedSet(t testing.TB) xds.Set {
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	localLoc := xds.Locality{Weight: 3, Endpoints: []xds.Endpoint{{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 2, MaxModelLen: 8192}}}
	remote := xds.Locality{Region: "r2", Zone: "r2", Weight: 1, Priority: 1,
		Endpoints: []xds.Endpoint{{CellID: "region/r2", Host: "10.9.0.1", Port: 443, Weight: 1}}}
	st := xds.State{Models: []xds.Model{{Name: "m", Shed: 0.25, ShedCritical: 0, ShedSheddable: 0.75, RetryBudgetPercent: 5,
		Localities: []xds.Locality{localLoc, remote},
		Pinned: []xds.Pinned{
			{Set: "eu", Regions: []string{"r2", "r3"}, Shed: 0.5, ShedCritical: 0.1, ShedSheddable: 0.5,
				Localities: []xds.Locality{{Region: "r2", Zone: "r2", Weight: 1, Endpoints: remote.Endpoints}}},
			{Set: "us", Regions: []string{"r1"}, Localities: []xds.Locality{localLoc}},
			{Set: "none", Regions: nil},
		}}}}
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	return res.Envoy
}

// The gateway reads back the pinned clusters, their endpoints and the
// per-criticality and per-residency routes the controller writes.
func TestDecodePinnedResources(t *testing.T) {
	s := pinnedSet(t)
	dec := Decoder{ModelHeader: "x-isobar-model"}
	clusters, err := dec.DecodeClusters(anys(t, s.Clusters))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range clusters {
		if c.RetryBudget == nil || c.RetryBudget.Percent != 5 || c.RetryBudget.MinConcurrency != 3 {
			t.Errorf("cluster %s: retry budget %+v, want 5%% min 3", name, c.RetryBudget)
		}
		if !strings.Contains(name, "/pin-") && (c.Residency != "" || c.AllowedRegions != nil) {
			t.Errorf("unpinned cluster %s decoded as pinned: %q %v", name, c.Residency, c.AllowedRegions)
		}
	}
	for _, tc := range []struct {
		set     string
		regions []string
	}{{"eu", []string{"r2", "r3"}}, {"us", []string{"r1"}}, {"none", []string{}}} {
		name := xdscontract.PinnedClusterName("m", tc.set)
		c := clusters[name]
		if c == nil || c.Residency != tc.set || c.AllowedRegions == nil || !slices.Equal(c.AllowedRegions, tc.regions) {
			t.Errorf("cluster %s: %+v, want residency %s regions %v", name, c, tc.set, tc.regions)
		}
	}
	eps, err := DecodeAssignments(anys(t, s.Endpoints))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set   string
		cells []string
	}{{"eu", []string{"region/r2"}}, {"us", []string{"a"}}, {"none", nil}} {
		name := xdscontract.PinnedClusterName("m", tc.set)
		got, ok := eps[name]
		var cells []string
		for _, e := range got {
			cells = append(cells, e.Cell)
		}
		if !ok || !slices.Equal(cells, tc.cells) {
			t.Errorf("assignment %s: cells %v (present %v), want %v", name, cells, ok, tc.cells)
		}
	}

	rcs, err := dec.DecodeRoutes(anys(t, s.Routes))
	if err != nil {
		t.Fatal(err)
	}
	vh := &rcs[xdscontract.RouteName].VirtualHosts[0]
	pin := xdscontract.PinnedClusterName
	for _, tc := range []struct {
		name    string
		h       mapView
		route   string // "" for no route
		cluster string
		ppm     uint32
	}{
		{"standard", mapView{"x-isobar-model": "m"}, "m", "isobar/m", 250000},
		{"critical", mapView{"x-isobar-model": "m", xdscontract.CriticalityHeader: "critical"}, "m/critical", "isobar/m", 0},
		{"sheddable", mapView{"x-isobar-model": "m", xdscontract.CriticalityHeader: "sheddable"}, "m/sheddable", "isobar/m", 750000},
		{"unknown criticality is standard", mapView{"x-isobar-model": "m", xdscontract.CriticalityHeader: "Critical"}, "m", "isobar/m", 250000},
		{"pinned eu", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "eu"}, "m/pin-eu", pin("m", "eu"), 500000},
		{"pinned eu critical", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "eu", xdscontract.CriticalityHeader: "critical"},
			"m/pin-eu/critical", pin("m", "eu"), 100000},
		{"pinned eu sheddable: same share as standard", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "eu",
			xdscontract.CriticalityHeader: "sheddable"}, "m/pin-eu", pin("m", "eu"), 500000},
		{"pinned to nothing", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "none"}, "m/pin-none", pin("m", "none"), 0},
		{"pinned with a class size", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "us", xdscontract.PromptTokensHeader: "100"},
			"m/pin-us/ctx-4096", xdscontract.PinnedClassClusterName("m", "us", 4096), 0},
		{"unknown set is served nowhere", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "ap"}, "", "", 0},
		{"set names are case-sensitive", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "EU"}, "", "", 0},
		{"catch-all pinned", mapView{xdscontract.ResidencyHeader: "eu"}, "catch_all/pin-eu", pin("m", "eu"), 500000},
		{"forwarded pinned stays local", mapView{"x-isobar-model": "m", "x-isobar-hop": "1", xdscontract.ResidencyHeader: "eu"},
			"m/hop", xdscontract.LocalClusterName("m"), 0},
	} {
		r := MatchRoute(vh, "/v1/completions", tc.h)
		switch {
		case tc.route == "" && r != nil:
			t.Errorf("%s: matched %s, want no route", tc.name, r.Name)
		case tc.route == "":
		case r == nil:
			t.Errorf("%s: no route, want %s", tc.name, tc.route)
		case r.Name != tc.route || r.Cluster != tc.cluster || r.AbortPerMillion != tc.ppm || r.Model != "m" && tc.route[:2] == "m/":
			t.Errorf("%s: route %s cluster %s abort %d model %q, want %s %s %d", tc.name, r.Name, r.Cluster, r.AbortPerMillion, r.Model,
				tc.route, tc.cluster, tc.ppm)
		}
	}
}

func TestResidencyMetadataBounds(t *testing.T) {
	str := structpb.NewStringValue
	list := func(vs ...*structpb.Value) *structpb.Value {
		return structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
	many := make([]*structpb.Value, 65)
	for i := range many {
		many[i] = str("r" + strings.Repeat("x", i))
	}
	for _, tc := range []struct {
		name   string
		fields map[string]*structpb.Value
		want   string // "" for accepted
		set    string
		rs     []string
	}{
		{"none", nil, "", "", nil},
		{"pinned", map[string]*structpb.Value{"residency": str("eu"), "allowed_regions": list(str("b"), str("a"), str("b"))}, "", "eu", []string{"a", "b"}},
		{"pinned nowhere", map[string]*structpb.Value{"residency": str("eu"), "allowed_regions": list()}, "", "eu", []string{}},
		{"regions without a set", map[string]*structpb.Value{"allowed_regions": list(str("a"))}, "without a residency set", "", nil},
		{"set without regions", map[string]*structpb.Value{"residency": str("eu")}, "without an allowed_regions list", "", nil},
		{"set is a number", map[string]*structpb.Value{"residency": structpb.NewNumberValue(1), "allowed_regions": list()}, "not a string", "", nil},
		{"empty set", map[string]*structpb.Value{"residency": str(""), "allowed_regions": list()}, "is empty", "", nil},
		{"set with a space", map[string]*structpb.Value{"residency": str("e u"), "allowed_regions": list()}, "visible ASCII", "", nil},
		{"region not a string", map[string]*structpb.Value{"residency": str("eu"), "allowed_regions": list(structpb.NewBoolValue(true))},
			"not a string", "", nil},
		{"region with a newline", map[string]*structpb.Value{"residency": str("eu"), "allowed_regions": list(str("a\n"))}, "visible ASCII", "", nil},
		{"too many regions", map[string]*structpb.Value{"residency": str("eu"), "allowed_regions": list(many...)}, "at most 64", "", nil},
		{"regions not a list", map[string]*structpb.Value{"residency": str("eu"), "allowed_regions": str("a")}, "allowed_regions list", "", nil},
	} {
		c := edsCluster("c", func(c *cluster.Cluster) {
			if tc.fields != nil {
				c.Metadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{xdscontract.MetadataKey: {Fields: tc.fields}}}
			}
		})
		out, err := (&Decoder{}).DecodeClusters([]*anypb.Any{mustAny(t, c)})
		if tc.want != "" {
			if !errors.Is(err, ErrInvalidResource) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v, want ErrInvalidResource naming %q", tc.name, err, tc.want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p := out["c"]
		if p.Residency != tc.set || !slices.Equal(p.AllowedRegions, tc.rs) || (tc.rs == nil) != (p.AllowedRegions == nil) {
			t.Errorf("%s: residency %q regions %#v, want %q %#v", tc.name, p.Residency, p.AllowedRegions, tc.set, tc.rs)
		}
	}
}
