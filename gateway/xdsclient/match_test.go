package xdsclient

import (
	"strconv"
	"strings"
	"testing"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// mapView is a header view over a plain map (lower-case names).
type mapView map[string]string

func (m mapView) Header(name string) (string, bool) { v, ok := m[name]; return v, ok }

func strMatch(name string, sm *matcher.StringMatcher, invert bool) *route.HeaderMatcher {
	return &route.HeaderMatcher{Name: name, InvertMatch: invert, HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: sm}}
}

func TestHeaderMatcherSemantics(t *testing.T) {
	exact := func(v string) *matcher.StringMatcher {
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: v}}
	}
	tests := []struct {
		name string
		m    *route.HeaderMatcher
		h    mapView
		want bool
	}{
		{"exact hit", strMatch("x", exact("a"), false), mapView{"x": "a"}, true},
		{"exact miss", strMatch("x", exact("a"), false), mapView{"x": "b"}, false},
		{"exact missing", strMatch("x", exact("a"), false), mapView{}, false},
		{"inverted missing header matches", strMatch("x", exact("a"), true), mapView{}, true},
		{"inverted hit", strMatch("x", exact("a"), true), mapView{"x": "a"}, false},
		{"ignore case", strMatch("x", &matcher.StringMatcher{IgnoreCase: true, MatchPattern: &matcher.StringMatcher_Exact{Exact: "AbC"}}, false), mapView{"x": "aBc"}, true},
		{"prefix", strMatch("x", &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Prefix{Prefix: "ab"}}, false), mapView{"x": "abc"}, true},
		{"suffix", strMatch("x", &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Suffix{Suffix: "bc"}}, false), mapView{"x": "abc"}, true},
		{"contains", strMatch("x", &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Contains{Contains: "b"}}, false), mapView{"x": "abc"}, true},
		{"regex must match whole value", strMatch("x", &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{
			SafeRegex: &matcher.RegexMatcher{Regex: "b+"}}}, false), mapView{"x": "abbc"}, false},
		{"regex whole", strMatch("x", &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{
			SafeRegex: &matcher.RegexMatcher{Regex: "a?b+c"}}}, false), mapView{"x": "abbc"}, true},
		{"present", &route.HeaderMatcher{Name: "x", HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: true}}, mapView{"x": ""}, true},
		{"present false means absent", &route.HeaderMatcher{Name: "x", HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: false}}, mapView{}, true},
		{"inverted present", &route.HeaderMatcher{Name: "x", InvertMatch: true, HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: true}}, mapView{}, true},
		{"range start inclusive", rangeM(10, 20), mapView{"x": "10"}, true},
		{"range end exclusive", rangeM(10, 20), mapView{"x": "20"}, false},
		{"range plus sign", rangeM(10, 20), mapView{"x": "+15"}, true},
		{"range negative", rangeM(-5, 0), mapView{"x": "-1"}, true},
		{"range not a number", rangeM(0, 20), mapView{"x": "1x"}, false},
		{"range space", rangeM(0, 20), mapView{"x": " 1"}, false},
		{"range overflow", rangeM(0, 20), mapView{"x": "99999999999999999999"}, false},
		{"treat missing as empty", &route.HeaderMatcher{Name: "x", TreatMissingHeaderAsEmpty: true,
			HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: exact("")}}, mapView{}, true},
	}
	for _, tc := range tests {
		hm, err := compileHeader(tc.m)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := hm.matches(tc.h); got != tc.want {
			t.Errorf("%s: match = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func rangeM(start, end int64) *route.HeaderMatcher {
	return &route.HeaderMatcher{Name: "x", HeaderMatchSpecifier: &route.HeaderMatcher_RangeMatch{RangeMatch: &typev3.Int64Range{Start: start, End: end}}}
}

func TestPathAndVirtualHost(t *testing.T) {
	for _, tc := range []struct {
		m    *route.RouteMatch
		path string
		want bool
	}{
		{&route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/v1/"}}, "/v1/completions?x=1", true},
		{&route.RouteMatch{PathSpecifier: &route.RouteMatch_Path{Path: "/v1/completions"}}, "/v1/completions?x=1", true},
		{&route.RouteMatch{PathSpecifier: &route.RouteMatch_Path{Path: "/v1/completions"}}, "/v1/completions/x", false},
		{&route.RouteMatch{PathSpecifier: &route.RouteMatch_Path{Path: "/V1/Completions"}, CaseSensitive: wrapperspb.Bool(false)}, "/v1/completions", true},
		{&route.RouteMatch{PathSpecifier: &route.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/v1"}}, "/v1/models", true},
		{&route.RouteMatch{PathSpecifier: &route.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/v1"}}, "/v10", false},
		{&route.RouteMatch{PathSpecifier: &route.RouteMatch_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: "/v1/(chat/)?completions"}}}, "/v1/chat/completions", true},
	} {
		rm, err := compileMatch(tc.m)
		if err != nil {
			t.Fatal(err)
		}
		if got := rm.path.matches(tc.path); got != tc.want {
			t.Errorf("%v on %q = %v, want %v", tc.m, tc.path, got, tc.want)
		}
	}
	vhs := []VirtualHost{{Name: "any", Domains: []string{"*"}}, {Name: "exact", Domains: []string{"api.example.com"}},
		{Name: "suffix", Domains: []string{"*.example.com"}}, {Name: "prefix", Domains: []string{"api.*"}}}
	for host, want := range map[string]string{"api.example.com": "exact", "x.example.com": "suffix", "api.other": "prefix",
		"other": "any", "api.example.com:8080": "prefix", "[::1]:80": "any"} {
		if got := SelectVirtualHost(vhs, host); got == nil || got.Name != want {
			t.Errorf("host %q: virtual host %v, want %s", host, got, want)
		}
	}
	if SelectVirtualHost(vhs[1:2], "nope") != nil {
		t.Error("a host matching no domain selected a virtual host")
	}
}

// refMatch is a reference evaluation of a RouteConfiguration straight from
// the protos, written from Envoy's documentation: the first route whose
// prefix and every header matcher match.
func refMatch(rc *route.RouteConfiguration, path string, h mapView) string {
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		if !strings.HasPrefix(path, r.GetMatch().GetPrefix()) {
			continue
		}
		ok := true
		for _, hm := range r.GetMatch().GetHeaders() {
			v, present := h[hm.GetName()]
			var m bool
			switch s := hm.GetHeaderMatchSpecifier().(type) {
			case *route.HeaderMatcher_PresentMatch:
				m = present == s.PresentMatch
			case *route.HeaderMatcher_StringMatch:
				m = present && v == s.StringMatch.GetExact()
			case *route.HeaderMatcher_RangeMatch:
				n, err := strconv.ParseInt(v, 10, 64)
				m = present && err == nil && s.RangeMatch.GetStart() <= n && n < s.RangeMatch.GetEnd()
			}
			if hm.GetInvertMatch() {
				m = !m
			}
			ok = ok && m
		}
		if ok {
			return r.GetName()
		}
	}
	return ""
}

// FuzzRouteMatch holds the compiled matcher to the reference on the
// controller's real route configuration, for any request headers.
func FuzzRouteMatch(f *testing.F) {
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		f.Fatal(err)
	}
	st := xds.State{Models: []xds.Model{
		{Name: "m", Shed: 0.1, ShedSheddable: 0.6, Pinned: []xds.Pinned{
			{Set: "eu", Regions: []string{"r2"}, ShedCritical: 0.3, Localities: []xds.Locality{
				{Region: "r2", Weight: 1, Endpoints: []xds.Endpoint{{CellID: "region/r2", Host: "10.9.0.1", Port: 1, Weight: 1}}}}},
			{Set: "eu+us", Regions: nil}}, Localities: []xds.Locality{
			{Weight: 1, Endpoints: []xds.Endpoint{{CellID: "a", Host: "10.0.0.1", Port: 1, Weight: 1, MaxModelLen: 4096},
				{CellID: "b", Host: "10.0.0.2", Port: 1, Weight: 1, MaxModelLen: 32768}}},
			{Region: "r2", Weight: 1, Endpoints: []xds.Endpoint{{CellID: "region/r2", Host: "10.9.0.1", Port: 1, Weight: 1}}}}},
		{Name: "n/7b", Localities: []xds.Locality{{Weight: 1, Endpoints: []xds.Endpoint{{CellID: "c", Host: "10.0.0.3", Port: 1, Weight: 1}}}}},
	}}
	res, err := b.Build(st)
	if err != nil {
		f.Fatal(err)
	}
	rcProto := res.Envoy.Routes[0]
	dec := Decoder{ModelHeader: "x-isobar-model"}
	rc, err := dec.decodeRouteConfig(rcProto)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("m", true, "5000", false, "", int64(100), true, "", "")
	f.Add("n/7b", false, "", true, "r3", int64(20000), true, "critical", "")
	f.Add("m", true, "+4097", true, "", int64(-1), false, "sheddable", "eu")
	f.Add("x", true, "", false, "", int64(1<<40), true, "", "eu+us")
	f.Add("m", true, "", false, "", int64(10), true, "critical", "eu")
	f.Add("m", false, "", false, "", int64(10), true, "sheddable", "ap")
	f.Fuzz(func(t *testing.T, model string, withModel bool, tokens string, hop bool, hopVal string, clen int64, withLen bool,
		crit, res string) {
		h := mapView{}
		if crit != "" {
			h[xdscontract.CriticalityHeader] = crit
		}
		if res != "" {
			h[xdscontract.ResidencyHeader] = res
		}
		if withModel {
			h["x-isobar-model"] = model
		}
		if tokens != "" {
			h[xdscontract.PromptTokensHeader] = tokens
		}
		if hop {
			h["x-isobar-hop"] = hopVal
		}
		if withLen {
			h["content-length"] = strconv.FormatInt(clen, 10)
		}
		want := refMatch(rcProto, "/v1/completions", h)
		got := ""
		if r := MatchRoute(&rc.VirtualHosts[0], "/v1/completions", h); r != nil {
			got = r.Name
		}
		if got != want {
			t.Fatalf("headers %v: gateway matched %q, reference %q", h, got, want)
		}
	})
}
