package xds

import (
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// matchRoute picks the first route of rc matching headers the way Envoy
// does for the matchers the builder writes: exact string, present (with
// invert) and int64 range [start, end) on a decimal value.
func matchRoute(t *testing.T, rc *route.RouteConfiguration, headers map[string]string) *route.Route {
	t.Helper()
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		if r.GetMatch().GetPrefix() != "/" {
			t.Fatalf("route %q: path match %v, want prefix /", r.GetName(), r.GetMatch())
		}
		ok := true
		for _, h := range r.GetMatch().GetHeaders() {
			v, present := headers[h.GetName()]
			var m bool
			switch spec := h.GetHeaderMatchSpecifier().(type) {
			case *route.HeaderMatcher_StringMatch:
				m = present && v == spec.StringMatch.GetExact()
			case *route.HeaderMatcher_PresentMatch:
				m = present == spec.PresentMatch
			case *route.HeaderMatcher_RangeMatch:
				n, err := strconv.ParseInt(v, 10, 64)
				m = present && err == nil && n >= spec.RangeMatch.GetStart() && n < spec.RangeMatch.GetEnd()
			default:
				t.Fatalf("route %q: unexpected matcher %T", r.GetName(), spec)
			}
			if h.GetInvertMatch() {
				m = !m
			}
			if !m {
				ok = false
				break
			}
		}
		if ok {
			return r
		}
	}
	return nil
}

