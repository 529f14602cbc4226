package xds

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// routeNames lists the routes of the RouteConfiguration in match order.
func routeNames(rc *route.RouteConfiguration) []string {
	var out []string
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		out = append(out, r.GetName())
	}
	return out
}

// headerValue returns the exact value route r requires of header name, and
// whether it has such a matcher.
func headerValue(r *route.Route, name string) (string, bool) {
	for _, h := range r.GetMatch().GetHeaders() {
		if h.GetName() == name && h.GetStringMatch() != nil {
			return h.GetStringMatch().GetExact(), true
		}
	}
	return "", false
}

func TestCriticalityShedRoutes(t *testing.T) {
	b := mustBuilder(t, testConfig())
	st := classState()
	m := &st.Models[0]
	m.Shed, m.ShedCritical, m.ShedSheddable = 0.1, 0, 0.5
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	rc := res.Envoy.Routes[0]
	names := routeNames(rc)
	// Each client route group: critical, sheddable, then the rest.
	for _, group := range []string{"m", "m/ctx-4096", "m/ctx-4096/bytes", "m/ctx-32768/bytes", "catch_all"} {
		i := slices.Index(names, group)
		if i < 2 || names[i-2] != group+"/critical" || names[i-1] != group+"/sheddable" {
			t.Fatalf("group %s: routes %v, want %s/critical, %s/sheddable, %s in a row", group, names, group, group, group)
		}
		for _, tc := range []struct {
			name, crit string
			ppm        uint32
		}{{group + "/critical", "critical", 0}, {group + "/sheddable", "sheddable", 500000}, {group, "", 100000}} {
			r := routeByName(rc, tc.name)
			ppm, has := shedOf(t, r)
			if ppm != tc.ppm || has != (tc.ppm > 0) {
				t.Errorf("route %s: abort %d per million (present %v), want %d", tc.name, ppm, has, tc.ppm)
			}
			v, ok := headerValue(r, xdscontract.CriticalityHeader)
			if v != tc.crit || ok != (tc.crit != "") {
				t.Errorf("route %s: criticality matcher %q (present %v), want %q", tc.name, v, ok, tc.crit)
			}
		}
	}
	for _, n := range names {
		if strings.Contains(n, "/hop") && (strings.HasSuffix(n, "/critical") || strings.HasSuffix(n, "/sheddable")) {
			t.Errorf("forwarded traffic got a per-criticality route %s", n)
		}
	}

	// A share equal to the standard one needs no route of its own.
	m.ShedCritical, m.ShedSheddable = 0.1, 0.1
	res, err = b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range routeNames(res.Envoy.Routes[0]) {
		if strings.HasSuffix(n, "/critical") || strings.HasSuffix(n, "/sheddable") {
			t.Errorf("equal shares: route %s written", n)
		}
	}
	m.ShedSheddable = 0.3
	res, err = b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	names = routeNames(res.Envoy.Routes[0])
	if slices.Contains(names, "m/critical") || !slices.Contains(names, "m/sheddable") {
		t.Errorf("only sheddable differs: routes %v", names)
	}

	for _, bad := range []struct {
		crit, shed float64
	}{{-0.1, 0}, {0, 1.5}, {math.NaN(), 0}, {0, math.Inf(1)}} {
		m.ShedCritical, m.ShedSheddable = bad.crit, bad.shed
		if _, err := b.Build(st); !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "shed") {
			t.Errorf("shares %v: Build = %v, want ErrInvalidState naming the shed", bad, err)
		}
	}
}

// pinnedState is classState with three residency sets: "eu" on the
// remote eu locality, "us" on the local cells (Region left empty: the
// controller's own), and "none" with no locality.
func pinnedState() State {
	st := classState()
	m := &st.Models[0]
	m.Pinned = []Pinned{
		{Set: "us", Regions: []string{"us-east"}, Localities: []Locality{{Weight: 5, Endpoints: []Endpoint{
			{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 1, MaxModelLen: 4096}}}}},
		{Set: "eu", Regions: []string{"eu", "eu-central"}, Shed: 0.2, ShedSheddable: 0.9, ShedCritical: 0.2,
			Localities: []Locality{m.Localities[1]}},
		{Set: "none", Regions: []string{"ap"}},
	}
	return st
}

