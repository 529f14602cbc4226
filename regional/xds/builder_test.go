package xds

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	leastrequest "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/xdscontract"
)

func mustBuilder(t testing.TB, cfg Config) *Builder {
	t.Helper()
	b, err := NewBuilder(cfg)
	if err != nil {
		t.Fatalf("NewBuilder: %v", err)
	}
	return b
}

// checkSet runs every validation a snapshot gets, independently of Push.
func checkSet(t *testing.T, kind NodeKind, s *Set) {
	t.Helper()
	var all []types.Resource
	for _, r := range s.Listeners {
		all = append(all, r)
	}
	for _, r := range s.Routes {
		all = append(all, r)
	}
	for _, r := range s.Clusters {
		all = append(all, r)
	}
	for _, r := range s.Endpoints {
		all = append(all, r)
	}
	for _, r := range all {
		if err := xdscontract.ValidateDeep(r); err != nil {
			t.Errorf("%s: validateDeep(%T): %v", kind, r, err)
		}
	}
	if err := checkReferences(kind, s); err != nil {
		t.Errorf("%s: checkReferences: %v", kind, err)
	}
	var v [numTypes]uint64
	for i := range v {
		v[i] = 1
	}
	if err := newSnapshot(s, &v, nil).Consistent(); err != nil {
		t.Errorf("%s: Consistent: %v", kind, err)
	}
}

// unpackHCM unpacks an HttpConnectionManager and checks its filters: the
// router last, preceded in the Envoy listener by a fault filter that does
// nothing on its own.
func unpackHCM(t *testing.T, a *anypb.Any) *hcm.HttpConnectionManager {
	t.Helper()
	var m hcm.HttpConnectionManager
	if err := a.UnmarshalTo(&m); err != nil {
		t.Fatalf("unpack HttpConnectionManager: %v", err)
	}
	fs := m.GetHttpFilters()
	if n := len(fs); n == 0 || n > 2 || fs[n-1].GetName() != wellknown.Router {
		t.Fatalf("http filters = %v, want [%s] %s", fs, wellknown.Fault, wellknown.Router)
	}
	var r router.Router
	if err := fs[len(fs)-1].GetTypedConfig().UnmarshalTo(&r); err != nil {
		t.Fatalf("router typed config: %v", err)
	}
	if len(fs) == 2 {
		var f fault.HTTPFault
		if fs[0].GetName() != wellknown.Fault {
			t.Fatalf("first filter %q, want %s", fs[0].GetName(), wellknown.Fault)
		}
		if err := fs[0].GetTypedConfig().UnmarshalTo(&f); err != nil || f.GetAbort() != nil || f.GetDelay() != nil {
			t.Fatalf("listener-level fault config %v (err %v), want no fault", &f, err)
		}
	}
	return &m
}

// clusterByName and claByName find resources of a Set by name (nil if
// absent).
func clusterByName(s *Set, name string) *cluster.Cluster {
	for _, c := range s.Clusters {
		if c.GetName() == name {
			return c
		}
	}
	return nil
}

func claByName(s *Set, name string) *endpoint.ClusterLoadAssignment {
	for _, c := range s.Endpoints {
		if c.GetClusterName() == name {
			return c
		}
	}
	return nil
}

func routeByName(rc *route.RouteConfiguration, name string) *route.Route {
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		if r.GetName() == name {
			return r
		}
	}
	return nil
}