// cellsOf lists the cells of an assignment, sorted.
func cellsOf(cla *endpoint.ClusterLoadAssignment) []string {
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			c, _ := xdscontract.EndpointMetadata(e.GetMetadata())
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// classState: local cells a (4096) and b (32768), a remote region's ingress
// (max_model_len unknown) at priority 0 beside the local locality.
func classState() State {
	return State{Models: []Model{{Name: "m", Localities: []Locality{
		{Weight: 80, Endpoints: []Endpoint{
			{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 1, MaxModelLen: 4096},
			{CellID: "b", Host: "10.0.0.2", Port: 8000, Weight: 3, MaxModelLen: 32768},
		}},
		{Region: "eu", Zone: "eu", Weight: 20, Endpoints: []Endpoint{{CellID: "region/eu", Host: "10.9.0.1", Port: 443, Weight: 1}}},
	}}}}
}

func TestContextClassClusters(t *testing.T) {
	res, err := mustBuilder(t, testConfig()).Build(classState())
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	checkSet(t, KindGRPC, &res.GRPC)
	want := map[string][]string{
		xdscontract.ClusterName("m"):                   {"a", "b", "region/eu"},
		xdscontract.LocalClusterName("m"):              {"a", "b"},
		xdscontract.ClassClusterName("m", 4096):        {"a", "b", "region/eu"},
		xdscontract.ClassClusterName("m", 8192):        {"b", "region/eu"},
		xdscontract.ClassClusterName("m", 32768):       {"b", "region/eu"},
		xdscontract.ClassClusterName("m", 131072):      {"region/eu"},
		xdscontract.LocalClassClusterName("m", 4096):   {"a", "b"},
		xdscontract.LocalClassClusterName("m", 8192):   {"b"},
		xdscontract.LocalClassClusterName("m", 32768):  {"b"},
		xdscontract.LocalClassClusterName("m", 131072): nil, // no local endpoint fits: left out
	}
	for name, cells := range want {
		cla := claByName(&res.Envoy, name)
		c := clusterByName(&res.Envoy, name)
		if cells == nil {
			if cla != nil || c != nil {
				t.Errorf("%s present, want it left out", name)
			}
			continue
		}
		if cla == nil || c == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if got := cellsOf(cla); !slices.Equal(got, cells) {
			t.Errorf("%s holds %v, want %v", name, got, cells)
		}
		if c.GetEdsClusterConfig().GetServiceName() != name || strings.ContainsAny(c.GetAltStatName(), "./") {
			t.Errorf("cluster %s: service %q alt_stat_name %q", name, c.GetEdsClusterConfig().GetServiceName(), c.GetAltStatName())
		}
		// Locality weights are kept.
		for _, l := range cla.GetEndpoints() {
			w := map[string]uint32{"us-east": 80, "eu": 20}[l.GetLocality().GetRegion()]
			if l.GetLoadBalancingWeight().GetValue() != w {
				t.Errorf("%s: locality %s weight %d, want %d", name, l.GetLocality().GetRegion(), l.GetLoadBalancingWeight().GetValue(), w)
			}
		}
	}
	if n := len(res.Envoy.Clusters); n != len(want)-1 {
		t.Errorf("%d Envoy clusters, want %d", n, len(want)-1)
	}
	// The gRPC set keeps one cluster per model.
	if len(res.GRPC.Clusters) != 1 || res.GRPC.Clusters[0].GetName() != xdscontract.ClusterName("m") {
		t.Errorf("gRPC clusters = %v", res.GRPC.Clusters)
	}
}

func TestContextClassRoutes(t *testing.T) {
	res, err := mustBuilder(t, testConfig()).Build(classState())
	if err != nil {
		t.Fatal(err)
	}
	rc := res.Envoy.Routes[0]
	maxLen := map[string]uint32{"a": 4096, "b": 32768, "region/eu": 0}
	tests := []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"small prompt by header", map[string]string{"x-isobar-prompt-tokens": "1"}, xdscontract.ClassClusterName("m", 4096)},
		{"zero tokens", map[string]string{"x-isobar-prompt-tokens": "0"}, xdscontract.ClassClusterName("m", 4096)},
		{"class edge", map[string]string{"x-isobar-prompt-tokens": "4096"}, xdscontract.ClassClusterName("m", 4096)},
		{"just above", map[string]string{"x-isobar-prompt-tokens": "4097"}, xdscontract.ClassClusterName("m", 8192)},
		{"mid class", map[string]string{"x-isobar-prompt-tokens": "20000"}, xdscontract.ClassClusterName("m", 32768)},
		{"largest class", map[string]string{"x-isobar-prompt-tokens": "131072"}, xdscontract.ClassClusterName("m", 131072)},
		{"beyond every class", map[string]string{"x-isobar-prompt-tokens": "131073"}, xdscontract.ClusterName("m")},
		{"header wins over length", map[string]string{"x-isobar-prompt-tokens": "10", "content-length": "400000"}, xdscontract.ClassClusterName("m", 4096)},
		{"garbage header", map[string]string{"x-isobar-prompt-tokens": "many", "content-length": "10"}, xdscontract.ClusterName("m")},
		{"negative header", map[string]string{"x-isobar-prompt-tokens": "-3"}, xdscontract.ClusterName("m")},
		{"length edge", map[string]string{"content-length": "16384"}, xdscontract.ClassClusterName("m", 4096)},
		{"length above edge", map[string]string{"content-length": "16385"}, xdscontract.ClassClusterName("m", 8192)},
		{"long body", map[string]string{"content-length": "500000"}, xdscontract.ClassClusterName("m", 131072)},
		{"no size at all", map[string]string{}, xdscontract.ClusterName("m")},
		{"other model", map[string]string{"x-isobar-model": "n", "x-isobar-prompt-tokens": "1"}, xdscontract.ClassClusterName("m", 4096)}, // catch-all: one model
		{"forwarded small", map[string]string{"x-isobar-hop": "eu", "x-isobar-prompt-tokens": "100"}, xdscontract.LocalClassClusterName("m", 4096)},
		{"forwarded mid", map[string]string{"x-isobar-hop": "eu", "x-isobar-prompt-tokens": "5000"}, xdscontract.LocalClassClusterName("m", 8192)},
		{"forwarded by length", map[string]string{"x-isobar-hop": "eu", "content-length": "100000"}, xdscontract.LocalClassClusterName("m", 32768)},
		{"forwarded too long for any local class", map[string]string{"x-isobar-hop": "eu", "x-isobar-prompt-tokens": "40000"}, xdscontract.LocalClusterName("m")},
		{"forwarded no size", map[string]string{"x-isobar-hop": ""}, xdscontract.LocalClusterName("m")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, withModel := range []bool{true, false} {
				h := map[string]string{}
				for k, v := range tc.headers {
					h[k] = v
				}
				if _, ok := h["x-isobar-model"]; !ok && withModel {
					h["x-isobar-model"] = "m"
				}
				r := matchRoute(t, rc, h)
				if r == nil {
					t.Fatalf("headers %v matched no route", h)
				}
				if got := r.GetRoute().GetCluster(); got != tc.want {
					t.Fatalf("headers %v: route %q to %s, want %s", h, r.GetName(), got, tc.want)
				}
				if withModel && h["x-isobar-model"] == "m" && strings.HasPrefix(r.GetName(), "catch_all") {
					t.Errorf("headers %v matched the catch-all %q before the model's routes", h, r.GetName())
				}
			}
		})
	}
	// Whatever the size, a class route never sends a request to an endpoint
	// whose max_model_len is known to be too small.
	for tokens := int64(0); tokens <= 140000; tokens += 997 {
		for _, h := range []map[string]string{
			{"x-isobar-prompt-tokens": strconv.FormatInt(tokens, 10)},
			{"content-length": strconv.FormatInt(tokens*xdscontract.BytesPerToken, 10)},
			{"x-isobar-hop": "x", "x-isobar-prompt-tokens": strconv.FormatInt(tokens, 10)},
		} {
			r := matchRoute(t, rc, h)
			name := r.GetRoute().GetCluster()
			if !strings.Contains(name, "/ctx-") {
				continue // no class fits: the main or local cluster
			}
			for _, c := range cellsOf(claByName(&res.Envoy, name)) {
				if n := maxLen[c]; n != 0 && int64(n) < tokens {
					t.Fatalf("%d tokens (%v) routed to %s holding %s (max_model_len %d)", tokens, h, name, c, n)
				}
			}
		}
	}
}

