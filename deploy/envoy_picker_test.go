package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// The Endpoint Picker Protocol's names (isobar's xdscontract.DestinationEndpointHeader,
// DestinationEndpointNamespace and SubsetHintNamespace) and isobar's ports.
const (
	destHeader     = "x-gateway-destination-endpoint"
	destNamespace  = "envoy.lb"
	hintNamespace  = "envoy.lb.subset_hint"
	xdsListenPort  = 10000 // isobar regional's Envoy listener (regional/xds Config.ListenPort)
	pickerPort     = 9002  // isobar picker --listen
	pickerBodySize = 16 << 20
)

// pickerBootstrap is envoy/picker.yaml, parsed and validated in depth.
func pickerBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	b, err := parseBootstrap(readEnvoy(t, "envoy/picker.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := validateDeep(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// ingress returns the picker ingress listener and its connection manager
// (nil, nil without one).
func ingress(b *bootstrapv3.Bootstrap) (*listenerv3.Listener, *hcmv3.HttpConnectionManager) {
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var h hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&h) != nil {
					continue
				}
				for _, hf := range h.GetHttpFilters() {
					if hf.GetName() == "envoy.filters.http.ext_proc" {
						return l, &h
					}
				}
			}
		}
	}
	return nil, nil
}

// routeFor is Envoy's choice among the routes of vh for a request to
// path that carries (or not) the destination header and the picker's
// dynamic metadata. It evaluates prefix, present header and present
// dynamic-metadata matchers; any other matcher is an error, so that the
// check cannot pass on a route it does not understand.
func routeFor(vh *routev3.VirtualHost, path string, header, metadata bool) (*routev3.Route, error) {
	for _, r := range vh.GetRoutes() {
		m := r.GetMatch()
		if m.GetPrefix() == "" && m.GetPathSpecifier() != nil {
			return nil, fmt.Errorf("route %q: path matcher %v not evaluated by this test", r.GetName(), m.GetPathSpecifier())
		}
		ok := strings.HasPrefix(path, m.GetPrefix())
		for _, h := range m.GetHeaders() {
			if h.GetName() != destHeader || h.GetHeaderMatchSpecifier() == nil {
				return nil, fmt.Errorf("route %q: header matcher %v not evaluated by this test", r.GetName(), h)
			}
			pm, isPresent := h.GetHeaderMatchSpecifier().(*routev3.HeaderMatcher_PresentMatch)
			if !isPresent {
				return nil, fmt.Errorf("route %q: header matcher %v not evaluated by this test", r.GetName(), h)
			}
			ok = ok && (pm.PresentMatch == header) != h.GetInvertMatch()
		}
		for _, dm := range m.GetDynamicMetadata() {
			if dm.GetFilter() != destNamespace || len(dm.GetPath()) != 1 || dm.GetPath()[0].GetKey() != destHeader || !dm.GetValue().GetPresentMatch() {
				return nil, fmt.Errorf("route %q: metadata matcher %v not evaluated by this test", r.GetName(), dm)
			}
			ok = ok && metadata != dm.GetInvert()
		}
		if len(m.GetQueryParameters()) > 0 || m.GetRuntimeFraction() != nil || m.GetGrpc() != nil || m.GetTlsContext() != nil ||
			m.GetFilterState() != nil || m.GetCaseSensitive() != nil {
			return nil, fmt.Errorf("route %q: matchers %v not evaluated by this test", r.GetName(), m)
		}
		if ok {
			return r, nil
		}
	}
	return nil, nil
}

// firstAddress is the socket address of a static cluster's first
// endpoint, nil without one.
func firstAddress(c *clusterv3.Cluster) *corev3.SocketAddress {
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			return e.GetEndpoint().GetAddress().GetSocketAddress()
		}
	}
	return nil
}

// envoy/picker.yaml is a valid Envoy bootstrap (every typed config
// included) that asks isobar picker for each request's endpoint as the
// Endpoint Picker Protocol says, sends a picked request to an ORIGINAL_DST
// cluster on the destination header, and sends every other request (the
// picker down or failing: failure_mode_allow) to the controller's
// weighted listener; a client's own destination header never picks a
// route or an upstream.
func TestEnvoyPickerBootstrap(t *testing.T) {
	for _, p := range pickerProblems(pickerBootstrap(t)) {
		t.Error(p)
	}
}

