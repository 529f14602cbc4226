package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// applyState builds st's Envoy resources with the controller's builder,
// lets mod change the route configuration, and applies them to g as the
// subscriptions would.
func applyState(t *testing.T, g *testGateway, st xds.State, mod func(*route.RouteConfiguration)) {
	t.Helper()
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	var cs, es, rs []*anypb.Any
	for _, c := range res.Envoy.Clusters {
		cs = append(cs, mustAny(t, c))
	}
	for _, e := range res.Envoy.Endpoints {
		es = append(es, mustAny(t, e))
	}
	for _, r := range res.Envoy.Routes {
		r = proto.Clone(r).(*route.RouteConfiguration)
		if mod != nil {
			mod(r)
		}
		rs = append(rs, mustAny(t, r))
	}
	for i, set := range [][]*anypb.Any{cs, es, rs} {
		if err := g.apply(i, set, "1"); err != nil {
			t.Fatalf("apply %s: %v", typeLabel(i), err)
		}
	}
}

func typeLabel(i int) string { return [...]string{"cluster", "endpoint", "route"}[i] }

// serve sends one completion for model through g's handler from remote with
// headers.
func (g *testGateway) serve(model, remote string, headers map[string]string) *httptest.ResponseRecorder {
	body := fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":1}`, model)
	req := httptest.NewRequest(http.MethodPost, "http://gw/v1/completions", strings.NewReader(body))
	if remote != "" {
		req.RemoteAddr = remote
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	g.handler.ServeHTTP(rec, req)
	return rec
}

// countingUpstream answers 200 (or status) and counts its requests.
type countingUpstream struct {
	n      atomic.Int64
	status atomic.Int64
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.n.Add(1)
	if s := u.status.Load(); s != 0 {
		w.WriteHeader(int(s))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"choices":[{"text":"ok"}]}`))
}

// shedSheddable prepends to every route a copy that matches the
// criticality header "sheddable" and aborts all its requests with 429, as
// the controller's per-criticality routes do with a sheddable-only share.
func shedSheddable(t *testing.T) func(*route.RouteConfiguration) {
	abort, err := anypb.New(&fault.HTTPFault{Abort: &fault.FaultAbort{
		ErrorType:  &fault.FaultAbort_HttpStatus{HttpStatus: 429},
		Percentage: &typev3.FractionalPercent{Numerator: 1_000_000, Denominator: typev3.FractionalPercent_MILLION},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return func(rc *route.RouteConfiguration) {
		for _, vh := range rc.VirtualHosts {
			var out []*route.Route
			for _, r := range vh.Routes {
				c := proto.Clone(r).(*route.Route)
				c.Name += "-sheddable"
				c.Match.Headers = append(c.Match.Headers, &route.HeaderMatcher{Name: xdscontract.CriticalityHeader,
					HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: &matcher.StringMatcher{
						MatchPattern: &matcher.StringMatcher_Exact{Exact: "sheddable"}}}})
				c.TypedPerFilterConfig = map[string]*anypb.Any{wellknown.Fault: abort}
				out = append(out, c, r)
			}
			vh.Routes = out
		}
	}
}

// TestSheddableShareShedsOnlySheddable: a route with a sheddable-only
// share sheds sheddable requests (429, Retry-After, the shed header) and
// nothing else; the criticality is normalised before the match, so a
// differently spelled "SHEDDABLE" is shed too and an untrusted "critical"
// is served as standard.
func TestSheddableShareShedsOnlySheddable(t *testing.T) {
	up := &countingUpstream{}
	addr := startHTTP(t, up)
	g := unitGateway(t, Config{}, Deps{})
	applyState(t, g, oneModel(model, endpointOf(t, "a", addr, 1, 0)), shedSheddable(t))
	for _, tc := range []struct {
		crit string
		shed bool
	}{{"sheddable", true}, {" SHEDDABLE", true}, {"", false}, {"standard", false}, {"critical", false}, {"bogus", false}} {
		for range 5 {
			rec := g.serve(model, "", map[string]string{xdscontract.CriticalityHeader: tc.crit})
			if tc.shed {
				if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || rec.Header().Get(xdscontract.ShedHeader) != "plan" {
					t.Fatalf("%q: %d retry-after %q shed %q, want a 429 shed by the plan", tc.crit, rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get(xdscontract.ShedHeader))
				}
			} else if rec.Code != http.StatusOK {
				t.Fatalf("%q: %d %s, want 200", tc.crit, rec.Code, rec.Body)
			}
		}
	}
	if n := up.n.Load(); n != 20 {
		t.Errorf("upstream saw %d requests, want the 20 not sheddable", n)
	}
	// The report carries the demand by criticality.
	rep, _ := g.rep.take()
	got := map[string][2]uint64{}
	for _, s := range rep.GetDemand()[0].GetSlices() {
		got[s.GetCriticality().String()] = [2]uint64{s.GetRequests(), s.GetShed()}
	}
	want := map[string][2]uint64{"CRITICALITY_SHEDDABLE": {10, 10}, "CRITICALITY_STANDARD": {20, 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("slices %v, want %v", got, want)
	}
}

// residencyFleet is one model with local cells a, b (r1) and remote
// ingresses x (r2) and y (r3), every one a counting upstream.
func residencyFleet(t *testing.T) (xds.State, map[string]*countingUpstream) {
	ups := map[string]*countingUpstream{}
	ep := func(name string) xds.Endpoint {
		u := &countingUpstream{}
		ups[name] = u
		return endpointOf(t, name, startHTTP(t, u), 1, 0)
	}
	locs := []xds.Locality{
		{Region: "r1", Zone: "z1", Weight: 1000, Endpoints: []xds.Endpoint{ep("a"), ep("b")}},
		{Region: "r2", Zone: "r2", Weight: 500, Endpoints: []xds.Endpoint{ep("x")}},
		{Region: "r3", Zone: "r3", Weight: 1, Endpoints: []xds.Endpoint{ep("y")}},
	}
	// The controller's pinned clusters for "far" and "home" hold every
	// locality (as a controller whose config allows all three regions
	// would): the gateway's own residency config is what keeps each set
	// in its regions here. "gone" allows only r4, where nothing serves.
	all := []string{"r1", "r2", "r3"}
	pinned := []xds.Pinned{{Set: "far", Regions: all, Localities: locs}, {Set: "home", Regions: all, Localities: locs},
		{Set: "gone", Regions: []string{"r4"}}}
	st := xds.State{Models: []xds.Model{{Name: model, Localities: locs, Pinned: pinned}}}
	return st, ups
}

// TestResidencyInEveryPick: a pinned request is never sent outside its
// set's regions, in every load-balancing mode, on retries of a failing
// endpoint, and is answered 503 naming the set when nothing allowed is
// left; unpinned requests still use everything.
func TestResidencyInEveryPick(t *testing.T) {
	res := mustResidency(t, `{"sets": {"far": ["r3"], "home": ["r1"], "gone": ["r4"]}, "tenants": {"t-far": "far", "t-home": "home", "t-gone": "gone"}}`)
	for _, mode := range []LBMode{LBXDS, LBRoundRobin, LBLeastRequest, LBIsobar} {
		t.Run(string(mode), func(t *testing.T) {
			st, ups := residencyFleet(t)
			g := unitGateway(t, Config{LB: mode, Residency: res}, Deps{})
			applyState(t, g, st, nil)
			counts := func() map[string]int64 {
				out := map[string]int64{}
				for k, u := range ups {
					out[k] = u.n.Load()
				}
				return out
			}
			for range 30 {
				if rec := g.serve(model, "", map[string]string{xdscontract.TenantHeader: "t-far"}); rec.Code != http.StatusOK || rec.Header().Get(xdscontract.RegionHeader) != "r3" {
					t.Fatalf("pinned to r3: %d region %q", rec.Code, rec.Header().Get(xdscontract.RegionHeader))
				}
			}
			if c := counts(); c["a"]+c["b"]+c["x"] != 0 || c["y"] != 30 {
				t.Fatalf("pinned to r3: %v", c)
			}
			// y fails: retries never leave r3, the failure is relayed.
			ups["y"].status.Store(http.StatusServiceUnavailable)
			for range 10 {
				if rec := g.serve(model, "", map[string]string{xdscontract.TenantHeader: "t-far"}); rec.Code < 500 {
					t.Fatalf("pinned to a failing r3: %d", rec.Code)
				}
			}
			if c := counts(); c["a"]+c["b"]+c["x"] != 0 {
				t.Fatalf("retries left r3: %v", c)
			}
			for range 20 {
				if rec := g.serve(model, "", map[string]string{xdscontract.TenantHeader: "t-home"}); rec.Code != http.StatusOK || rec.Header().Get(xdscontract.RegionHeader) != "r1" {
					t.Fatalf("pinned to r1: %d region %q", rec.Code, rec.Header().Get(xdscontract.RegionHeader))
				}
			}
			if c := counts(); c["x"] != 0 {
				t.Fatalf("home requests reached r2: %v", c)
			}
			rec := g.serve(model, "", map[string]string{xdscontract.TenantHeader: "t-gone"})
			if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `set \"gone\"`) || !strings.Contains(rec.Body.String(), "r4") {
				t.Fatalf("nothing allowed: %d %s, want 503 naming the set and its regions", rec.Code, rec.Body)
			}
			if g.metric(t, "isobar_gateway_residency_refused_total", nil) != 1 {
				t.Error("residency refusal not counted")
			}
			// Unpinned traffic may go anywhere (the rr baseline reaches
			// every endpoint but y, ejected above).
			if mode == LBRoundRobin {
				before := counts()
				for range 40 {
					g.serve(model, "", nil)
				}
				after := counts()
				for _, k := range []string{"a", "b", "x"} {
					if after[k] == before[k] {
						t.Errorf("unpinned round robin never reached %s: %v", k, after)
					}
				}
			}
		})
	}
}

