package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestIdentityURIs(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{CellURI("us-east", "us-east-1a-gpu0"), "spiffe://isobar/region/us-east/cell/us-east-1a-gpu0"},
		{RegionURI("us-east"), "spiffe://isobar/region/us-east"},
		{GlobalURI("global-0"), "spiffe://isobar/global/global-0"},
		{GatewayURI("eu-west"), "spiffe://isobar/gateway/eu-west"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestParseIdentity(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Identity
		wantErr bool
	}{
		{in: "spiffe://isobar/region/us-east/cell/c-1", want: CellIdentity("us-east", "c-1")},
		{in: "region/eu/cell/gpu.0", want: CellIdentity("eu", "gpu.0")},
		{in: "region/us_east.1", want: Identity{Kind: KindRegion, Name: "us_east.1"}},
		{in: "spiffe://isobar/gateway/eu", want: Identity{Kind: KindGateway, Name: "eu"}},
		{in: "global/g0", want: Identity{Kind: KindGlobal, Name: "g0"}},
		{in: "spiffe://other/cell/c", wantErr: true},
		{in: "spiffe://isobar/cell/c-1", wantErr: true}, // the older form without a region
		{in: "cell/c-1", wantErr: true},
		{in: "region/r/cell/", wantErr: true},
		{in: "region//cell/c", wantErr: true},
		{in: "region/r/cell/a/b", wantErr: true},
		{in: "region/r/gateway/g", wantErr: true},
		{in: "region/r/", wantErr: true},
		{in: "https://isobar/cell/c", wantErr: true},
		{in: "spiffe://isobar/cell/a/b", wantErr: true},
		{in: "spiffe://isobar/cell/", wantErr: true},
		{in: "spiffe://isobar/cell/..", wantErr: true},
		{in: "spiffe://isobar/planet/x", wantErr: true},
		{in: "spiffe://isobar/cell", wantErr: true},
		{in: "cell/a b", wantErr: true},
		{in: "cell/" + strings.Repeat("a", 129), wantErr: true},
		{in: "", wantErr: true},
	} {
		got, err := ParseIdentity(tc.in)
		if tc.wantErr {
			if !errors.Is(err, ErrNotIdentity) {
				t.Errorf("ParseIdentity(%q) = %v, %v; want ErrNotIdentity", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseIdentity(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if back, err := ParseIdentity(got.URI()); err != nil || back != got {
			t.Errorf("round trip of %v: %v, %v", got, back, err)
		}
	}
}

func TestPeerIdentity(t *testing.T) {
	mk := func(uris ...string) *x509.Certificate {
		c := &x509.Certificate{}
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			c.URIs = append(c.URIs, u)
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		cert    *x509.Certificate
		want    Identity
		wantErr bool
	}{
		{"one", mk("spiffe://isobar/region/r/cell/c1"), CellIdentity("r", "c1"), false},
		{"older cell form", mk("spiffe://isobar/cell/c1"), Identity{}, true},
		{"foreign ignored", mk("spiffe://other/x/y", "spiffe://isobar/region/r"), Identity{Kind: KindRegion, Name: "r"}, false},
		{"duplicate same", mk("spiffe://isobar/region/r", "spiffe://isobar/region/r"), Identity{Kind: KindRegion, Name: "r"}, false},
		{"two identities", mk("spiffe://isobar/region/r", "spiffe://isobar/region/r/cell/c"), Identity{}, true},
		{"none", mk("https://isobar/cell/c"), Identity{}, true},
		{"bad isobar uri", mk("spiffe://isobar/cell/a/b"), Identity{}, true},
		{"nil", nil, Identity{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PeerIdentity(tc.cert)
			if tc.wantErr {
				if !errors.Is(err, ErrNotIdentity) {
					t.Fatalf("got %v, %v; want ErrNotIdentity", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestIdentityLeafUsages(t *testing.T) {
	for _, tc := range []struct {
		kind           Kind
		server, client bool
	}{
		{KindCell, false, true},
		{KindGateway, false, true},
		{KindRegion, true, true},
		{KindGlobal, true, true},
	} {
		id := Identity{Kind: tc.kind, Name: "n"}
		if tc.kind == KindCell {
			id.Region = "r"
		}
		l := id.Leaf(nil, nil)
		if l.Server != tc.server || l.Client != tc.client || l.Name != "n" || len(l.URIs) != 1 {
			t.Errorf("%s: %+v", tc.kind, l)
		}
	}
}

// TestOlderCellIdentityRefused: a certificate issued before cells carried
// their region is refused with a message that says how to reissue it.
func TestOlderCellIdentityRefused(t *testing.T) {
	_, err := ParseIdentity("spiffe://isobar/cell/gpu0")
	if !errors.Is(err, ErrNotIdentity) || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--role cellagent") {
		t.Fatalf("ParseIdentity(older cell form) = %v; want ErrNotIdentity and ErrInvalid naming --role cellagent", err)
	}
}

func TestIdentityValidateRegion(t *testing.T) {
	for _, tc := range []struct {
		id Identity
		ok bool
	}{
		{CellIdentity("us-east", "c"), true},
		{Identity{Kind: KindCell, Name: "c"}, false},
		{Identity{Kind: KindRegion, Name: "us-east", Region: "us-east"}, false},
		{CellIdentity("a b", "c"), false},
	} {
		if err := tc.id.Validate(); (err == nil) != tc.ok {
			t.Errorf("%#v.Validate() = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

// VerifiedIdentity reads only the verified chain: a peer certificate that
// was presented but not verified names nobody.
func TestVerifiedIdentity(t *testing.T) {
	u, _ := url.Parse(CellURI("r", "c1"))
	leaf := &x509.Certificate{URIs: []*url.URL{u}}
	if id, err := VerifiedIdentity(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}); err != nil || id != CellIdentity("r", "c1") {
		t.Errorf("verified chain: %v, %v", id, err)
	}
	for name, cs := range map[string]tls.ConnectionState{
		"nothing":            {},
		"presented only":     {PeerCertificates: []*x509.Certificate{leaf}},
		"empty chain":        {VerifiedChains: [][]*x509.Certificate{{}}},
		"no isobar identity": {VerifiedChains: [][]*x509.Certificate{{{}}}},
	} {
		if id, err := VerifiedIdentity(cs); !errors.Is(err, ErrNotIdentity) {
			t.Errorf("%s: %v, %v; want ErrNotIdentity", name, id, err)
		}
	}
}
