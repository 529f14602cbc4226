package certs

import (
	"errors"
	"testing"
)

// FuzzParseIdentity: identities come from peers' certificates. Parsing
// never panics, every error has a class, and what parses round-trips.
func FuzzParseIdentity(f *testing.F) {
	for _, s := range []string{
		"spiffe://isobar/cell/c-1", "region/us-east", "spiffe://isobar/global/g0",
		"spiffe://isobar/gateway/eu", "spiffe://isobar/cell/a/b", "spiffe://other/cell/x",
		"cell/..", "", "/", "spiffe://isobar/", "cell/\x00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseIdentity(s)
		if err != nil {
			if !errors.Is(err, ErrNotIdentity) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("parsed %q into invalid %v: %v", s, id, err)
		}
		back, err := ParseIdentity(id.URI())
		if err != nil || back != id {
			t.Fatalf("round trip %v: %v, %v", id, back, err)
		}
	})
}

// FuzzParseCertificates: isobar certs show and every --tls-* flag read
// files from outside. No panic; an error is always ErrNoCertificate; a
// success returns at least one certificate.
func FuzzParseCertificates(f *testing.F) {
	ca, err := NewCA(CAConfig{})
	if err != nil {
		f.Fatal(err)
	}
	is, err := ca.Issue(CellIdentity("r", "c").Leaf(nil, nil))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ca.CertPEM())
	f.Add(append(append([]byte{}, is.CertPEM...), ca.CertPEM()...))
	f.Add(ca.Certificate().Raw)
	f.Add(is.KeyPEM)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		cs, err := ParseCertificates(data)
		if err != nil {
			if !errors.Is(err, ErrNoCertificate) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if len(cs) == 0 {
			t.Fatal("success without a certificate")
		}
	})
}

// FuzzParseKey: key files come from outside. No panic; errors are ErrBadKey.
func FuzzParseKey(f *testing.F) {
	ca, err := NewCA(CAConfig{})
	if err != nil {
		f.Fatal(err)
	}
	is, err := ca.Issue(CellIdentity("r", "c").Leaf(nil, nil))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(is.KeyPEM)
	f.Add(is.CertPEM)
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\nAA==\n-----END EC PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN RSA PRIVATE KEY-----\nAA==\n-----END RSA PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		k, err := parseKey(data)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if k == nil || k.Public() == nil {
			t.Fatal("success without a key")
		}
	})
}