// pickerProblems lists what is wrong with a picker bootstrap.
func pickerProblems(b *bootstrapv3.Bootstrap) (problems []string) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	l, h := ingress(b)
	if h == nil {
		bad("no static listener with the ext_proc filter")
		return problems
	}
	if l.GetPerConnectionBufferLimitBytes().GetValue() < pickerBodySize {
		bad("listener %s buffers %d bytes per connection: BUFFERED bodies up to the picker's %d bytes are refused",
			l.GetName(), l.GetPerConnectionBufferLimitBytes().GetValue(), pickerBodySize)
	}

	// Filters: header_mutation (removes the client's header), ext_proc,
	// router last.
	var names []string
	var ep extprocv3.ExternalProcessor
	for i, hf := range h.GetHttpFilters() {
		names = append(names, hf.GetName())
		switch hf.GetName() {
		case "envoy.filters.http.header_mutation":
			var hm headermutationv3.HeaderMutation
			if err := hf.GetTypedConfig().UnmarshalTo(&hm); err != nil {
				bad("header_mutation: %v", err)
			}
			removes := false
			for _, m := range hm.GetMutations().GetRequestMutations() {
				removes = removes || m.GetRemove() == destHeader
			}
			if !removes {
				bad("header_mutation does not remove a client's %s", destHeader)
			}
		case "envoy.filters.http.ext_proc":
			if err := hf.GetTypedConfig().UnmarshalTo(&ep); err != nil {
				bad("ext_proc: %v", err)
			}
			if i == 0 || names[i-1] != "envoy.filters.http.header_mutation" {
				bad("ext_proc at %d after %v, want it right after header_mutation", i, names[:i])
			}
		}
	}
	if len(names) == 0 || names[len(names)-1] != "envoy.filters.http.router" {
		bad("filters %v, want the router last", names)
	}
	if !ep.GetFailureModeAllow() {
		bad("ext_proc without failure_mode_allow: a picker outage would fail every request instead of falling back")
	}
	if ep.GetObservabilityMode() {
		bad("ext_proc in observability_mode ignores the picker's answers")
	}
	pm := ep.GetProcessingMode()
	if pm.GetRequestHeaderMode() == extprocv3.ProcessingMode_SKIP {
		bad("request headers are not sent to the picker")
	}
	if m := pm.GetRequestBodyMode(); m != extprocv3.ProcessingMode_BUFFERED && m != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		bad("request_body_mode %v: the picker reads the model and prompt size from the body in BUFFERED or FULL_DUPLEX_STREAMED", m)
	}
	if pm.GetRequestBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED && pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
		bad("FULL_DUPLEX_STREAMED needs request_trailer_mode SEND")
	}
	if pm.GetResponseHeaderMode() == extprocv3.ProcessingMode_SKIP || pm.GetResponseBodyMode() == extprocv3.ProcessingMode_NONE {
		bad("the response does not reach the picker: it cannot see the first token and counts the prompt as pending until the end")
	}
	if !slices.Contains(ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), destNamespace) {
		bad("ext_proc does not accept the picker's %s metadata", destNamespace)
	}
	if !slices.Contains(ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), hintNamespace) {
		bad("ext_proc does not forward the %s subset hint", hintNamespace)
	}
	if ep.GetRouteCacheAction() == extprocv3.ExternalProcessor_RETAIN || ep.GetDisableClearRouteCache() {
		bad("ext_proc keeps the route chosen before the pick")
	}

	// The picker's cluster: gRPC (HTTP/2) over mTLS with a client
	// certificate, checking the picker's gateway identity.
	pc := clusters[ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if pc == nil {
		bad("ext_proc cluster %q is not a static cluster", ep.GetGrpcService().GetEnvoyGrpc().GetClusterName())
		return problems
	}
	var hpo httpv3.HttpProtocolOptions
	if po := pc.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; po == nil ||
		po.UnmarshalTo(&hpo) != nil || hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		bad("cluster %s does not speak HTTP/2", pc.GetName())
	}
	if port := firstAddress(pc).GetPortValue(); port != pickerPort {
		bad("cluster %s on port %d, want isobar picker's %d", pc.GetName(), port, pickerPort)
	}
	var utc tlsv3.UpstreamTlsContext
	if err := pc.GetTransportSocket().GetTypedConfig().UnmarshalTo(&utc); err != nil {
		bad("cluster %s: no TLS: %v", pc.GetName(), err)
	}
	ctc := utc.GetCommonTlsContext()
	if len(ctc.GetTlsCertificates()) != 1 || ctc.GetValidationContext().GetTrustedCa().GetFilename() == "" ||
		ctc.GetTlsParams().GetTlsMinimumProtocolVersion() != tlsv3.TlsParameters_TLSv1_3 {
		bad("cluster %s is not mutual TLS 1.3", pc.GetName())
	}
	const gatewayURI = "spiffe://isobar/gateway/"
	if sans := ctc.GetValidationContext().GetMatchTypedSubjectAltNames(); len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_URI ||
		(sans[0].GetMatcher().GetPrefix() != gatewayURI && !strings.HasPrefix(sans[0].GetMatcher().GetExact(), gatewayURI)) {
		bad("cluster %s does not check the picker's gateway identity: %v", pc.GetName(), sans)
	}

	// Routes: the pick (metadata only the picker writes) to ORIGINAL_DST
	// on the header; anything else, whatever header the client sent, to
	// the controller's weighted listener.
	vhs := h.GetRouteConfig().GetVirtualHosts()
	if len(vhs) != 1 {
		bad("%d virtual hosts, want 1", len(vhs))
		return problems
	}
	for _, tc := range []struct {
		name             string
		header, metadata bool
		picked           bool
	}{
		{"picked", true, true, true},
		{"picker down or failing: no header, no metadata", false, false, false},
		{"a client's own header (were it not removed)", true, false, false},
	} {
		r, err := routeFor(vhs[0], "/v1/completions", tc.header, tc.metadata)
		if err != nil || r == nil {
			bad("%s: no route (%v)", tc.name, err)
			continue
		}
		c := clusters[r.GetRoute().GetCluster()]
		if c == nil {
			bad("%s: route %q to %q, not a static cluster", tc.name, r.GetName(), r.GetRoute().GetCluster())
			continue
		}
		if tc.picked {
			odc := c.GetOriginalDstLbConfig()
			if c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED ||
				!odc.GetUseHttpHeader() || odc.GetHttpHeaderName() != destHeader {
				bad("%s: route %q to cluster %s, want ORIGINAL_DST on the %s header", tc.name, r.GetName(), c.GetName(), destHeader)
			}
			continue
		}
		sa := firstAddress(c)
		if c.GetType() != clusterv3.Cluster_STATIC || sa.GetPortValue() != xdsListenPort || sa.GetAddress() != "127.0.0.1" {
			bad("%s: route %q to cluster %s (%v), want the weighted xDS listener on 127.0.0.1:%d", tc.name, r.GetName(), c.GetName(), sa, xdsListenPort)
		}
	}
	// The weighted listener itself still comes from the controller.
	if dr := b.GetDynamicResources(); dr.GetLdsConfig().GetAds() == nil || dr.GetCdsConfig().GetAds() == nil ||
		dr.GetLdsConfig().GetResourceApiVersion() != corev3.ApiVersion_V3 {
		bad("LDS and CDS are not from ADS: the fallback listener and clusters would be missing")
	}
	return problems
}

