package xdsclient

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

func builtSet(t testing.TB) xds.Set {
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	st := xds.State{Models: []xds.Model{{Name: "m", Shed: 0.25, Localities: []xds.Locality{
		{Weight: 3, Endpoints: []xds.Endpoint{{CellID: "a", Host: "10.0.0.1", Port: 8000, Weight: 2, MaxModelLen: 8192}}},
		{Region: "r2", Zone: "r2", Weight: 1, Priority: 1, Endpoints: []xds.Endpoint{{CellID: "region/r2", Host: "::ffff:10.9.0.1", Port: 443, Weight: 1}}},
	}}}}
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	return res.Envoy
}

func anys[T proto.Message](t testing.TB, ms []T) []*anypb.Any {
	var out []*anypb.Any
	for _, m := range ms {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// The gateway reads back what the regional controller writes.
func TestDecodeControllerResources(t *testing.T) {
	s := builtSet(t)
	dec := Decoder{ModelHeader: "x-isobar-model"}
	clusters, err := dec.DecodeClusters(anys(t, s.Clusters))
	if err != nil {
		t.Fatal(err)
	}
	p := clusters[xdscontract.ClusterName("m")]
	want := ClusterPolicy{Name: "isobar/m", ServiceName: "isobar/m", LBPolicy: "LEAST_REQUEST", LocalityWeighted: true, ChoiceCount: 2,
		ActiveRequestBias: 1, ConnectTimeout: time.Second, MaxRequests: 65536, MaxRetries: 3,
		RetryBudget: &RetryBudget{Percent: 20, MinConcurrency: 3},
		Outlier: &OutlierPolicy{Consecutive5xx: 5, Enforcing5xx: 0, SplitLocalOrigin: true, ConsecutiveLocalOrigin: 1,
			EnforcingLocalOrigin: 100, Interval: 5 * time.Second, BaseEjectionTime: 10 * time.Second,
			MaxEjectionTime: 300 * time.Second, MaxEjectionPercent: 50}}
	if p == nil || p.Name != want.Name || p.LBPolicy != want.LBPolicy || !p.LocalityWeighted || p.ConnectTimeout != want.ConnectTimeout ||
		*p.RetryBudget != *want.RetryBudget || *p.Outlier != *want.Outlier || p.MaxRequests != want.MaxRequests {
		t.Errorf("cluster policy %+v (budget %+v outlier %+v)", p, p.RetryBudget, p.Outlier)
	}
	if len(clusters) != len(s.Clusters) {
		t.Errorf("%d clusters decoded of %d", len(clusters), len(s.Clusters))
	}
	eps, err := DecodeAssignments(anys(t, s.Endpoints))
	if err != nil {
		t.Fatal(err)
	}
	main := eps[xdscontract.ClusterName("m")]
	if len(main) != 2 || main[0] != (Endpoint{Cell: "a", Address: "10.0.0.1:8000", Weight: 2, Region: "r1", LocalityWeight: 3, MaxModelLen: 8192}) ||
		main[1] != (Endpoint{Cell: "region/r2", Address: "10.9.0.1:443", Weight: 1, Region: "r2", Zone: "r2", LocalityWeight: 1, Priority: 1}) {
		t.Errorf("main assignment %+v", main)
	}
	if l := eps[xdscontract.LocalClusterName("m")]; len(l) != 1 || l[0].Cell != "a" {
		t.Errorf("local assignment %+v", l)
	}
	rcs, err := dec.DecodeRoutes(anys(t, s.Routes))
	if err != nil {
		t.Fatal(err)
	}
	rc := rcs[xdscontract.RouteName]
	var mainRoute, hopRoute *Route
	for i := range rc.VirtualHosts[0].Routes {
		r := &rc.VirtualHosts[0].Routes[i]
		switch r.Name {
		case "m":
			mainRoute = r
		case "m/hop":
			hopRoute = r
		}
	}
	if mainRoute == nil || mainRoute.Model != "m" || mainRoute.Cluster != "isobar/m" || mainRoute.Timeout != 600*time.Second ||
		mainRoute.AbortStatus != 429 || mainRoute.AbortPerMillion != 250000 || mainRoute.Retry.NumRetries != 2 ||
		!mainRoute.Retry.ConnectFailure || !mainRoute.Retry.Reset || !mainRoute.Retry.PreviousHosts ||
		len(mainRoute.Retry.StatusCodes) != 1 || mainRoute.Retry.StatusCodes[0] != 503 || mainRoute.Retry.BackoffBase != 25*time.Millisecond {
		t.Errorf("main route %+v", mainRoute)
	}
	if hopRoute == nil || hopRoute.AbortPerMillion != 0 || hopRoute.Cluster != xdscontract.LocalClusterName("m") {
		t.Errorf("hop route %+v", hopRoute)
	}
}

func TestDecodeRefusals(t *testing.T) {
	s := builtSet(t)
	static := proto.Clone(s.Clusters[0]).(*cluster.Cluster)
	static.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}
	badOutlier := proto.Clone(s.Clusters[0]).(*cluster.Cluster)
	badOutlier.OutlierDetection.MaxEjectionTime = durationpb.New(time.Second)
	dec := Decoder{ModelHeader: "x-isobar-model"}
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"static cluster", func() error { _, err := dec.DecodeClusters(anys(t, []*cluster.Cluster{static})); return err }, "EDS clusters only"},
		{"outlier times", func() error { _, err := dec.DecodeClusters(anys(t, []*cluster.Cluster{badOutlier})); return err }, "inconsistent"},
		{"duplicate cluster", func() error {
			_, err := dec.DecodeClusters(anys(t, s.Clusters[:1]))
			_, err2 := dec.DecodeClusters(append(anys(t, s.Clusters[:1]), anys(t, s.Clusters[:1])...))
			return errors.Join(err, err2)
		}, "listed twice"},
		{"wrong type", func() error { _, err := DecodeAssignments(anys(t, s.Clusters[:1])); return err }, "ClusterLoadAssignment"},
		{"garbage", func() error {
			_, err := dec.DecodeRoutes([]*anypb.Any{{TypeUrl: resource.RouteType, Value: []byte{0xff, 0xff}}})
			return err
		}, "invalid xDS resource"},
	} {
		err := tc.run()
		if !errors.Is(err, ErrInvalidResource) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidResource mentioning %q", tc.name, err, tc.want)
		}
	}
}

