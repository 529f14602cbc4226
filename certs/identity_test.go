package certs

import (
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestIdentityURIs(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{CellURI("us-east-1a-gpu0"), "spiffe://isobar/cell/us-east-1a-gpu0"},
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
		{in: "spiffe://isobar/cell/c-1", want: Identity{KindCell, "c-1"}},
		{in: "region/us_east.1", want: Identity{KindRegion, "us_east.1"}},
		{in: "spiffe://isobar/gateway/eu", want: Identity{KindGateway, "eu"}},
		{in: "global/g0", want: Identity{KindGlobal, "g0"}},
		{in: "spiffe://other/cell/c", wantErr: true},
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
		{"one", mk("spiffe://isobar/cell/c1"), Identity{KindCell, "c1"}, false},
		{"foreign ignored", mk("spiffe://other/x/y", "spiffe://isobar/region/r"), Identity{KindRegion, "r"}, false},
		{"duplicate same", mk("spiffe://isobar/region/r", "spiffe://isobar/region/r"), Identity{KindRegion, "r"}, false},
		{"two identities", mk("spiffe://isobar/region/r", "spiffe://isobar/cell/c"), Identity{}, true},
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
		l := Identity{tc.kind, "n"}.Leaf(nil, nil)
		if l.Server != tc.server || l.Client != tc.client || l.Name != "n" || len(l.URIs) != 1 {
			t.Errorf("%s: %+v", tc.kind, l)
		}
	}
}