func TestBuildShapes(t *testing.T) {
	twoModels := State{Models: []Model{
		{Name: "meta-llama/Llama-3.1-70B-Instruct-AWQ", Localities: []Locality{
			local(ep("c1", "10.0.0.1", 8000, 3), ep("c2", "10.0.0.2", 8000, 1)),
			{Region: "eu-west", Zone: "eu-west-1b", Weight: 20, Endpoints: []Endpoint{ep("gw-eu", "10.1.0.1", 443, 1)}},
			{Region: "ap-south", Weight: 5, Priority: 1, Endpoints: []Endpoint{ep("gw-ap", "10.2.0.1", 443, 1)}},
		}},
		{Name: "qwen/Qwen2.5-7B", Localities: []Locality{local(ep("c3", "10.0.0.3", 8001, 7))}},
	}}
	oneModel := State{Models: []Model{{Name: "m1", Localities: []Locality{local(ep("c1", "::ffff:10.0.0.1", 8000, 2))}}}}
	tests := []struct {
		name   string
		policy xdscontract.LBPolicy
		state  State
		models []string
		// localities per model, in canonical order, as region/zone:weight:priority
		localities map[string][]string
	}{
		{name: "one model least_request", state: oneModel, models: []string{"m1"},
			localities: map[string][]string{"m1": {"us-east/us-east-1a:1:0"}}},
		{name: "one model ring_hash", policy: xdscontract.RingHash, state: oneModel, models: []string{"m1"}},
		{name: "one model round_robin", policy: xdscontract.RoundRobin, state: oneModel, models: []string{"m1"}},
		{name: "two models three localities ring_hash", policy: xdscontract.RingHash, state: twoModels,
			models: []string{"meta-llama/Llama-3.1-70B-Instruct-AWQ", "qwen/Qwen2.5-7B"},
			localities: map[string][]string{
				"meta-llama/Llama-3.1-70B-Instruct-AWQ": {"eu-west/eu-west-1b:20:0", "us-east/us-east-1a:1:0", "ap-south/:5:1"},
				"qwen/Qwen2.5-7B":                       {"us-east/us-east-1a:1:0"},
			}},
		{name: "no models", state: State{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.LBPolicy = tc.policy
			res, err := mustBuilder(t, cfg).Build(tc.state)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			checkSet(t, KindEnvoy, &res.Envoy)
			checkSet(t, KindGRPC, &res.GRPC)
			n := len(tc.models)
			// Per model: main, local, two classes (every endpoint has
			// max_model_len 8192) and the same two local classes.
			if len(res.Envoy.Listeners) != 1 || len(res.Envoy.Routes) != 1 || len(res.Envoy.Clusters) != 6*n || len(res.Envoy.Endpoints) != 6*n {
				t.Fatalf("envoy set sizes L%d R%d C%d E%d, want 1 1 %d %d", len(res.Envoy.Listeners), len(res.Envoy.Routes),
					len(res.Envoy.Clusters), len(res.Envoy.Endpoints), 6*n, 6*n)
			}
			if len(res.GRPC.Listeners) != n || len(res.GRPC.Routes) != 0 || len(res.GRPC.Clusters) != n || len(res.GRPC.Endpoints) != n {
				t.Fatalf("grpc set sizes L%d R%d C%d E%d, want %d 0 %d %d", len(res.GRPC.Listeners), len(res.GRPC.Routes),
					len(res.GRPC.Clusters), len(res.GRPC.Endpoints), n, n, n)
			}

			// Envoy listener: a real socket and RDS over ADS.
			l := res.Envoy.Listeners[0]
			if sa := l.GetAddress().GetSocketAddress(); sa.GetAddress() != "0.0.0.0" || sa.GetPortValue() != 10000 {
				t.Errorf("listener address = %v, want 0.0.0.0:10000", sa)
			}
			m := unpackHCM(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig())
			if m.GetRds().GetRouteConfigName() != xdscontract.RouteName || m.GetRds().GetConfigSource().GetAds() == nil {
				t.Errorf("listener RDS = %v, want %s over ADS", m.GetRds(), xdscontract.RouteName)
			}

			// Routes: per model 4 class routes and a fallback for forwarded
			// traffic, 4 class routes and a main route for clients; the
			// same again as a catch-all only with one model.
			rc := res.Envoy.Routes[0]
			routes := rc.GetVirtualHosts()[0].GetRoutes()
			wantRoutes := 10 * n
			if n == 1 {
				wantRoutes *= 2
			}
			if len(routes) != wantRoutes {
				t.Fatalf("%d routes, want %d", len(routes), wantRoutes)
			}
			for i, name := range tc.models {
				r := routeByName(rc, name)
				if r == nil {
					t.Fatalf("no route named %q", name)
				}
				h := r.GetMatch().GetHeaders()
				if len(h) != 2 || h[0].GetName() != "x-isobar-model" || h[0].GetStringMatch().GetExact() != name ||
					h[1].GetName() != xdscontract.ResidencyHeader || !h[1].GetPresentMatch() || !h[1].GetInvertMatch() {
					t.Errorf("route %d headers = %v, want x-isobar-model == %q and no residency header", i, h, name)
				}
				a := r.GetRoute()
				if a.GetCluster() != xdscontract.ClusterName(name) || a.GetTimeout().AsDuration() != 600*time.Second {
					t.Errorf("route %d action = cluster %q timeout %v", i, a.GetCluster(), a.GetTimeout().AsDuration())
				}
				if rp := a.GetRetryPolicy(); rp.GetNumRetries().GetValue() != 2 || !strings.Contains(rp.GetRetryOn(), "connect-failure") ||
					len(rp.GetRetriableStatusCodes()) != 1 || rp.GetRetriableStatusCodes()[0] != 503 {
					t.Errorf("route %d retry policy = %v", i, rp)
				}
			}
			if ca := routeByName(rc, "catch_all"); n == 1 && (ca != routes[len(routes)-1] || len(ca.GetMatch().GetHeaders()) != 1 ||
				ca.GetRoute().GetCluster() != xdscontract.ClusterName(tc.models[0])) {
				t.Errorf("catch-all route = %v", ca)
			}

			for i, name := range tc.models {
				c := clusterByName(&res.Envoy, xdscontract.ClusterName(name))
				if c != res.GRPC.Clusters[i] {
					t.Errorf("cluster %d: the gRPC set does not share the Envoy set's main cluster", i)
				}
				if c.GetName() != xdscontract.ClusterName(name) || c.GetType() != cluster.Cluster_EDS || c.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil {
					t.Errorf("cluster %d = %s type %v", i, c.GetName(), c.GetType())
				}
				if strings.ContainsAny(c.GetAltStatName(), "./") {
					t.Errorf("alt_stat_name %q has a dot or slash", c.GetAltStatName())
				}
				switch tc.policy {
				case xdscontract.RingHash:
					rh := c.GetRingHashLbConfig()
					if c.GetLbPolicy() != cluster.Cluster_RING_HASH || rh.GetHashFunction() != cluster.Cluster_RingHashLbConfig_XX_HASH ||
						rh.GetMinimumRingSize().GetValue() != 4096 {
						t.Errorf("cluster %d policy %v ring %v", i, c.GetLbPolicy(), rh)
					}
				case xdscontract.RoundRobin:
					if c.GetLbPolicy() != cluster.Cluster_ROUND_ROBIN {
						t.Errorf("cluster %d policy %v", i, c.GetLbPolicy())
					}
				default:
					lr := leastRequestOf(t, c)
					if lr.GetChoiceCount().GetValue() != 2 || lr.GetSelectionMethod() != leastrequest.LeastRequest_N_CHOICES ||
						lr.GetLocalityLbConfig().GetLocalityWeightedLbConfig() == nil || c.GetLbConfig() != nil {
						t.Errorf("cluster %d least_request %v (legacy lb_config %v)", i, lr, c.GetLbConfig())
					}
				}
				th := c.GetCircuitBreakers().GetThresholds()[0]
				if th.GetRetryBudget().GetBudgetPercent().GetValue() != 20 || th.GetRetryBudget().GetMinRetryConcurrency().GetValue() != 3 {
					t.Errorf("cluster %d retry budget %v", i, th.GetRetryBudget())
				}
				od := c.GetOutlierDetection()
				if od.GetConsecutive_5Xx().GetValue() != 5 || od.GetInterval().AsDuration() != 5*time.Second ||
					od.GetBaseEjectionTime().AsDuration() != 10*time.Second || od.GetMaxEjectionPercent().GetValue() != 50 {
					t.Errorf("cluster %d outlier detection %v", i, od)
				}
				if c.GetConnectTimeout().AsDuration() != time.Second {
					t.Errorf("cluster %d connect timeout %v", i, c.GetConnectTimeout().AsDuration())
				}

				// gRPC listener: named after the model, route inlined to the cluster.
				gl := res.GRPC.Listeners[i]
				if gl.GetName() != name || gl.GetAddress() != nil {
					t.Errorf("grpc listener %d = %q address %v", i, gl.GetName(), gl.GetAddress())
				}
				gm := unpackHCM(t, gl.GetApiListener().GetApiListener())
				gr := gm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute()
				if gr.GetCluster() != xdscontract.ClusterName(name) || gr.GetMaxStreamDuration().GetMaxStreamDuration().AsDuration() != 600*time.Second {
					t.Errorf("grpc listener %d route = %v", i, gr)
				}

				cla := res.GRPC.Endpoints[i]
				if cla.GetClusterName() != xdscontract.ClusterName(name) || claByName(&res.Envoy, xdscontract.ClusterName(name)) != cla {
					t.Errorf("assignment %d named %q", i, cla.GetClusterName())
				}
				if want, ok := tc.localities[name]; ok {
					var got []string
					for _, l := range cla.GetEndpoints() {
						got = append(got, l.GetLocality().GetRegion()+"/"+l.GetLocality().GetZone()+":"+
							itoa(l.GetLoadBalancingWeight().GetValue())+":"+itoa(l.GetPriority()))
					}
					if strings.Join(got, ",") != strings.Join(want, ",") {
						t.Errorf("localities of %s = %v, want %v", name, got, want)
					}
				}
			}
		})
	}
}

