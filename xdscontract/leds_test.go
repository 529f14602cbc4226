package xdscontract

import (
	"strings"
	"testing"
)

func TestLEDSNamesRoundTrip(t *testing.T) {
	coll := LEDSCollection(ClusterName("meta-llama/Llama-3.1-8B")+"/local", "us-east", "")
	if !IsLEDSCollection(coll) || !strings.HasPrefix(coll, "xdstp://isobar/envoy.config.endpoint.v3.LbEndpoint/") {
		t.Fatalf("collection %q", coll)
	}
	if strings.Count(coll, "/") != 6 { // "xdstp://", after the authority, the type, the cluster and the locality
		t.Errorf("collection %q: a cluster or locality slash was not escaped", coll)
	}
	for _, hp := range []string{"10.0.0.1:8000", "[2001:db8::1]:443"} {
		n := LEDSEndpointName(coll, hp)
		if got, ok := LEDSCollectionOf(n); !ok || got != coll {
			t.Errorf("LEDSCollectionOf(%q) = %q, %v; want %q", n, got, ok, coll)
		}
		if IsLEDSCollection(n) {
			t.Errorf("%q taken for a collection", n)
		}
	}
	for _, bad := range []string{"", "isobar/m", coll, "xdstp://isobar/envoy.config.endpoint.v3.LbEndpoint/", "xdstp://other/envoy.config.endpoint.v3.LbEndpoint/a/b/c"} {
		if got, ok := LEDSCollectionOf(bad); ok {
			t.Errorf("LEDSCollectionOf(%q) = %q, true; want false", bad, got)
		}
	}
}

// FuzzLEDSCollectionOf: names come from delta clients; whatever they are,
// LEDSCollectionOf does not panic, and a collection it returns is one the
// name is a resource of.
func FuzzLEDSCollectionOf(f *testing.F) {
	coll := LEDSCollection("isobar/m", "r", "z")
	f.Add(LEDSEndpointName(coll, "10.0.0.1:80"))
	f.Add(coll)
	f.Add("xdstp://isobar/envoy.config.endpoint.v3.LbEndpoint//")
	f.Add("")
	f.Fuzz(func(t *testing.T, name string) {
		got, ok := LEDSCollectionOf(name)
		if !ok {
			return
		}
		if !IsLEDSCollection(got) || !strings.HasPrefix(name, strings.TrimSuffix(got, "*")) || strings.Contains(name[len(got)-1:], "/") {
			t.Fatalf("LEDSCollectionOf(%q) = %q", name, got)
		}
	})
}