func TestPinnedClusters(t *testing.T) {
	b := mustBuilder(t, testConfig())
	res, err := b.Build(pinnedState())
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	checkSet(t, KindGRPC, &res.GRPC)
	for _, tc := range []struct {
		set     string
		regions []string
		cells   []string
	}{{"eu", []string{"eu", "eu-central"}, []string{"region/eu"}}, {"none", []string{"ap"}, nil}, {"us", []string{"us-east"}, []string{"a"}}} {
		name := xdscontract.PinnedClusterName("m", tc.set)
		c := clusterByName(&res.Envoy, name)
		if c == nil {
			t.Fatalf("no cluster %s", name)
		}
		if c.GetAltStatName() != "isobar_m_pin_"+tc.set {
			t.Errorf("cluster %s: alt_stat_name %q", name, c.GetAltStatName())
		}
		fields := c.GetMetadata().GetFilterMetadata()[xdscontract.MetadataKey].GetFields()
		var regions []string
		for _, v := range fields[xdscontract.MetadataAllowedRegions].GetListValue().GetValues() {
			regions = append(regions, v.GetStringValue())
		}
		if fields[xdscontract.MetadataResidency].GetStringValue() != tc.set || !slices.Equal(regions, tc.regions) {
			t.Errorf("cluster %s metadata %v, want set %s regions %v", name, fields, tc.set, tc.regions)
		}
		cla := claByName(&res.Envoy, name)
		if cla == nil {
			t.Fatalf("no assignment %s (an empty pinned cluster must still have one)", name)
		}
		var cells []string
		for _, l := range cla.GetEndpoints() {
			if !slices.Contains(tc.regions, l.GetLocality().GetRegion()) {
				t.Errorf("%s: locality of region %s", name, l.GetLocality().GetRegion())
			}
			for _, e := range l.GetLbEndpoints() {
				cells = append(cells, e.GetMetadata().GetFilterMetadata()[xdscontract.MetadataKey].GetFields()[xdscontract.MetadataCell].GetStringValue())
			}
		}
		if !slices.Equal(cells, tc.cells) {
			t.Errorf("%s: cells %v, want %v", name, cells, tc.cells)
		}
	}
	for _, c := range res.GRPC.Clusters {
		if strings.Contains(c.GetName(), "/pin-") {
			t.Errorf("the gRPC set holds pinned cluster %s", c.GetName())
		}
	}

	// Route order: forwarded, then pinned (set order), then unpinned.
	rc := res.Envoy.Routes[0]
	names := routeNames(rc)
	want := []string{"m/hop", "m/pin-eu/sheddable", "m/pin-eu", "m/pin-none", "m/pin-us", "m/ctx-4096"}
	var at []int
	for _, n := range want {
		at = append(at, slices.Index(names, n))
	}
	if !slices.IsSorted(at) || slices.Contains(at, -1) {
		t.Fatalf("routes %v: want %v in this order", names, want)
	}
	if slices.Contains(names, "m/pin-eu/critical") {
		t.Error("pinned set eu: critical share equals the standard one, yet has a route")
	}
	for _, tc := range []struct {
		name, set string
		ppm       uint32
	}{{"m/pin-eu/sheddable", "eu", 900000}, {"m/pin-eu", "eu", 200000}, {"m/pin-us", "us", 0}, {"catch_all/pin-none", "none", 0}} {
		r := routeByName(rc, tc.name)
		if v, ok := headerValue(r, xdscontract.ResidencyHeader); !ok || v != tc.set ||
			r.GetRoute().GetCluster() != xdscontract.PinnedClusterName("m", tc.set) {
			t.Errorf("route %s: residency %q cluster %s", tc.name, v, r.GetRoute().GetCluster())
		}
		// A set's excess is refused 503, not 429: it is never spilled.
		if ppm, status, ok := abortOf(t, r); ppm != tc.ppm || (ok && status != 503) {
			t.Errorf("route %s: abort %d per million status %d, want %d per million, 503", tc.name, ppm, status, tc.ppm)
		}
	}
	// Unpinned client routes refuse a residency header: a set the model
	// does not list is served nowhere rather than anywhere.
	for _, n := range []string{"m", "m/ctx-4096", "catch_all"} {
		hs := routeByName(rc, n).GetMatch().GetHeaders()
		if !slices.ContainsFunc(hs, func(h *route.HeaderMatcher) bool {
			return h.GetName() == xdscontract.ResidencyHeader && h.GetPresentMatch() && h.GetInvertMatch()
		}) {
			t.Errorf("unpinned route %s accepts a residency header: %v", n, hs)
		}
	}

	// Unchanged: the same resources. A set dropped: its cluster goes.
	again, err := b.Build(pinnedState())
	if err != nil {
		t.Fatal(err)
	}
	for typ := range numTypes {
		if !sameResources(&res.Envoy, &again.Envoy, typ) {
			t.Errorf("unchanged state: %s resources rebuilt", typ.label())
		}
	}
	st := pinnedState()
	st.Models[0].Pinned = st.Models[0].Pinned[:1]
	fewer, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &fewer.Envoy)
	if clusterByName(&fewer.Envoy, xdscontract.PinnedClusterName("m", "eu")) != nil || slices.Contains(routeNames(fewer.Envoy.Routes[0]), "m/pin-eu") {
		t.Error("a dropped residency set keeps its cluster or routes")
	}
	if c := clusterByName(&fewer.Envoy, xdscontract.PinnedClusterName("m", "us")); c != clusterByName(&res.Envoy, xdscontract.PinnedClusterName("m", "us")) {
		t.Error("an unchanged residency set's cluster was rebuilt")
	}
}