func itoa(v uint32) string {
	const digits = "0123456789"
	if v < 10 {
		return digits[v : v+1]
	}
	return itoa(v/10) + digits[v%10:v%10+1]
}

func TestBuildEndpointWeightsAndMetadata(t *testing.T) {
	st := State{Models: []Model{{Name: "m", Localities: []Locality{local(
		Endpoint{CellID: "b", Host: "10.0.0.2", Port: 8000, Weight: 5},
		Endpoint{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 2, MaxModelLen: 4096},
		Endpoint{CellID: "v6", Host: "2001:db8::1", Port: 8000, Weight: 9},
	)}}}}
	res, err := mustBuilder(t, testConfig()).Build(st)
	if err != nil {
		t.Fatal(err)
	}
	lbs := res.Envoy.Endpoints[0].GetEndpoints()[0].GetLbEndpoints()
	type row struct {
		cell, addr string
		weight     uint32
		maxLen     float64
		hasMaxLen  bool
	}
	var got []row
	for _, e := range lbs {
		md := e.GetMetadata().GetFilterMetadata()[xdscontract.MetadataKey].GetFields()
		ml, has := md["max_model_len"]
		got = append(got, row{md["cell"].GetStringValue(), e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(),
			e.GetLoadBalancingWeight().GetValue(), ml.GetNumberValue(), has})
		cell, maxLen := xdscontract.EndpointMetadata(e.GetMetadata())
		if cell != md["cell"].GetStringValue() || float64(maxLen) != ml.GetNumberValue() {
			t.Errorf("EndpointMetadata = %q %d, want %q %v", cell, maxLen, md["cell"].GetStringValue(), ml.GetNumberValue())
		}
	}
	want := []row{{"a", "10.0.0.1", 2, 4096, true}, {"b", "10.0.0.2", 5, 0, false}, {"v6", "2001:db8::1", 9, 0, false}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("endpoint %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// leastRequestOf returns c's typed least_request policy, failing the test
// when c has another policy or the message inside the Any is invalid.
func leastRequestOf(t *testing.T, c *cluster.Cluster) *leastrequest.LeastRequest {
	t.Helper()
	pols := c.GetLoadBalancingPolicy().GetPolicies()
	if len(pols) == 0 || pols[0].GetTypedExtensionConfig().GetName() != xdscontract.LeastRequestExtension {
		t.Fatalf("cluster %s load_balancing_policy %v, want %s first", c.GetName(), c.GetLoadBalancingPolicy(), xdscontract.LeastRequestExtension)
	}
	var lr leastrequest.LeastRequest
	if err := pols[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&lr); err != nil {
		t.Fatal(err)
	}
	if err := lr.ValidateAll(); err != nil {
		t.Fatalf("packed LeastRequest invalid: %v", err)
	}
	return &lr
}

// Least request: choice_count from Config, or FULL_SCAN; every cluster of
// the Envoy and gRPC sets carries it.
func TestLeastRequestPolicyOptions(t *testing.T) {
	st := State{Models: []Model{fleet("m", 3)}}
	for _, tc := range []struct {
		name    string
		edit    func(*Config)
		choices uint32
		method  leastrequest.LeastRequest_SelectionMethod
	}{
		{"default P2C", func(*Config) {}, 2, leastrequest.LeastRequest_N_CHOICES},
		{"three choices", func(c *Config) { c.ChoiceCount = 3 }, 3, leastrequest.LeastRequest_N_CHOICES},
		{"full scan", func(c *Config) { c.FullScan = true }, 2, leastrequest.LeastRequest_FULL_SCAN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.edit(&cfg)
			res, err := mustBuilder(t, cfg).Build(st)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range append(slices.Clone(res.Envoy.Clusters), res.GRPC.Clusters...) {
				if err := xdscontract.ValidateDeep(c); err != nil {
					t.Fatal(err)
				}
				lr := leastRequestOf(t, c)
				if lr.GetChoiceCount().GetValue() != tc.choices || lr.GetSelectionMethod() != tc.method {
					t.Errorf("%s: choice_count %d method %v, want %d %v", c.GetName(), lr.GetChoiceCount().GetValue(),
						lr.GetSelectionMethod(), tc.choices, tc.method)
				}
			}
		})
	}
}

// A Degraded endpoint is published with EDS health DEGRADED at its weight;
// a health change alone rebuilds the assignment. A probe budget is
// endpoint metadata.
func TestBuildDegradedHealthAndProbeBudget(t *testing.T) {
	mk := func(degraded bool) State {
		return State{Models: []Model{{Name: "m", Localities: []Locality{local(
			Endpoint{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 100},
			Endpoint{CellID: "b", Host: "10.0.0.2", Port: 8000, Weight: 100, Degraded: degraded},
		)}}}}
	}
	b := mustBuilder(t, testConfig())
	health := func(res *Resources) []core.HealthStatus {
		var out []core.HealthStatus
		for _, e := range res.Envoy.Endpoints[0].GetEndpoints()[0].GetLbEndpoints() {
			if e.GetLoadBalancingWeight().GetValue() != 100 {
				t.Errorf("weight %d, want 100", e.GetLoadBalancingWeight().GetValue())
			}
			out = append(out, e.GetHealthStatus())
		}
		return out
	}
	// A probe budget rides in the endpoint metadata.
	probing := mk(false)
	probing.Models[0].Localities[0].Endpoints[1].ProbeBudget = 3
	rp, err := b.Build(probing)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &rp.Envoy)
	lbs := rp.Envoy.Endpoints[0].GetEndpoints()[0].GetLbEndpoints()
	budget := func(i int) (float64, bool) {
		v, ok := lbs[i].GetMetadata().GetFilterMetadata()[xdscontract.MetadataKey].GetFields()[xdscontract.MetadataProbeBudget]
		return v.GetNumberValue(), ok
	}
	if n, ok := budget(1); !ok || n != 3 {
		t.Errorf("probe budget of b = %v %v, want 3", n, ok)
	}
	if _, ok := budget(0); ok {
		t.Error("a carries a probe budget")
	}
	r1, err := b.Build(mk(false))
	if err != nil {
		t.Fatal(err)
	}
	if got := health(r1); !slices.Equal(got, []core.HealthStatus{core.HealthStatus_UNKNOWN, core.HealthStatus_UNKNOWN}) {
		t.Fatalf("healthy: %v", got)
	}
	r2, err := b.Build(mk(true))
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, KindEnvoy, &r2.Envoy)
	if got := health(r2); !slices.Equal(got, []core.HealthStatus{core.HealthStatus_UNKNOWN, core.HealthStatus_DEGRADED}) {
		t.Fatalf("derated: %v", got)
	}
	if r2.Envoy.Endpoints[0] == r1.Envoy.Endpoints[0] {
		t.Fatal("a health change did not rebuild the assignment")
	}
	if err := r2.Envoy.Endpoints[0].ValidateAll(); err != nil {
		t.Fatal(err)
	}
}