func TestLocalOnlyClusterRenumbersPriorities(t *testing.T) {
	// The remote region is the primary (priority 0) and the local cells the
	// failover (priority 1): the local-only cluster must start at 0.
	st := State{Models: []Model{{Name: "m", Localities: []Locality{
		{Region: "eu", Zone: "eu", Weight: 1, Endpoints: []Endpoint{{CellID: "region/eu", Host: "10.9.0.1", Port: 443, Weight: 1}}},
		{Weight: 1, Priority: 1, Endpoints: []Endpoint{{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 1, MaxModelLen: 8192}}},
	}}}}
	res, err := mustBuilder(t, testConfig()).Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	for _, name := range []string{xdscontract.LocalClusterName("m"), xdscontract.LocalClassClusterName("m", 8192)} {
		cla := claByName(&res.Envoy, name)
		if len(cla.GetEndpoints()) != 1 || cla.GetEndpoints()[0].GetPriority() != 0 || cla.GetEndpoints()[0].GetLocality().GetRegion() != "us-east" {
			t.Errorf("%s = %v, want the local locality alone at priority 0", name, cla)
		}
	}
	// With no local endpoint at all the local cluster exists, empty:
	// forwarded traffic fails rather than loops.
	st.Models[0].Localities = st.Models[0].Localities[:1]
	res, err = mustBuilder(t, testConfig()).Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	if cla := claByName(&res.Envoy, xdscontract.LocalClusterName("m")); cla == nil || len(cla.GetEndpoints()) != 0 {
		t.Errorf("local cluster without local endpoints = %v, want present and empty", cla)
	}
	r := matchRoute(t, res.Envoy.Routes[0], map[string]string{"x-isobar-model": "m", "x-isobar-hop": "us-west"})
	if r.GetRoute().GetCluster() != xdscontract.LocalClusterName("m") {
		t.Errorf("forwarded request routed to %s", r.GetRoute().GetCluster())
	}
}

func TestContextClassesDisabledAndCustom(t *testing.T) {
	cfg := testConfig()
	cfg.ContextClasses = []uint32{}
	res, err := mustBuilder(t, cfg).Build(classState())
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	if len(res.Envoy.Clusters) != 2 || len(res.Envoy.Routes[0].GetVirtualHosts()[0].GetRoutes()) != 4 {
		t.Fatalf("classes off: %d clusters and %d routes, want main+local and 4 routes", len(res.Envoy.Clusters),
			len(res.Envoy.Routes[0].GetVirtualHosts()[0].GetRoutes()))
	}
	cfg.ContextClasses = []uint32{1000, 30000}
	res, err = mustBuilder(t, cfg).Build(classState())
	if err != nil {
		t.Fatal(err)
	}
	// The declared max_model_len values (4096 of a, 32768 of b) are
	// classes of their own beside the configured ones: 1001 tokens go to
	// 4096, the smallest class that fits, where a serves too.
	for tokens, want := range map[string]string{"1001": xdscontract.ClassClusterName("m", 4096), "4097": xdscontract.ClassClusterName("m", 30000),
		"30001": xdscontract.ClassClusterName("m", 32768)} {
		r := matchRoute(t, res.Envoy.Routes[0], map[string]string{"x-isobar-prompt-tokens": tokens})
		if got := r.GetRoute().GetCluster(); got != want {
			t.Errorf("%s tokens with classes 1000,30000 and declared 4096,32768 routed to %s, want %s", tokens, got, want)
		}
	}
	if got := cellsOf(claByName(&res.Envoy, xdscontract.ClassClusterName("m", 30000))); !slices.Equal(got, []string{"b", "region/eu"}) {
		t.Errorf("class 30000 holds %v", got)
	}
}