func TestPinnedValidation(t *testing.T) {
	tooMany := make([]Pinned, residency.MaxSets+1)
	for i := range tooMany {
		tooMany[i] = Pinned{Set: fmt.Sprintf("s%d", i), Regions: []string{"us-east"}}
	}
	for _, tc := range []struct {
		name   string
		pinned []Pinned
		want   string
	}{
		{"locality outside the set", []Pinned{{Set: "eu", Regions: []string{"eu-west"}, Localities: []Locality{local(ep("a", "10.0.0.1", 1, 1))}}},
			`region "us-east", which the set does not allow`},
		{"remote locality outside", []Pinned{{Set: "eu", Regions: []string{"us-east"},
			Localities: []Locality{{Region: "eu", Weight: 1, Endpoints: []Endpoint{ep("r", "10.9.0.1", 1, 1)}}}}}, `region "eu"`},
		{"bad set name", []Pinned{{Set: "e u", Regions: []string{"us-east"}}}, "residency set"},
		{"empty set name", []Pinned{{Regions: []string{"us-east"}}}, "residency set is empty"},
		{"set twice", []Pinned{{Set: "eu", Regions: []string{"us-east"}}, {Set: "eu", Regions: []string{"us-east"}}}, "listed twice"},
		{"too many sets", tooMany, "residency sets, at most"},
		{"bad region", []Pinned{{Set: "eu", Regions: []string{"eu west"}}}, "allowed region"},
		{"set shed", []Pinned{{Set: "eu", Regions: []string{"us-east"}, ShedSheddable: 2}}, "sheddable shed"},
		{"bad locality", []Pinned{{Set: "eu", Regions: []string{"us-east"}, Localities: []Locality{{Endpoints: []Endpoint{ep("a", "10.0.0.1", 1, 1)}}}}},
			"locality weight 0"},
	} {
		st := State{Models: []Model{{Name: "m", Localities: []Locality{local(ep("a", "10.0.0.1", 1, 1))}, Pinned: tc.pinned}}}
		_, err := mustBuilder(t, testConfig()).Build(st)
		if !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Build = %v, want ErrInvalidState naming %q", tc.name, err, tc.want)
		}
	}
}