func TestBuildRefusesInvalidStates(t *testing.T) {
	ok := func() Model {
		return Model{Name: "m", Localities: []Locality{local(ep("c1", "10.0.0.1", 8000, 1), ep("c2", "10.0.0.2", 8000, 1))}}
	}
	tests := []struct {
		name  string
		edit  func(*State)
		wants []string
	}{
		{"endpoint weight 0", func(s *State) { s.Models[0].Localities[0].Endpoints[1].Weight = 0 }, []string{`cell "c2": weight 0`}},
		{"locality weight 0", func(s *State) { s.Models[0].Localities[0].Weight = 0 }, []string{"locality weight 0"}},
		{"duplicate address in a locality", func(s *State) { s.Models[0].Localities[0].Endpoints[1].Host = "10.0.0.1" },
			[]string{"address 10.0.0.1:8000 is also cell \"c1\"'s"}},
		{"duplicate address across localities", func(s *State) {
			s.Models[0].Localities = append(s.Models[0].Localities, Locality{Region: "eu", Weight: 1,
				Endpoints: []Endpoint{ep("gw", "::ffff:10.0.0.2", 8000, 1)}})
		}, []string{`cell "gw": address 10.0.0.2:8000 is also cell "c2"'s`}},
		{"duplicate cell", func(s *State) { s.Models[0].Localities[0].Endpoints[1].CellID = "c1" }, []string{`cell "c1": listed twice`}},
		{"empty model name", func(s *State) { s.Models[0].Name = "" }, []string{"model #0: name is empty"}},
		{"model name with a space", func(s *State) { s.Models[0].Name = "my model" }, []string{"contains byte 0x20"}},
		{"duplicate model", func(s *State) { s.Models = append(s.Models, ok()) }, []string{`model "m": listed twice`}},
		{"hostname", func(s *State) { s.Models[0].Localities[0].Endpoints[0].Host = "cell1.local" },
			[]string{`host "cell1.local" is not an IP address`}},
		{"port 0", func(s *State) { s.Models[0].Localities[0].Endpoints[0].Port = 0 }, []string{"port 0 is out of range"}},
		{"port too big", func(s *State) { s.Models[0].Localities[0].Endpoints[0].Port = 70000 }, []string{"port 70000 is out of range"}},
		{"empty cell id", func(s *State) { s.Models[0].Localities[0].Endpoints[0].CellID = "" }, []string{"cell id is empty"}},
		{"priority gap", func(s *State) {
			s.Models[0].Localities = append(s.Models[0].Localities, Locality{Region: "eu", Weight: 1, Priority: 2})
		}, []string{"priorities have a gap, 1 is missing"}},
		{"duplicate locality", func(s *State) {
			s.Models[0].Localities = append(s.Models[0].Localities, Locality{Region: "us-east", Zone: "us-east-1a", Weight: 1})
		}, []string{"listed twice at the same priority"}},
		{"endpoint weights overflow", func(s *State) {
			s.Models[0].Localities[0].Endpoints[0].Weight = 1 << 31
			s.Models[0].Localities[0].Endpoints[1].Weight = 1 << 31
		}, []string{"endpoint weights sum to 4294967296"}},
		{"several problems at once", func(s *State) {
			s.Models[0].Localities[0].Endpoints[0].Weight = 0
			s.Models[0].Localities[0].Endpoints[1].Port = 0
		}, []string{`cell "c1": weight 0`, `cell "c2": port 0`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := State{Models: []Model{ok()}}
			tc.edit(&st)
			b := mustBuilder(t, testConfig())
			res, err := b.Build(st)
			if !errors.Is(err, ErrInvalidState) {
				t.Fatalf("Build = %v, %v; want ErrInvalidState", res, err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			// The builder is still usable and a good state still builds.
			if _, err := b.Build(State{Models: []Model{ok()}}); err != nil {
				t.Errorf("Build(good) after refusal: %v", err)
			}
		})
	}
}

func TestBuildErrorListIsBounded(t *testing.T) {
	m := fleet("m", 50)
	for i := range m.Localities[0].Endpoints {
		m.Localities[0].Endpoints[i].Weight = 0
	}
	_, err := mustBuilder(t, testConfig()).Build(State{Models: []Model{m}})
	if !errors.Is(err, ErrInvalidState) || !strings.HasSuffix(err.Error(), "and 40 more") {
		t.Fatalf("err = %v, want 10 problems and 40 more", err)
	}
}

func TestBuildIsCanonicalAndDeterministic(t *testing.T) {
	a := fleet("a", 40)
	a.Localities = append(a.Localities,
		Locality{Region: "eu", Zone: "z1", Weight: 3, Endpoints: []Endpoint{ep("eu1", "10.9.0.1", 1, 1)}},
		Locality{Region: "ap", Weight: 2, Priority: 1, Endpoints: []Endpoint{ep("ap1", "10.9.0.2", 1, 1)}})
	b := fleet("b", 7)
	base := State{Models: []Model{a, b}}

	shuffled := State{Models: []Model{b, a}}
	rng := rand.New(rand.NewPCG(1, 2))
	shuffled.Models[1].Localities = append([]Locality(nil), a.Localities...)
	rng.Shuffle(len(shuffled.Models[1].Localities), func(i, j int) {
		ls := shuffled.Models[1].Localities
		ls[i], ls[j] = ls[j], ls[i]
	})
	for i := range shuffled.Models[1].Localities {
		l := &shuffled.Models[1].Localities[i]
		l.Endpoints = append([]Endpoint(nil), l.Endpoints...)
		rng.Shuffle(len(l.Endpoints), func(i, j int) { l.Endpoints[i], l.Endpoints[j] = l.Endpoints[j], l.Endpoints[i] })
	}

	r1, err := mustBuilder(t, testConfig()).Build(base)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := mustBuilder(t, testConfig()).Build(shuffled)
	if err != nil {
		t.Fatal(err)
	}
	if len(r1.Envoy.Endpoints) != len(r2.Envoy.Endpoints) || len(r1.Envoy.Clusters) != len(r2.Envoy.Clusters) {
		t.Fatalf("set sizes differ between input orders")
	}
	for i := range r1.Envoy.Endpoints {
		if !proto.Equal(r1.Envoy.Endpoints[i], r2.Envoy.Endpoints[i]) {
			t.Errorf("assignment %d differs between input orders", i)
		}
	}
	for i := range r1.Envoy.Clusters {
		if !proto.Equal(r1.Envoy.Clusters[i], r2.Envoy.Clusters[i]) {
			t.Errorf("cluster %d differs between input orders", i)
		}
	}
	for i := range r1.GRPC.Listeners {
		if !proto.Equal(r1.GRPC.Listeners[i], r2.GRPC.Listeners[i]) {
			t.Errorf("grpc listener %d differs between input orders", i)
		}
	}
	if !proto.Equal(r1.Envoy.Routes[0], r2.Envoy.Routes[0]) || !proto.Equal(r1.Envoy.Listeners[0], r2.Envoy.Listeners[0]) {
		t.Error("route or listener differs between input orders")
	}
	// The builder must not have reordered the caller's slices.
	if shuffled.Models[0].Name != "b" {
		t.Error("Build reordered the caller's models")
	}
}

func TestBuildReusesUnchangedResources(t *testing.T) {
	b := mustBuilder(t, testConfig())
	st := State{Models: []Model{fleet("a", 5), fleet("b", 5)}}
	r1, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	// Same state: every pointer reused.
	r2, _ := b.Build(st)
	for t2 := range numTypes {
		if !sameResources(&r1.Envoy, &r2.Envoy, t2) || !sameResources(&r1.GRPC, &r2.GRPC, t2) {
			t.Errorf("type %d rebuilt for an identical state", t2)
		}
	}
	// A weight change in b rebuilds only b's assignments.
	st.Models[1].Localities[0].Endpoints[2].Weight += 10
	r3, _ := b.Build(st)
	for _, name := range []string{xdscontract.ClusterName("a"), xdscontract.LocalClusterName("a"), xdscontract.ClassClusterName("a", 4096), xdscontract.LocalClassClusterName("a", 32768)} {
		if x := claByName(&r3.Envoy, name); x == nil || x != claByName(&r1.Envoy, name) {
			t.Errorf("weight change in b: assignment %s rebuilt or missing", name)
		}
	}
	for _, name := range []string{xdscontract.ClusterName("b"), xdscontract.LocalClusterName("b"), xdscontract.ClassClusterName("b", 4096), xdscontract.LocalClassClusterName("b", 32768)} {
		if x := claByName(&r3.Envoy, name); x == nil || x == claByName(&r1.Envoy, name) {
			t.Errorf("weight change in b: assignment %s reused or missing", name)
		}
	}
	if r3.GRPC.Endpoints[0] != r1.GRPC.Endpoints[0] || r3.GRPC.Endpoints[1] == r1.GRPC.Endpoints[1] {
		t.Error("weight change in b: want a's gRPC assignment reused and b's rebuilt")
	}
	for _, typ := range []resourceType{typeListener, typeRoute, typeCluster} {
		if !sameResources(&r1.Envoy, &r3.Envoy, typ) || !sameResources(&r1.GRPC, &r3.GRPC, typ) {
			t.Errorf("weight change rebuilt type %d", typ)
		}
	}
	// Mutating the input after Build does not leak into the cache.
	st.Models[1].Localities[0].Endpoints[2].Weight = 1
	r4, _ := b.Build(st)
	if claByName(&r4.Envoy, xdscontract.ClusterName("b")) == claByName(&r3.Envoy, xdscontract.ClusterName("b")) {
		t.Error("a caller-side mutation was not seen as a change")
	}
	// A new model changes routes, clusters and gRPC listeners, not the Envoy listener.
	st.Models = append(st.Models, fleet("c", 1))
	r5, _ := b.Build(st)
	if !sameResources(&r4.Envoy, &r5.Envoy, 0) || sameResources(&r4.Envoy, &r5.Envoy, 1) ||
		sameResources(&r4.Envoy, &r5.Envoy, 2) || sameResources(&r4.GRPC, &r5.GRPC, 0) {
		t.Error("adding a model: want the Envoy listener reused, routes, clusters and gRPC listeners rebuilt")
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no region", func(c *Config) { c.Region = "" }, "Region is empty"},
		{"bad policy", func(c *Config) { c.LBPolicy = "maglev" }, `LBPolicy "maglev" is unknown`},
		{"small ring", func(c *Config) { c.RingSize = 64 }, "RingSize 64 is out of range"},
		{"one choice", func(c *Config) { c.ChoiceCount = 1 }, "ChoiceCount 1 is out of range"},
		{"hostname listener", func(c *Config) { c.ListenAddress = "localhost" }, "ListenAddress \"localhost\" is not an IP address"},
		{"big port", func(c *Config) { c.ListenPort = 70000 }, "ListenPort 70000"},
		{"negative timeout", func(c *Config) { c.RouteTimeout = -time.Second }, "RouteTimeout -1s is below 1ms"},
		{"budget above 100", func(c *Config) { c.RetryBudgetPercent = 150 }, "RetryBudgetPercent 150"},
		{"ejection above 100", func(c *Config) { c.OutlierMaxEjectionPercent = 101 }, "OutlierMaxEjectionPercent 101"},
		{"upper-case header", func(c *Config) { c.ModelHeader = "X-Model" }, `ModelHeader "X-Model" is not a valid header name`},
		{"same headers", func(c *Config) { c.HopHeader = "x-isobar-model" }, "must differ"},
		{"too many retries", func(c *Config) { c.NumRetries = 11 }, "NumRetries 11"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.edit(&cfg)
			_, err := NewBuilder(cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewBuilder = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
			_, err = NewServer(cfg, Deps{})
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("NewServer = %v, want ErrInvalidConfig", err)
			}
		})
	}
	got := mustBuilder(t, Config{Region: "r"}).Config()
	want := Config{Region: "r", LBPolicy: xdscontract.LeastRequest, ChoiceCount: 2, RingSize: 4096, ListenAddress: "0.0.0.0", ListenPort: 10000,
		RouteTimeout: 600 * time.Second, ConnectTimeout: time.Second, NumRetries: 2, RetryBudgetPercent: 20,
		RetryBudgetMinConcurrency: 3, MaxRequests: 65536, OutlierConsecutive5xx: 5, OutlierConsecutiveLocalOrigin: 1, OutlierInterval: 5 * time.Second,
		OutlierBaseEjectionTime: 10 * time.Second, OutlierMaxEjectionPercent: 50, ModelHeader: "x-isobar-model", HopHeader: "x-isobar-hop",
		ContextClasses: []uint32{4096, 8192, 32768, 131072}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults = %+v\nwant %+v", got, want)
	}
}

func TestAssignmentsHoldNoAny(t *testing.T) {
	res, err := mustBuilder(t, testConfig()).Build(State{Models: []Model{fleet("m", 3)}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = protorange.Range(res.Envoy.Endpoints[0].ProtoReflect(), func(v protopath.Values) error {
		if m, ok := v.Index(-1).Value.Interface().(protoreflect.Message); ok && m.Descriptor().FullName() == "google.protobuf.Any" {
			n++
		}
		return nil
	})
	if err != nil || n != 0 {
		t.Fatalf("assignment holds %d Any (err %v); buildLoadAssignment relies on ValidateAll alone", n, err)
	}
}

func TestCheckReferences(t *testing.T) {
	good := func() *Set {
		res, err := mustBuilder(t, testConfig()).Build(State{Models: []Model{fleet("a", 2), fleet("b", 2)}})
		if err != nil {
			t.Fatal(err)
		}
		return &res.Envoy
	}
	grpcGood := func() *Set {
		res, _ := mustBuilder(t, testConfig()).Build(State{Models: []Model{fleet("a", 2), fleet("b", 2)}})
		return &res.GRPC
	}
	tests := []struct {
		name string
		set  func() *Set
		want string
	}{
		{"route to a missing cluster", func() *Set {
			s := good()
			s.Clusters = slices.DeleteFunc(s.Clusters, func(c *cluster.Cluster) bool { return c.GetName() == "isobar/b" })
			s.Endpoints = slices.DeleteFunc(s.Endpoints, func(c *endpoint.ClusterLoadAssignment) bool { return c.GetClusterName() == "isobar/b" })
			return s
		}, `points at cluster "isobar/b"`},
		{"api_listener to a missing cluster", func() *Set {
			s := grpcGood()
			s.Clusters = s.Clusters[1:]
			s.Endpoints = s.Endpoints[1:]
			return s
		}, `api_listener "a" routes to cluster "isobar/a"`},
		{"cluster without assignment", func() *Set {
			s := good()
			s.Endpoints = slices.DeleteFunc(s.Endpoints, func(c *endpoint.ClusterLoadAssignment) bool { return c.GetClusterName() == "isobar/b" })
			return s
		}, `cluster "isobar/b" has no ClusterLoadAssignment`},
		{"route to a missing class cluster", func() *Set {
			s := good()
			s.Clusters = slices.DeleteFunc(s.Clusters, func(c *cluster.Cluster) bool { return c.GetName() == "isobar/a/local/ctx-8192" })
			s.Endpoints = slices.DeleteFunc(s.Endpoints, func(c *endpoint.ClusterLoadAssignment) bool { return c.GetClusterName() == "isobar/a/local/ctx-8192" })
			return s
		}, `points at cluster "isobar/a/local/ctx-8192"`},
		{"assignment without cluster", func() *Set {
			s := good()
			s.Endpoints = append(s.Endpoints, &endpoint.ClusterLoadAssignment{ClusterName: "stray"})
			return s
		}, `"stray" belongs to no cluster`},
		{"api_listener with RDS", func() *Set {
			s := grpcGood()
			a, _ := anypb.New(&hcm.HttpConnectionManager{StatPrefix: "x", RouteSpecifier: &hcm.HttpConnectionManager_Rds{
				Rds: &hcm.Rds{RouteConfigName: "r", ConfigSource: &core.ConfigSource{}}}})
			s.Listeners = append(s.Listeners, &listener.Listener{Name: "c", ApiListener: &listener.ApiListener{ApiListener: a}})
			return s
		}, "has no inline route"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkReferences(KindEnvoy, tc.set())
			if !errors.Is(err, xdscontract.ErrInvalidResource) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkReferences = %v, want %q", err, tc.want)
			}
		})
	}
	if err := checkReferences(KindEnvoy, good()); err != nil {
		t.Fatalf("good set: %v", err)
	}
}

func TestClassifyNode(t *testing.T) {
	for ua, want := range map[string]NodeKind{"gRPC Go": KindGRPC, "gRPC Java": KindGRPC, "envoy": KindEnvoy, "": KindEnvoy, "isobar-gateway": KindEnvoy, "gRPCish": KindEnvoy} {
		if got := ClassifyNode(&core.Node{UserAgentName: ua}); got != want {
			t.Errorf("ClassifyNode(%q) = %s, want %s", ua, got, want)
		}
	}
	if got := ClassifyNode(nil); got != KindEnvoy {
		t.Errorf("ClassifyNode(nil) = %s", got)
	}
}

// TestPrevAtFollowsTheShift: after an endpoint leaves or joins a
// locality, the endpoints after it are still found at their previous
// build's place, shifted, and an endpoint that is new is not found there.
func TestPrevAtFollowsTheShift(t *testing.T) {
	key := func(c string) endpointKey { return endpointKey{cell: c, host: "10.0.0.1", port: 8000} }
	var prev []*endpointParts
	for _, c := range []string{"a", "b", "c", "d", "e"} {
		prev = append(prev, &endpointParts{key: key(c)})
	}
	e := &modelEntry{pos: [][]*endpointParts{prev}}
	for _, tc := range []struct {
		name string
		now  []string
		want []int // index into prev, -1: not found
	}{
		{"unchanged", []string{"a", "b", "c", "d", "e"}, []int{0, 1, 2, 3, 4}},
		{"b left", []string{"a", "c", "d", "e"}, []int{0, 2, 3, 4}},
		{"a and c left", []string{"b", "d", "e"}, []int{1, 3, 4}},
		{"x joined", []string{"a", "b", "x", "c", "d", "e"}, []int{0, 1, -1, 2, 3, 4}},
		{"x joined, d left", []string{"a", "x", "b", "c", "e"}, []int{0, -1, 1, 2, 4}},
	} {
		for j, c := range tc.now {
			k := key(c)
			got := e.prevAt(0, j, &k)
			switch w := tc.want[j]; {
			case w < 0 && got != nil:
				t.Errorf("%s: %q at %d: found %q, want none", tc.name, c, j, got.key.cell)
			case w >= 0 && got != prev[w]:
				t.Errorf("%s: %q at %d: not found at its shifted place %d", tc.name, c, j, w)
			}
		}
	}
	k := key("a")
	if got := e.prevAt(1, 0, &k); got != nil {
		t.Errorf("a locality the previous build did not have: found %v", got)
	}
}
