package gateway

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// unitGateway is a gateway that is never started: its table is applied
// by hand (apply) and requests are served through its handler.
func unitGateway(t testing.TB, cfg Config, deps Deps) *testGateway {
	t.Helper()
	if cfg.Controller == "" {
		cfg.Controller = "127.0.0.1:1"
	}
	if cfg.Region == "" {
		cfg.Region = "r1"
	}
	reg := prometheus.NewRegistry()
	deps.Registerer, deps.Gatherer, deps.DialOptions = reg, reg, insecureDial
	if deps.Logger == nil {
		deps.Logger = testLogger(t)
	}
	g, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return &testGateway{Gateway: g, reg: reg}
}

func mustResidency(t testing.TB, js string) *residency.Config {
	t.Helper()
	c, err := residency.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const testResidency = `{"sets": {"eu": ["r1", "r3"], "us": ["r2"]}, "tenants": {"acme-eu": "eu"}, "models": {"pinned-model": "us"}}`

// TestClassifyTrust: an untrusted client cannot promote itself to
// critical (by header or by objective), a trusted source or a proven hop
// can, and anyone may demote itself; bad values are standard and counted.
func TestClassifyTrust(t *testing.T) {
	trusted, err := ParseTrustedSources("10.0.0.0/8, 192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	g := unitGateway(t, Config{TrustedSources: trusted, ObjectivePriority: map[string]int{"chat": 5, "batch": -1, "default": 0}}, Deps{})
	for _, tc := range []struct {
		name    string
		hdr     map[string][]string
		remote  string
		hop     bool
		want    reqclass.Criticality
		counted string
	}{
		{"no header", nil, "203.0.113.1:5", false, reqclass.Standard, ""},
		{"untrusted critical demoted", map[string][]string{xdscontract.CriticalityHeader: {"critical"}}, "203.0.113.1:5", false, reqclass.Standard, classDemoted},
		{"untrusted objective critical demoted", map[string][]string{xdscontract.ObjectiveHeader: {"chat"}}, "203.0.113.1:5", false, reqclass.Standard, classDemoted},
		{"unknown source demoted", map[string][]string{xdscontract.CriticalityHeader: {"critical"}}, "", false, reqclass.Standard, classDemoted},
		{"trusted prefix keeps critical", map[string][]string{xdscontract.CriticalityHeader: {"Critical"}}, "10.1.2.3:80", false, reqclass.Critical, ""},
		{"trusted address keeps critical", map[string][]string{xdscontract.CriticalityHeader: {" critical "}}, "192.0.2.7:1", false, reqclass.Critical, ""},
		{"v4-mapped trusted", map[string][]string{xdscontract.CriticalityHeader: {"critical"}}, "[::ffff:10.0.0.1]:80", false, reqclass.Critical, ""},
		{"proven hop keeps critical", map[string][]string{xdscontract.CriticalityHeader: {"critical"}}, "203.0.113.1:5", true, reqclass.Critical, ""},
		{"untrusted may demote itself", map[string][]string{xdscontract.CriticalityHeader: {"sheddable"}}, "203.0.113.1:5", false, reqclass.Sheddable, ""},
		{"objective sheddable", map[string][]string{xdscontract.ObjectiveHeader: {"batch"}}, "203.0.113.1:5", false, reqclass.Sheddable, ""},
		{"trusted objective critical", map[string][]string{xdscontract.ObjectiveHeader: {"chat"}}, "10.0.0.9:5", false, reqclass.Critical, ""},
		{"header wins over objective", map[string][]string{xdscontract.CriticalityHeader: {"sheddable"}, xdscontract.ObjectiveHeader: {"chat"}}, "10.0.0.9:5", false, reqclass.Sheddable, ""},
		{"unknown value", map[string][]string{xdscontract.CriticalityHeader: {"urgent!!"}}, "10.0.0.9:5", false, reqclass.Standard, classUnknown},
		{"repeated header", map[string][]string{xdscontract.CriticalityHeader: {"critical", "critical"}}, "10.0.0.9:5", false, reqclass.Standard, classRepeated},
		{"unmapped objective", map[string][]string{xdscontract.ObjectiveHeader: {"nope"}}, "10.0.0.9:5", false, reqclass.Standard, classUnknownObjective},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			for k, vs := range tc.hdr {
				for _, v := range vs {
					hdr.Add(k, v)
				}
			}
			var before float64
			if tc.counted != "" {
				before = g.metric(t, "isobar_gateway_request_class_anomalies_total", map[string]string{"reason": tc.counted})
			}
			c, set, _ := g.classify(hdr, tc.remote, tc.hop, "m")
			if c.crit != tc.want {
				t.Fatalf("criticality %s, want %s", c.crit, tc.want)
			}
			if got := hdr.Values(xdscontract.CriticalityHeader); len(got) != 1 || got[0] != tc.want.String() {
				t.Errorf("criticality header after %q, want exactly %q", got, tc.want)
			}
			if len(set) == 0 || set[0] != [2]string{xdscontract.CriticalityHeader, tc.want.String()} {
				t.Errorf("set %v does not start with the criticality header", set)
			}
			if tc.counted != "" {
				if d := g.metric(t, "isobar_gateway_request_class_anomalies_total", map[string]string{"reason": tc.counted}) - before; d != 1 {
					t.Errorf("%s counted %v times, want 1", tc.counted, d)
				}
			}
		})
	}
}