func TestModelNamesMustNotCollideWithClusters(t *testing.T) {
	for _, other := range []string{"m/local", "m/local/ctx-4096", "m/ctx-4096", "m/pin-eu"} {
		st := State{Models: []Model{{Name: "m", Localities: []Locality{local(ep("a", "10.0.0.1", 1, 1))}},
			{Name: other, Localities: []Locality{local(ep("b", "10.0.0.2", 1, 1))}}}}
		if _, err := mustBuilder(t, testConfig()).Build(st); !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "Envoy-only clusters") {
			t.Errorf("models m and %s: Build = %v, want ErrInvalidState naming the collision", other, err)
		}
	}
	st := State{Models: []Model{{Name: "m", Localities: []Locality{local(ep("a", "10.0.0.1", 1, 1))}},
		{Name: "m/7b", Localities: []Locality{local(ep("b", "10.0.0.2", 1, 1))}}}}
	if _, err := mustBuilder(t, testConfig()).Build(st); err != nil {
		t.Errorf("models m and m/7b: %v", err)
	}
}

// budgetOf returns a cluster's retry budget: percent and min concurrency.
func budgetOf(c *cluster.Cluster) (float64, uint32) {
	rb := c.GetCircuitBreakers().GetThresholds()[0].GetRetryBudget()
	return rb.GetBudgetPercent().GetValue(), rb.GetMinRetryConcurrency().GetValue()
}

func TestRetryBudgetPerModel(t *testing.T) {
	b := mustBuilder(t, testConfig())
	st := pinnedState()
	st.Models = append(st.Models, fleet("other", 2))
	st.Models[0].RetryBudgetPercent = 7.4
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	for _, c := range res.Envoy.Clusters {
		want := 7.0 // rounded to a whole percent
		if strings.HasPrefix(c.GetName(), xdscontract.ClusterName("other")) {
			want = 20 // the static budget
		}
		if pct, minConc := budgetOf(c); pct != want || minConc != 3 {
			t.Errorf("cluster %s: budget %v%% min %d, want %v%% min 3", c.GetName(), pct, minConc, want)
		}
	}
	// A budget change rebuilds the model's clusters, and only them.
	st.Models[0].RetryBudgetPercent = 2
	res2, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res2.Envoy)
	for _, c := range res2.Envoy.Clusters {
		other := strings.HasPrefix(c.GetName(), xdscontract.ClusterName("other"))
		if pct, _ := budgetOf(c); other && pct != 20 || !other && pct != 2 {
			t.Errorf("after the change: cluster %s budget %v%%", c.GetName(), pct)
		}
		if same := c == clusterByName(&res.Envoy, c.GetName()); same != other {
			t.Errorf("cluster %s: reused %v after a budget change of model m", c.GetName(), same)
		}
	}
	if res2.GRPC.Clusters[0] != clusterByName(&res2.Envoy, xdscontract.ClusterName("m")) {
		t.Error("the gRPC set does not share the rebudgeted main cluster")
	}
	// Back to 0: the Config's static budget. A tiny budget rounds to 1.
	for _, tc := range []struct{ in, want float64 }{{0, 20}, {0.2, 1}, {100, 100}} {
		st.Models[0].RetryBudgetPercent = tc.in
		r, err := b.Build(st)
		if err != nil {
			t.Fatal(err)
		}
		if pct, _ := budgetOf(clusterByName(&r.Envoy, xdscontract.LocalClusterName("m"))); pct != tc.want {
			t.Errorf("budget %v: local cluster has %v%%, want %v%%", tc.in, pct, tc.want)
		}
	}
	for _, bad := range []float64{-1, 100.5, math.NaN()} {
		st.Models[0].RetryBudgetPercent = bad
		if _, err := b.Build(st); !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "retry budget") {
			t.Errorf("budget %v: Build = %v, want ErrInvalidState naming the retry budget", bad, err)
		}
	}
}