// TestResidencyInPick: the ext_proc picker's pick (Gateway.Pick) keeps
// residency too and hands the proxy the canonical class headers.
func TestResidencyInPick(t *testing.T) {
	st, _ := residencyFleet(t)
	g := unitGateway(t, Config{Residency: mustResidency(t, `{"sets": {"far": ["r3"]}, "tenants": {"t-far": "far"}}`)}, Deps{})
	applyState(t, g, st, nil)
	for range 20 {
		hdr := http.Header{}
		hdr.Set(xdscontract.TenantHeader, "t-far")
		hdr.Set(xdscontract.CriticalityHeader, "critical")
		view := newRequestView(httptest.NewRequest(http.MethodPost, "http://gw/v1/completions", nil), g.cfg.ModelHeader, model, 10)
		view.r.Header = hdr
		p, ref := g.Pick(PickRequest{Match: view, Header: hdr, Authority: "gw", Path: "/v1/completions", Model: model, BodyLen: 10})
		if ref != nil {
			t.Fatalf("refused: %+v %s", ref, ref.Body)
		}
		if p.a.h.ep.Region != "r3" {
			t.Fatalf("picked %s in %s", p.Address(), p.a.h.ep.Region)
		}
		set := map[string]string{}
		for _, kv := range p.Set {
			set[kv[0]] = kv[1]
		}
		if set[xdscontract.CriticalityHeader] != "standard" || set[xdscontract.ResidencyHeader] != "far" || set[xdscontract.TenantHeader] != "t-far" {
			t.Fatalf("header changes %v: want standard (untrusted), far, t-far", p.Set)
		}
		p.Close()
	}
}

