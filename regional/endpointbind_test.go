package regional

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// With mTLS a cell's advertised endpoint must be allowed by its
// certificate (an IP SAN by default; the map's prefixes with mapping) or
// the operator turns the binding off. A refusal is PermissionDenied naming
// the fix, counted as endpoint_not_allowed, and never reaches the
// registry. On the old code every case was accepted: a cell could point
// traffic at any address.
func TestEndpointBinding(t *testing.T) {
	pki := newIDPKI(t)
	srvCert, srvKey := pki.issue("regional", certs.Identity{Kind: certs.KindRegion, Name: "r1"})
	endpointMap, err := ParseEndpointMap("# pod network of the m cells\ncell-m* 10.20.0.0/16\n")
	if err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		cell, endpoint string
		sans           []string
		ok             bool
	}
	for _, tc := range []struct {
		name     string
		binding  EndpointBinding
		m        *EndpointMap
		attempts []attempt
	}{
		{"default (san)", "", nil, []attempt{
			{"cell-a", "127.0.0.1:3001", []string{"127.0.0.1"}, true},
			{"cell-b", "10.0.0.9:8000", []string{"10.0.0.9", "10.0.0.10"}, true},
			// Its certificate is for 10.0.0.7: it claims another address
			// (another cell's, say).
			{"cell-c", "10.0.0.9:8000", []string{"10.0.0.7"}, false},
			{"cell-d", "127.0.0.1:3004", nil, false},
			{"cell-e", "[::ffff:10.0.0.5]:8000", []string{"10.0.0.5"}, true},
		}},
		{"mapping", BindMapping, endpointMap, []attempt{
			{"cell-m1", "10.20.3.4:8000", nil, true},
			{"cell-m2", "10.21.3.4:8000", nil, false},
			{"cell-x", "10.20.3.4:8000", nil, false},
			{"cell-y", "192.0.2.1:8000", []string{"192.0.2.1"}, true}, // an IP SAN still counts
		}},
		{"off", BindOff, nil, []attempt{
			{"cell-a", "10.9.9.9:8000", nil, true},
			{"cell-b", "127.0.0.1:3002", []string{"10.0.0.7"}, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := startController(t, func(cfg *Config) {
				cfg.TLS = TLSFiles{Cert: srvCert, Key: srvKey, CA: pki.caFile}
				cfg.EndpointBinding, cfg.EndpointMap = tc.binding, tc.m
			})
			refused := func() float64 { return testutil.ToFloat64(c.metrics.rejected.WithLabelValues("endpoint_not_allowed")) }
			for _, a := range tc.attempts {
				before := refused()
				file := strings.NewReplacer(" ", "_", "(", "", ")", "").Replace(tc.name) + "-" + a.cell
				cert, key := pki.issueLeaf(file, certs.CellIdentity("r1", a.cell).Leaf(nil, ips(a.sans)))
				s := openStream(t, dialController(t, c.Addr(), pki.rawCreds(cert, key)))
				_ = s.Send(heartbeat(a.cell, a.endpoint, isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
				ack, err := recvAck(t, s)
				if a.ok {
					if err != nil || ack.GetError() != "" {
						t.Fatalf("%s advertising %s with IP SANs %v: %v %v, want accepted", a.cell, a.endpoint, a.sans, ack, err)
					}
					waitCell(t, c, a.cell, func(CellView) bool { return true })
					continue
				}
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "--endpoint-binding") {
					t.Fatalf("%s advertising %s with IP SANs %v: %v, want PermissionDenied naming the fix", a.cell, a.endpoint, a.sans, err)
				}
				if got := refused(); got != before+1 {
					t.Errorf("rejected{endpoint_not_allowed} = %v, want %v", got, before+1)
				}
				if _, ok := c.Registry().View().Cell(a.cell); ok {
					t.Errorf("%s reached the registry with a refused endpoint", a.cell)
				}
			}
		})
	}
}

func ips(s []string) []net.IP {
	var out []net.IP
	for _, ip := range s {
		out = append(out, net.ParseIP(ip))
	}
	return out
}

// The binding's configuration is checked up front: san and mapping need
// mTLS, mapping needs a map, a map needs mapping, and the default follows
// TLS (san with it, off without) even when TLS is set after DefaultConfig.
func TestEndpointBindingConfig(t *testing.T) {
	tlsOn := TLSFiles{Cert: "c", Key: "k", CA: "a"}
	m, err := ParseEndpointMap("* 10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		tls     TLSFiles
		binding EndpointBinding
		m       *EndpointMap
		want    EndpointBinding
		err     string
	}{
		{"default with TLS", tlsOn, "", nil, BindSAN, ""},
		{"default without TLS", TLSFiles{}, "", nil, BindOff, ""},
		{"off with TLS", tlsOn, BindOff, nil, BindOff, ""},
		{"mapping with a map", tlsOn, BindMapping, m, BindMapping, ""},
		{"san without TLS", TLSFiles{}, BindSAN, nil, "", "needs mTLS"},
		{"mapping without a map", tlsOn, BindMapping, nil, "", "--endpoint-map-file"},
		{"a map with san", tlsOn, BindSAN, m, "", "set --endpoint-binding=mapping"},
		{"unknown", tlsOn, "strict", nil, "", "want one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig("r1")
			cfg.TLS, cfg.EndpointBinding, cfg.EndpointMap = tc.tls, tc.binding, tc.m
			err := cfg.validateEndpointBinding()
			if tc.err != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("validate = %v, want ErrInvalidConfig mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.endpointBinding(); got != tc.want {
				t.Fatalf("binding in force = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestParseEndpointMap(t *testing.T) {
	m, err := ParseEndpointMap(`
# comment
gpu-*      10.244.0.0/16, 10.245.0.0/16   # pod networks
gpu-0      192.0.2.10
edge-[0-3] 2001:db8::/64
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cell, addr string
		ok         bool
	}{
		{"gpu-7", "10.244.9.9", true},
		{"gpu-7", "10.245.0.1", true},
		{"gpu-7", "192.0.2.10", false},
		{"gpu-0", "192.0.2.10", true},
		{"gpu-0", "::ffff:10.244.0.1", true},
		{"edge-2", "2001:db8::5", true},
		{"edge-4", "2001:db8::5", false},
		{"other", "10.244.9.9", false},
	} {
		if got := m.Allows(tc.cell, netip.MustParseAddr(tc.addr)); got != tc.ok {
			t.Errorf("Allows(%s, %s) = %v, want %v", tc.cell, tc.addr, got, tc.ok)
		}
	}
	for _, bad := range []string{"", "# only a comment\n", "gpu-*\n", "gpu-* 10.0.0.0/33", "gpu-* host.example", "[ 10.0.0.1", "gpu-* fe80::1%eth0"} {
		if _, err := ParseEndpointMap(bad); !errors.Is(err, ErrInvalidEndpointMap) {
			t.Errorf("ParseEndpointMap(%q) = %v, want ErrInvalidEndpointMap", bad, err)
		}
	}
}

// FuzzParseEndpointMap: the parser of --endpoint-map-file never panics, and
// whatever it accepts answers Allows without panicking, a prefix of a rule
// covering the rule's own addresses.
func FuzzParseEndpointMap(f *testing.F) {
	f.Add("* 10.244.0.0/16\ngpu-0 192.0.2.10, 2001:db8::/64 # c\n")
	f.Add("gpu-[0-7] ::ffff:10.0.0.1\n")
	f.Add("[ 10.0.0.1")
	f.Add("")
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 1<<16 {
			return
		}
		m, err := ParseEndpointMap(text)
		if err != nil {
			if !errors.Is(err, ErrInvalidEndpointMap) {
				t.Fatalf("error %v does not wrap ErrInvalidEndpointMap", err)
			}
			return
		}
		for _, r := range m.rules {
			for _, p := range r.prefixes {
				if !p.IsValid() || !p.Contains(p.Addr()) {
					t.Fatalf("rule %q: bad prefix %v", r.pattern, p)
				}
				m.Allows("gpu-0", p.Addr())
			}
		}
	})
}