// TestClassifyTenantAndResidency: the tenant is normalised and bounded,
// the residency header is the gateway's own decision (set from its config,
// removed when unpinned, whatever the client sent).
func TestClassifyTenantAndResidency(t *testing.T) {
	g := unitGateway(t, Config{Residency: mustResidency(t, testResidency), MaxTenants: 2}, Deps{})
	long := strings.Repeat("t", reqclass.MaxTenantLen+10)
	for _, tc := range []struct {
		name               string
		tenant, res, model string
		wantTenant, bucket string
		wantSet            string
		removed            []string
	}{
		{"pinned tenant", "acme-eu", "", "m", "acme-eu", "acme-eu", "eu", nil},
		{"client claims a set", "", "eu", "m", "", "", "", []string{strings.ToLower(xdscontract.ResidencyHeader)}},
		{"client overrides a pin", "acme-eu", "us", "m", "acme-eu", "acme-eu", "eu", nil},
		{"pinned model", "b", "", "pinned-model", "b", "b", "us", nil},
		{"both pinned", "acme-eu", "", "pinned-model", "acme-eu", "acme-eu", "eu+us", nil},
		{"long tenant truncated", long, "", "m", long[:reqclass.MaxTenantLen], reqclass.OtherTenant, "", nil},
		{"bad tenant dropped", "a\x01b", "", "m", "", "", "", []string{strings.ToLower(xdscontract.TenantHeader)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			if tc.tenant != "" {
				hdr.Set(xdscontract.TenantHeader, tc.tenant)
			}
			if tc.res != "" {
				hdr.Set(xdscontract.ResidencyHeader, tc.res)
			}
			c, _, removed := g.classify(hdr, "", false, tc.model)
			if c.tenant != tc.wantTenant || c.set != tc.wantSet || (tc.bucket != "" && c.bucket != tc.bucket) {
				t.Fatalf("tenant %q bucket %q set %q, want %q %q %q", c.tenant, c.bucket, c.set, tc.wantTenant, tc.bucket, tc.wantSet)
			}
			if got := hdr.Get(xdscontract.ResidencyHeader); got != tc.wantSet {
				t.Errorf("residency header %q, want %q", got, tc.wantSet)
			}
			if got := hdr.Get(xdscontract.TenantHeader); got != tc.wantTenant {
				t.Errorf("tenant header %q, want %q", got, tc.wantTenant)
			}
			for _, r := range tc.removed {
				if !strings.Contains(strings.Join(removed, ","), r) {
					t.Errorf("removed %v, want %s among them", removed, r)
				}
			}
		})
	}
	// Two distinct tenants are tracked (MaxTenants 2: acme-eu and b
	// above); a third pools.
	third := http.Header{}
	third.Set(xdscontract.TenantHeader, "third")
	c, _, _ := g.classify(third, "", false, "m")
	if c.bucket != reqclass.OtherTenant || c.tenant != "third" {
		t.Errorf("third tenant: bucket %q tenant %q, want pooled", c.bucket, c.tenant)
	}
	if g.metric(t, "isobar_gateway_request_class_anomalies_total", map[string]string{"reason": classTenantPooled}) < 1 {
		t.Error("pooled tenant not counted")
	}
}

func TestParseTrustedSources(t *testing.T) {
	got, err := ParseTrustedSources(" 10.0.0.0/8 ,::1, 192.168.1.5/24,")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("192.168.1.0/24")}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%d: %v, want %v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "1.2.3"} {
		if _, err := ParseTrustedSources(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if p, err := ParseTrustedSources(""); err != nil || p != nil {
		t.Errorf("empty: %v %v", p, err)
	}
}

// FuzzClassify: whatever the class headers and peer, classify never
// panics, leaves exactly one valid criticality header (never critical from
// an untrusted peer), a bounded valid tenant header and the residency
// header the config decides.
func FuzzClassify(f *testing.F) {
	f.Add("critical", "acme-eu", "chat", "eu", "10.0.0.1:1", false)
	f.Add("CRITICAL", "a\x00", "", "", "203.0.113.1:9", false)
	f.Add("sheddable", strings.Repeat("é", 40), "batch", "us", "", true)
	f.Add("", "", "", "x", "[::1]:80", false)
	trusted, _ := ParseTrustedSources("10.0.0.0/8")
	g := unitGateway(f, Config{TrustedSources: trusted, Residency: mustResidency(f, testResidency), ObjectivePriority: map[string]int{"chat": 1, "batch": -1}}, Deps{Logger: discardLogger()})
	f.Fuzz(func(t *testing.T, crit, tenant, objective, res, remote string, hop bool) {
		hdr := http.Header{}
		for k, v := range map[string]string{xdscontract.CriticalityHeader: crit, xdscontract.TenantHeader: tenant, xdscontract.ObjectiveHeader: objective, xdscontract.ResidencyHeader: res} {
			if v != "" {
				hdr.Set(k, v)
			}
		}
		c, _, _ := g.classify(hdr, remote, hop, "m")
		vs := hdr.Values(xdscontract.CriticalityHeader)
		if len(vs) != 1 {
			t.Fatalf("criticality header %q", vs)
		}
		if p, ok := reqclass.Parse(vs[0]); !ok || p != c.crit {
			t.Fatalf("criticality header %q for %s", vs[0], c.crit)
		}
		if c.crit == reqclass.Critical && !hop && !g.trustedSource(remote) {
			t.Fatalf("untrusted %q promoted to critical", remote)
		}
		tv := hdr.Get(xdscontract.TenantHeader)
		if len(tv) > reqclass.MaxTenantLen || !utf8.ValidString(tv) || tv != c.tenant {
			t.Fatalf("tenant header %q (class %q)", tv, c.tenant)
		}
		if got, want := hdr.Get(xdscontract.ResidencyHeader), g.cfg.Residency.Lookup(c.tenant, "m"); got != want {
			t.Fatalf("residency header %q, want %q", got, want)
		}
	})
}