// A cell below its model's longest context carries ClassWeight in the
// class clusters it fits and Weight in the main and local clusters; the
// others carry Weight everywhere.
func TestClassWeight(t *testing.T) {
	st := State{Models: []Model{{Name: "m", Localities: []Locality{{Weight: 1, Endpoints: []Endpoint{
		{CellID: "short", Host: "10.0.0.1", Port: 8000, Weight: 1, ClassWeight: 100, MaxModelLen: 1024},
		{CellID: "long", Host: "10.0.0.2", Port: 8000, Weight: 100},
	}}}}}}
	b := mustBuilder(t, testConfig())
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	weights := func(name string) map[string]uint32 {
		out := map[string]uint32{}
		for _, l := range claByName(&res.Envoy, name).GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				id, _ := xdscontract.EndpointMetadata(e.GetMetadata())
				out[id] = e.GetLoadBalancingWeight().GetValue()
			}
		}
		return out
	}
	for name, want := range map[string]map[string]uint32{
		xdscontract.ClusterName("m"):             {"short": 1, "long": 100},
		xdscontract.LocalClusterName("m"):        {"short": 1, "long": 100},
		xdscontract.ClassClusterName("m", 1024):  {"short": 100, "long": 100},
		xdscontract.ClassClusterName("m", 4096):  {"long": 100},
		xdscontract.ClassClusterName("m", 32768): {"long": 100},
	} {
		if got := weights(name); !maps.Equal(got, want) {
			t.Errorf("%s weights %v, want %v", name, got, want)
		}
	}
	r := matchRoute(t, res.Envoy.Routes[0], map[string]string{"x-isobar-prompt-tokens": "1000"})
	if got := r.GetRoute().GetCluster(); got != xdscontract.ClassClusterName("m", 1024) {
		t.Errorf("1000 tokens routed to %s, want the declared class 1024", got)
	}
	// A rebuild with the same state reuses every assignment.
	again, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	for i := range res.Envoy.Endpoints {
		if again.Envoy.Endpoints[i] != res.Envoy.Endpoints[i] {
			t.Errorf("assignment %d rebuilt for an unchanged state", i)
		}
	}
}

func shedOf(t *testing.T, r *route.Route) (ppm uint32, ok bool) {
	t.Helper()
	ppm, status, ok := abortOf(t, r)
	if ok && status != 429 {
		t.Fatalf("route %q abort status %d, want 429", r.GetName(), status)
	}
	return ppm, ok
}

// abortOf reads a route's fault abort: its share per million and status.
func abortOf(t *testing.T, r *route.Route) (ppm, status uint32, ok bool) {
	t.Helper()
	a := r.GetTypedPerFilterConfig()[wellknown.Fault]
	if a == nil {
		return 0, 0, false
	}
	var f fault.HTTPFault
	if err := a.UnmarshalTo(&f); err != nil {
		t.Fatalf("route %q fault config: %v", r.GetName(), err)
	}
	ab := f.GetAbort()
	if ab.GetPercentage().GetDenominator() != typev3.FractionalPercent_MILLION {
		t.Fatalf("route %q abort = %v, want a share per million", r.GetName(), ab)
	}
	return ab.GetPercentage().GetNumerator(), ab.GetHttpStatus(), true
}