// The picker bootstrap's checks bite: each break below must fail.
func TestEnvoyPickerBootstrapValidationBites(t *testing.T) {
	good := string(readEnvoy(t, "envoy/picker.yaml"))
	for _, tc := range []struct{ name, old, new string }{
		{"bad body mode inside ext_proc", "request_body_mode: BUFFERED", "request_body_mode: BUFFERD"},
		{"unknown ext_proc field", "failure_mode_allow: true", "failure_mode_allowed: true"},
		{"empty metadata filter in a route", "- filter: envoy.lb\n", "- filter: \"\"\n"},
		// Valid to Envoy, wrong for the picker:
		{"no failure_mode_allow", "failure_mode_allow: true", "failure_mode_allow: false"},
		{"headers-only body mode", "request_body_mode: BUFFERED", "request_body_mode: NONE"},
		{"metadata refused", "untyped: [envoy.lb]", "untyped: [other]"},
		{"no header removal", "remove: x-gateway-destination-endpoint", "remove: x-other"},
		{"route on a client-settable header", "dynamic_metadata:\n                  - filter: envoy.lb\n                    path:\n                    - key: x-gateway-destination-endpoint\n                    value:\n                      present_match: true",
			"headers:\n                  - name: x-gateway-destination-endpoint\n                    present_match: true"},
		{"fallback to the picked cluster", "cluster: isobar_fallback\n                  timeout", "cluster: isobar_picked\n                  timeout"},
		{"ORIGINAL_DST on another header", "http_header_name: x-gateway-destination-endpoint", "http_header_name: x-other"},
		{"picker identity not checked", "prefix: spiffe://isobar/gateway/", "prefix: spiffe://isobar/region/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("picker.yaml no longer contains %q", tc.old)
			}
			b, err := parseBootstrap([]byte(strings.Replace(good, tc.old, tc.new, 1)))
			if err == nil {
				_, err = validateDeep(b)
			}
			if err == nil {
				if p := pickerProblems(b); len(p) > 0 {
					err = fmt.Errorf("%s", strings.Join(p, "; "))
				}
			}
			if err == nil {
				t.Fatal("broken bootstrap accepted")
			}
			t.Log(err)
		})
	}
}
