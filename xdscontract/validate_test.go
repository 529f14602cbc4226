package xdscontract

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbac "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestValidateDeepLooksInsideAny(t *testing.T) {
	// An HttpConnectionManager without stat_prefix or route specifier:
	// ValidateAll on the Listener passes, because it stops at the Any.
	bad, err := anypb.New(&hcm.HttpConnectionManager{})
	if err != nil {
		t.Fatal(err)
	}
	l := &listener.Listener{Name: "x", ApiListener: &listener.ApiListener{ApiListener: bad}}
	if err := l.ValidateAll(); err != nil {
		t.Fatalf("precondition: Listener.ValidateAll = %v, want nil", err)
	}
	if err := ValidateDeep(l); !errors.Is(err, ErrInvalidResource) || !strings.Contains(err.Error(), "HttpConnectionManager") {
		t.Fatalf("validateDeep = %v, want the HttpConnectionManager refused", err)
	}
	// An Any two levels down: a router filter whose config is a bad Router.
	badRouter, _ := anypb.New(&router.Router{SuppressEnvoyHeaders: true, UpstreamHttpFilters: []*hcm.HttpFilter{{}}})
	m := &hcm.HttpConnectionManager{StatPrefix: "s", RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{}},
		HttpFilters: []*hcm.HttpFilter{{Name: wellknown.Router, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: badRouter}}}}
	if err := m.ValidateAll(); err != nil {
		t.Fatalf("precondition: HCM.ValidateAll = %v, want nil", err)
	}
	if err := ValidateDeep(m); err == nil {
		t.Fatal("validateDeep passed a Router with an unnamed upstream filter")
	}
	// An Any of a type nobody linked in is refused.
	unknown := &anypb.Any{TypeUrl: "type.googleapis.com/no.such.Type", Value: []byte{1}}
	l2 := &listener.Listener{Name: "x", ApiListener: &listener.ApiListener{ApiListener: unknown}}
	if err := ValidateDeep(l2); !errors.Is(err, ErrInvalidResource) {
		t.Fatalf("validateDeep(unknown Any) = %v", err)
	}
}

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"us-east", ""},
		{"meta-llama/Llama-3.1-8B-Instruct", ""},
		{"", "Region is empty"},
		{"a b", "visible ASCII"},
		{"caf\xc3\xa9", "contains byte 0xc3"},
		{strings.Repeat("x", MaxNameLen), ""},
		{strings.Repeat("x", MaxNameLen+1), "longer than 256 bytes"},
	} {
		err := CheckName("Region", tc.in)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckName(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestCheckHeaders(t *testing.T) {
	for _, tc := range []struct {
		model, hop, want string
	}{
		{DefaultModelHeader, DefaultHopHeader, ""},
		{"x_model.v2", "hop", ""},
		{"X-Model", DefaultHopHeader, `ModelHeader "X-Model" is not a valid header name`},
		{DefaultModelHeader, "x-hop!", `HopHeader "x-hop!" is not a valid header name`},
		{":path", DefaultHopHeader, "not a valid header name"},
		{"", DefaultHopHeader, "ModelHeader is empty"},
		{DefaultModelHeader, strings.Repeat("h", MaxNameLen+1), "HopHeader is longer"},
		{DefaultModelHeader, DefaultModelHeader, "must differ"},
		{PromptTokensHeader, DefaultHopHeader, "reserved for context-class routing"},
		{DefaultModelHeader, "content-length", "reserved for context-class routing"},
		{CriticalityHeader, DefaultHopHeader, "reserved for the criticality and residency routes"},
		{DefaultModelHeader, ResidencyHeader, "reserved for the criticality and residency routes"},
	} {
		err := CheckHeaders(tc.model, tc.hop)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckHeaders(%q, %q) = %v, want %q", tc.model, tc.hop, err, tc.want)
		}
	}
}

// TestAnyReach: the walk's pruning knows which types can hold an Any, also
// through recursive types and whatever the order of the questions.
func TestAnyReach(t *testing.T) {
	desc := func(m proto.Message) protoreflect.MessageDescriptor { return m.ProtoReflect().Descriptor() }
	want := []struct {
		m    proto.Message
		want bool
	}{
		{&structpb.Struct{}, false},
		{&structpb.Value{}, false},
		{&endpoint.Endpoint{}, false},
		{&core.Address{}, false},
		{&endpoint.LbEndpoint{}, true}, // metadata.typed_filter_metadata
		{&endpoint.ClusterLoadAssignment{}, true},
		{&anypb.Any{}, true},
		// Recursive: a Set holds Permissions that hold Sets, and a
		// Permission's matcher is a TypedExtensionConfig (an Any).
		{&rbac.Permission_Set{}, true},
		{&rbac.Permission{}, true},
	}
	for _, order := range [][]int{{0, 1, 2, 3, 4, 5, 6, 7, 8}, {8, 7, 6, 5, 4, 3, 2, 1, 0}} {
		r := anyReach{}
		for _, i := range order {
			if got := r.can(desc(want[i].m)); got != want[i].want {
				t.Errorf("order %v: can(%s) = %v, want %v", order, desc(want[i].m).FullName(), got, want[i].want)
			}
		}
	}
}

// TestValidateDeepFindsAnyInEndpointMetadata: the pruned walk still looks
// inside an Any in an endpoint's typed_filter_metadata, beside the
// filter_metadata Structs it skips.
func TestValidateDeepFindsAnyInEndpointMetadata(t *testing.T) {
	bad, err := anypb.New(&hcm.HttpConnectionManager{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := structpb.NewStruct(map[string]any{"cell": "c1", "nested": map[string]any{"x": 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	lb := &endpoint.LbEndpoint{
		HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{Address: &core.Address_SocketAddress{
			SocketAddress: &core.SocketAddress{Address: "10.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: 80}}}}}},
		Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{"isobar": st}},
	}
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "c", Endpoints: []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{lb}}}}
	if err := ValidateDeep(cla); err != nil {
		t.Fatalf("ValidateDeep(valid assignment) = %v", err)
	}
	lb.Metadata.TypedFilterMetadata = map[string]*anypb.Any{"x": bad}
	if err := cla.ValidateAll(); err != nil {
		t.Fatalf("precondition: ValidateAll = %v, want nil", err)
	}
	if err := ValidateDeep(cla); !errors.Is(err, ErrInvalidResource) || !strings.Contains(err.Error(), "HttpConnectionManager") {
		t.Fatalf("ValidateDeep = %v, want the HttpConnectionManager in the endpoint's metadata refused", err)
	}
}

// BenchmarkValidateDeepAssignment validates a ClusterLoadAssignment of
// 1,000 endpoints, each with isobar's filter_metadata, as a data plane does
// with every EDS response (a 1,000-cell controller sends eight such).
func BenchmarkValidateDeepAssignment(b *testing.B) {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "isobar/m", Endpoints: []*endpoint.LocalityLbEndpoints{{}}}
	for i := range 1000 {
		st, err := structpb.NewStruct(map[string]any{"cell": fmt.Sprintf("cell-%04d", i), "max_model_len": 32768.0})
		if err != nil {
			b.Fatal(err)
		}
		cla.Endpoints[0].LbEndpoints = append(cla.Endpoints[0].LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{Address: &core.Address_SocketAddress{
				SocketAddress: &core.SocketAddress{Address: fmt.Sprintf("10.0.%d.%d", i/256, i%256), PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8000}}}}}},
			Metadata:            &core.Metadata{FilterMetadata: map[string]*structpb.Struct{"isobar": st}},
			LoadBalancingWeight: wrapperspb.UInt32(1),
		})
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := ValidateDeep(cla); err != nil {
			b.Fatal(err)
		}
	}
}