func TestShedIsAFaultOnClientRoutesOnly(t *testing.T) {
	b := mustBuilder(t, testConfig())
	st := classState()
	st.Models = append(st.Models, fleet("other", 2))
	// The same share for every criticality: no per-criticality routes.
	st.Models[0].Shed, st.Models[0].ShedCritical, st.Models[0].ShedSheddable = 0.25, 0.25, 0.25
	r1, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &r1.Envoy)
	var shedRoutes, hopRoutes int
	for _, r := range r1.Envoy.Routes[0].GetVirtualHosts()[0].GetRoutes() {
		ppm, has := shedOf(t, r)
		hop := strings.Contains(r.GetName(), "/hop")
		switch {
		case strings.HasPrefix(r.GetName(), "other"):
			if has {
				t.Errorf("route %q of a model without shed carries a fault", r.GetName())
			}
		case hop:
			hopRoutes++
			if has {
				t.Errorf("forwarded-traffic route %q carries a fault", r.GetName())
			}
		default:
			shedRoutes++
			if !has || ppm != 250000 {
				t.Errorf("client route %q: fault %d (present %v), want 250000 per million", r.GetName(), ppm, has)
			}
		}
	}
	if shedRoutes != 9 || hopRoutes != 7 {
		t.Errorf("%d shed routes and %d hop routes for m, want 9 and 7", shedRoutes, hopRoutes)
	}
	// A shed change moves the routes only.
	st.Models[0].Shed, st.Models[0].ShedCritical, st.Models[0].ShedSheddable = 0.5, 0.5, 0.5
	r2, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	if sameResources(&r1.Envoy, &r2.Envoy, 1) || !sameResources(&r1.Envoy, &r2.Envoy, 2) || !sameResources(&r1.Envoy, &r2.Envoy, 3) ||
		!sameResources(&r1.GRPC, &r2.GRPC, 0) {
		t.Error("shed change: want only the RouteConfiguration rebuilt")
	}
	if ppm, _ := shedOf(t, routeByName(r2.Envoy.Routes[0], "m")); ppm != 500000 {
		t.Errorf("shed 0.5 written as %d per million", ppm)
	}
	// Back to zero: no fault at all.
	st.Models[0].Shed, st.Models[0].ShedCritical, st.Models[0].ShedSheddable = 0, 0, 0
	r3, _ := b.Build(st)
	if _, has := shedOf(t, routeByName(r3.Envoy.Routes[0], "m")); has {
		t.Error("shed 0 still writes a fault")
	}
	for _, bad := range []float64{-0.01, 1.01, math.NaN(), math.Inf(1)} {
		st.Models[0].Shed = bad
		if _, err := b.Build(st); !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "shed") {
			t.Errorf("shed %v: Build = %v, want ErrInvalidState naming shed", bad, err)
		}
	}
	st.Models[0].Shed = 1
	if _, err := b.Build(st); err != nil {
		t.Errorf("shed 1: %v", err)
	}
}

func TestContextClassConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"decreasing", func(c *Config) { c.ContextClasses = []uint32{8192, 4096} }, "strictly increasing"},
		{"repeated", func(c *Config) { c.ContextClasses = []uint32{4096, 4096} }, "strictly increasing"},
		{"zero", func(c *Config) { c.ContextClasses = []uint32{0} }, "ContextClasses[0] = 0"},
		{"huge", func(c *Config) { c.ContextClasses = []uint32{1 << 31} }, "out of range"},
		{"too many", func(c *Config) {
			c.ContextClasses = nil
			for i := range 17 {
				c.ContextClasses = append(c.ContextClasses, uint32(i+1))
			}
		}, "at most 16"},
		{"reserved model header", func(c *Config) { c.ModelHeader = xdscontract.PromptTokensHeader }, "reserved"},
		{"reserved hop header", func(c *Config) { c.HopHeader = "content-length" }, "reserved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.edit(&cfg)
			if _, err := NewBuilder(cfg); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewBuilder = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
	// The builder keeps its own copy of the classes.
	cfg := testConfig()
	cfg.ContextClasses = []uint32{100, 200}
	b := mustBuilder(t, cfg)
	cfg.ContextClasses[0] = 300
	if b.Config().ContextClasses[0] != 100 {
		t.Error("Builder shares the caller's ContextClasses slice")
	}
}