// TestResidencySetTheRoutesLack: a request pinned to a set the
// controller's routes do not define matches no route; it is refused 503
// naming the set (the unpinned routes require no residency header), never
// served by the unpinned cluster, and an unpinned request still is.
func TestResidencySetTheRoutesLack(t *testing.T) {
	st, ups := residencyFleet(t)
	g := unitGateway(t, Config{Residency: mustResidency(t, `{"sets": {"elsewhere": ["r2"]}, "tenants": {"t": "elsewhere"}}`)}, Deps{})
	applyState(t, g, st, nil)
	rec := g.serve(model, "", map[string]string{xdscontract.TenantHeader: "t"})
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `residency set \"elsewhere\"`) {
		t.Fatalf("pinned to a set the routes lack: %d %s, want 503 naming the set", rec.Code, rec.Body)
	}
	for k, u := range ups {
		if u.n.Load() != 0 {
			t.Fatalf("the pinned request reached %s", k)
		}
	}
	if rec := g.serve(model, "", nil); rec.Code != http.StatusOK {
		t.Fatalf("unpinned: %d %s", rec.Code, rec.Body)
	}
}

// TestResidencyExcessShed503: a residency set's shed share (its regions
// have no capacity left) refuses its requests 503 naming the set, counted
// as shed "residency"; unpinned requests are untouched.
func TestResidencyExcessShed503(t *testing.T) {
	st, ups := residencyFleet(t)
	st.Models[0].Pinned[0].Shed = 1 // "far": everything shed
	g := unitGateway(t, Config{Residency: mustResidency(t, `{"sets": {"far": ["r3"]}, "tenants": {"t-far": "far"}}`)}, Deps{})
	applyState(t, g, st, nil)
	rec := g.serve(model, "", map[string]string{xdscontract.TenantHeader: "t-far"})
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `residency set \"far\" (r3)`) ||
		rec.Header().Get(xdscontract.ShedHeader) != "residency" {
		t.Fatalf("pinned excess: %d %q %s, want 503 naming the set with shed header residency", rec.Code, rec.Header().Get(xdscontract.ShedHeader), rec.Body)
	}
	if ups["y"].n.Load() != 0 {
		t.Fatal("the shed request reached an engine")
	}
	if rec := g.serve(model, "", nil); rec.Code != http.StatusOK {
		t.Fatalf("unpinned: %d", rec.Code)
	}
}
