package deploy

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	dcv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// The typed configs the bootstrap packs into Any; importing their packages
// registers them for protojson. Listed so that the imports are used.
var _ = []proto.Message{
	(*routerv3.Router)(nil), (*hcmv3.HttpConnectionManager)(nil), (*dcv3.DownstreamConnectionsConfig)(nil),
	(*tlsv3.UpstreamTlsContext)(nil), (*httpv3.HttpProtocolOptions)(nil),
	(*extprocv3.ExternalProcessor)(nil), (*headermutationv3.HeaderMutation)(nil),
}

// parseBootstrap converts YAML to JSON and unmarshals it strictly (unknown
// fields and unregistered Any types are errors).
func parseBootstrap(yamlText []byte) (*bootstrapv3.Bootstrap, error) {
	j, err := toJSON(yamlText)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(j, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

type validator interface{ ValidateAll() error }

// validateDeep runs ValidateAll on m and on every message packed in an Any
// anywhere inside it (ValidateAll does not look inside Any). It returns
// the number of Any messages checked.
func validateDeep(m proto.Message) (int, error) {
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return 0, fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	n := 0
	var walk func(protoreflect.Message) error
	walk = func(msg protoreflect.Message) error {
		if a, ok := msg.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				return fmt.Errorf("Any %s: %w", a.GetTypeUrl(), err)
			}
			k, err := validateDeep(inner)
			n += k + 1
			return err
		}
		var err error
		msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := 0; i < v.List().Len() && err == nil; i++ {
					err = walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					err = walk(mv.Message())
					return err == nil
				})
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				err = walk(v.Message())
			}
			return err == nil
		})
		return err
	}
	err := walk(m.ProtoReflect())
	return n, err
}

func readBootstrap(t *testing.T) []byte {
	t.Helper()
	return readEnvoy(t, "envoy/bootstrap.yaml")
}

func readEnvoy(t *testing.T, name string) []byte {
	t.Helper()
	data, err := fs.ReadFile(deployFS(), name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestEnvoyBootstrapValidates(t *testing.T) {
	b, err := parseBootstrap(readBootstrap(t))
	if err != nil {
		t.Fatal(err)
	}
	anys, err := validateDeep(b)
	if err != nil {
		t.Fatal(err)
	}
	if anys < 5 {
		t.Errorf("validated %d typed configs, want at least 5 (TLS, HTTP/2 options, HCM, router, overload)", anys)
	}

	// Admin only on loopback.
	if a := b.GetAdmin().GetAddress().GetSocketAddress().GetAddress(); a != "127.0.0.1" {
		t.Errorf("admin address %q, want 127.0.0.1", a)
	}
	// LDS and CDS over ADS, v3, from a gRPC cluster that exists statically.
	dr := b.GetDynamicResources()
	for name, cs := range map[string]*corev3.ConfigSource{"lds": dr.GetLdsConfig(), "cds": dr.GetCdsConfig()} {
		if cs.GetAds() == nil || cs.GetResourceApiVersion() != corev3.ApiVersion_V3 {
			t.Errorf("%s_config is not ADS v3: %v", name, cs)
		}
	}
	ads := dr.GetAdsConfig()
	if ads.GetApiType() != corev3.ApiConfigSource_GRPC || ads.GetTransportApiVersion() != corev3.ApiVersion_V3 || len(ads.GetGrpcServices()) != 1 {
		t.Fatalf("ads_config: %v", ads)
	}
	xdsName := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	found := false
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != xdsName {
			continue
		}
		found = true
		// HTTP/2 to the controller.
		po := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		var hpo httpv3.HttpProtocolOptions
		if po == nil || po.UnmarshalTo(&hpo) != nil || hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s does not speak HTTP/2", xdsName)
		}
		// mTLS: client certificate, CA, and a pinned identity.
		var utc tlsv3.UpstreamTlsContext
		if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&utc); err != nil {
			t.Fatalf("cluster %s transport socket: %v", xdsName, err)
		}
		ctc := utc.GetCommonTlsContext()
		if len(ctc.GetTlsCertificates()) != 1 || ctc.GetTlsCertificates()[0].GetCertificateChain().GetFilename() == "" ||
			ctc.GetTlsCertificates()[0].GetPrivateKey().GetFilename() == "" {
			t.Errorf("cluster %s presents no client certificate", xdsName)
		}
		vc := ctc.GetValidationContext()
		if vc.GetTrustedCa().GetFilename() == "" {
			t.Errorf("cluster %s trusts no CA", xdsName)
		}
		sans := vc.GetMatchTypedSubjectAltNames()
		const regionURI = "spiffe://isobar/region/"
		if len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_URI ||
			(sans[0].GetMatcher().GetPrefix() != regionURI && !strings.HasPrefix(sans[0].GetMatcher().GetExact(), regionURI)) {
			t.Errorf("cluster %s does not check the controller's identity: %v", xdsName, sans)
		}
		if ctc.GetTlsParams().GetTlsMinimumProtocolVersion() != tlsv3.TlsParameters_TLSv1_3 {
			t.Errorf("cluster %s allows TLS below 1.3", xdsName)
		}
	}
	if !found {
		t.Fatalf("ADS cluster %q is not a static cluster", xdsName)
	}
}

// TestEnvoyBootstrapValidationBites: the checks above must fail on broken
// bootstraps, including errors hidden inside typed configs.
func TestEnvoyBootstrapValidationBites(t *testing.T) {
	good := string(readBootstrap(t))
	for _, tc := range []struct {
		name, old, new string
	}{
		{"port out of range", "port_value: 18000", "port_value: 700000"},
		{"unknown field", "connect_timeout: 1s\n    load_assignment:\n      cluster_name: isobar_xds", "connect_timeout: 1s\n    bogus_field: 1\n    load_assignment:\n      cluster_name: isobar_xds"},
		{"unregistered Any type", "envoy.extensions.filters.http.router.v3.Router", "envoy.extensions.filters.http.router.v3.Routerz"},
		{"bad enum inside Any", "TLSv1_3", "TLSv9"},
		{"empty stat prefix inside HCM", "stat_prefix: envoy_stats", "stat_prefix: \"\""},
		{"empty filename inside TLS", "filename: /etc/isobar/tls/ca.pem", "filename: \"\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("bootstrap no longer contains %q", tc.old)
			}
			b, err := parseBootstrap([]byte(strings.Replace(good, tc.old, tc.new, 1)))
			if err == nil {
				_, err = validateDeep(b)
			}
			if err == nil {
				t.Fatal("broken bootstrap accepted")
			}
			t.Log(err)
		})
	}
}