// A declared class outlives the declaration: when the only cell at
// max_model_len 1024 comes back at its full context, the ctx-1024 cluster
// and its routes stay (now with every cell), so no route ever names a
// cluster a data plane has dropped.
func TestDeclaredClassStays(t *testing.T) {
	st := func(short uint32) State {
		return State{Models: []Model{{Name: "m", Localities: []Locality{{Weight: 1, Endpoints: []Endpoint{
			{CellID: "short", Host: "10.0.0.1", Port: 8000, Weight: 100, MaxModelLen: short},
			{CellID: "long", Host: "10.0.0.2", Port: 8000, Weight: 100},
		}}}}}}
	}
	b := mustBuilder(t, testConfig())
	if _, err := b.Build(st(1024)); err != nil {
		t.Fatal(err)
	}
	res, err := b.Build(st(0))
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	cla := claByName(&res.Envoy, xdscontract.ClassClusterName("m", 1024))
	if got := cellsOf(cla); !slices.Equal(got, []string{"long", "short"}) {
		t.Fatalf("ctx-1024 after the declaration went: %v, want both cells", got)
	}
	r := matchRoute(t, res.Envoy.Routes[0], map[string]string{"x-isobar-prompt-tokens": "1000"})
	if got := r.GetRoute().GetCluster(); got != xdscontract.ClassClusterName("m", 1024) {
		t.Errorf("1000 tokens routed to %s, want the kept class 1024", got)
	}
}

// Make-before-break: once a class cluster has existed it stays while its
// class does, even after every endpoint that fitted it left, so a data
// plane that applies the new CDS before the new RDS never holds a route
// naming a cluster it no longer has. The routes stop naming it at once.
func TestClassClustersOutliveTheirEndpoints(t *testing.T) {
	b := mustBuilder(t, testConfig())
	first, err := b.Build(classState())
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, r := range first.Envoy.Routes[0].GetVirtualHosts()[0].GetRoutes() {
		if c := r.GetRoute().GetCluster(); c != "" {
			named[c] = true
		}
	}
	// Every cell out: the model stays with no locality.
	res, err := b.Build(State{Models: []Model{{Name: "m"}}})
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &res.Envoy)
	for c := range named {
		if clusterByName(&res.Envoy, c) == nil || claByName(&res.Envoy, c) == nil {
			t.Errorf("cluster %s, named by the previous routes, is gone", c)
		}
	}
	for _, r := range res.Envoy.Routes[0].GetVirtualHosts()[0].GetRoutes() {
		if c := r.GetRoute().GetCluster(); c != "" && c != xdscontract.ClusterName("m") && c != xdscontract.LocalClusterName("m") {
			if cla := claByName(&res.Envoy, c); len(cla.GetEndpoints()) == 0 {
				t.Errorf("route %q names the empty class cluster %s; want the main cluster", r.GetName(), c)
			}
		}
	}
	// A class no endpoint ever fitted still has no cluster.
	if c := xdscontract.LocalClassClusterName("m", 131072); clusterByName(&res.Envoy, c) != nil {
		t.Errorf("%s never had an endpoint, yet is present", c)
	}
}

// A locality's span gives every filter the count of endpoints it keeps,
// as reading each endpoint does (subFilter.keep): through random
// localities of declared, undeclared and mixed max_model_len, local and
// remote, and every filter of the default classes and beyond.
func TestSpanKeepsWhatKeepKeeps(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 14))
	lens := []uint32{0, 2048, 4096, 8192, 32768, 131072}
	classes := []uint32{0, 1, 4096, 8192, 8193, 32768, 131072, 200000}
	partial := 0
	for range 2000 {
		l := Locality{Region: []string{"r1", "r2"}[rng.IntN(2)]}
		pos := make([]*endpointParts, rng.IntN(6))
		for j := range pos {
			l.Endpoints = append(l.Endpoints, Endpoint{MaxModelLen: lens[rng.IntN(len(lens))]})
			pos[j] = &endpointParts{}
			if rng.IntN(4) == 0 {
				pos[j].classLB = &endpoint.LbEndpoint{}
			}
		}
		s := spanOf(&l, pos)
		wantClassLB := false
		for j := range pos {
			wantClassLB = wantClassLB || pos[j].classLB != nil
		}
		if s.classLB != wantClassLB {
			t.Fatalf("%+v: span classLB %v, want %v", l, s.classLB, wantClassLB)
		}
		for _, local := range []bool{false, true} {
			for _, class := range classes {
				f := subFilter{local: local, class: class}
				want := 0
				for j := range l.Endpoints {
					if f.keep("r1", &l, &l.Endpoints[j]) {
						want++
					}
				}
				if got := f.kept("r1", &l, s); got != want {
					t.Fatalf("%+v, filter %+v: kept %d, want %d", l, f, got, want)
				}
				if want > 0 && want < len(l.Endpoints) {
					partial++
				}
			}
		}
	}
	if partial < 100 {
		t.Errorf("only %d partly kept localities: the test hardly reaches the per-endpoint count", partial)
	}
}