// FuzzDecode feeds arbitrary bytes as each resource type: decoding never
// panics, and what it accepts is usable (addresses are IP:port, routes name
// a cluster).
func FuzzDecode(f *testing.F) {
	s := builtSet(f)
	for _, a := range anys(f, s.Clusters) {
		f.Add(uint8(0), a.GetValue())
	}
	for _, a := range anys(f, s.Endpoints) {
		f.Add(uint8(1), a.GetValue())
	}
	for _, a := range anys(f, s.Routes) {
		f.Add(uint8(2), a.GetValue())
	}
	// The pinned clusters (residency metadata), their assignments and the
	// per-criticality and per-residency routes.
	ps := pinnedSet(f)
	for _, a := range anys(f, ps.Clusters) {
		f.Add(uint8(0), a.GetValue())
	}
	for _, a := range anys(f, ps.Routes) {
		f.Add(uint8(2), a.GetValue())
	}
	dec := Decoder{ModelHeader: "x-isobar-model"}
	f.Fuzz(func(t *testing.T, typ uint8, data []byte) {
		switch typ % 3 {
		case 0:
			cs, err := dec.DecodeClusters([]*anypb.Any{{TypeUrl: resource.ClusterType, Value: data}})
			for _, c := range cs {
				if err != nil || c.ServiceName == "" || c.ConnectTimeout <= 0 || c.ChoiceCount < 2 && c.LBPolicy == "LEAST_REQUEST" ||
					(c.Residency == "") != (c.AllowedRegions == nil) || len(c.AllowedRegions) > 64 {
					t.Fatalf("accepted cluster %+v", c)
				}
			}
		case 1:
			eps, err := DecodeAssignments([]*anypb.Any{{TypeUrl: resource.EndpointType, Value: data}})
			for _, es := range eps {
				for _, e := range es {
					if _, perr := netip.ParseAddrPort(e.Address); err != nil || perr != nil || e.Weight == 0 {
						t.Fatalf("accepted endpoint %+v", e)
					}
				}
			}
		default:
			rcs, err := dec.DecodeRoutes([]*anypb.Any{{TypeUrl: resource.RouteType, Value: data}})
			for _, rc := range rcs {
				for _, vh := range rc.VirtualHosts {
					for _, r := range vh.Routes {
						if err != nil || r.Cluster == "" || r.AbortPerMillion > 1_000_000 {
							t.Fatalf("accepted route %+v", r)
						}
						r.match.matches("/", mapView{"x-isobar-model": "m", "content-length": "5"})
						r.match.matches("/", mapView{"x-isobar-model": "m", xdscontract.ResidencyHeader: "eu", xdscontract.CriticalityHeader: "critical"})
					}
				}
			}
		}
	})
}
