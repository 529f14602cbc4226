package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newTestCA(t *testing.T, opts ...Option) *CA {
	t.Helper()
	ca, err := NewCA(CAConfig{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestNewCADefaults(t *testing.T) {
	ca := newTestCA(t, WithClock(clockwork.NewFakeClockAt(t0)))
	c := ca.Certificate()
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("CA basic constraints: IsCA=%v valid=%v maxPathLen=%d zero=%v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Error("CA cannot sign certificates")
	}
	if got, want := c.NotAfter, t0.Add(DefaultCATTL); !got.Equal(want) {
		t.Errorf("NotAfter = %v, want %v", got, want)
	}
	if got, want := c.NotBefore, t0.Add(-time.Minute); !got.Equal(want) {
		t.Errorf("NotBefore = %v, want %v", got, want)
	}
	k, ok := c.PublicKey.(*ecdsa.PublicKey)
	if !ok || k.Curve.Params().Name != "P-256" {
		t.Errorf("key = %T, want ECDSA P-256", c.PublicKey)
	}
	if c.Subject.CommonName != DefaultCACommonName {
		t.Errorf("CN = %q", c.Subject.CommonName)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	if _, err := ParseCertificates(ca.CertPEM()); err != nil {
		t.Error(err)
	}
}

func TestCAConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  CAConfig
		want string
	}{
		{"short ttl", CAConfig{TTL: time.Minute}, "at least 1h"},
		{"negative ttl", CAConfig{TTL: -time.Hour}, "at least 1h"},
		{"long cn", CAConfig{CommonName: strings.Repeat("x", 65)}, "at most 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewCA(tc.cfg)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestWriteDirPermissionsAndNoClobber(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca := newTestCA(t)
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{CACertFile: 0o644, CAKeyFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode = %v, want %v", name, fi.Mode().Perm(), want)
		}
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode = %v, want 0700", fi.Mode().Perm())
	}
	before, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))

	other := newTestCA(t)
	err := other.WriteDir(dir, false)
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("second WriteDir: err = %v, want ErrExists with a --force hint", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if !bytes.Equal(before, after) {
		t.Fatal("refused WriteDir changed the key file")
	}

	// Only the key left behind: still refused, and the cert is not written.
	if err := os.Remove(filepath.Join(dir, CACertFile)); err != nil {
		t.Fatal(err)
	}
	if err := other.WriteDir(dir, false); !errors.Is(err, ErrExists) {
		t.Fatalf("WriteDir over a lone key: err = %v, want ErrExists", err)
	}
	if _, err := os.Stat(filepath.Join(dir, CACertFile)); !os.IsNotExist(err) {
		t.Fatalf("refused WriteDir wrote the certificate: %v", err)
	}

	if err := other.WriteDir(dir, true); err != nil {
		t.Fatalf("overwrite: %v", err)
	}
	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Certificate().Equal(other.Certificate()) {
		t.Fatal("LoadCA after overwrite returned the old CA")
	}
	if fi, _ := os.Stat(filepath.Join(dir, CAKeyFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("overwritten key mode = %v", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("dir holds %d entries, want 2 (no temporary files left)", len(entries))
	}
}

func TestLoadCARoundTripSigns(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	is, err := loaded.Issue(CellIdentity("r", "c1").Leaf(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := is.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf from the loaded CA does not verify against the original: %v", err)
	}
}

func TestLoadCARefusals(t *testing.T) {
	setup := func(t *testing.T) (string, *CA) {
		dir := t.TempDir()
		ca := newTestCA(t, WithClock(clockwork.NewFakeClockAt(t0)))
		if err := ca.WriteDir(dir, false); err != nil {
			t.Fatal(err)
		}
		return dir, ca
	}
	t.Run("missing dir", func(t *testing.T) {
		_, err := LoadCA(filepath.Join(t.TempDir(), "nope"))
		if err == nil || !strings.Contains(err.Error(), "isobar certs init") {
			t.Fatalf("err = %v, want a hint to run init", err)
		}
	})
	t.Run("readable key", func(t *testing.T) {
		dir, _ := setup(t)
		if err := os.Chmod(filepath.Join(dir, CAKeyFile), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadCA(dir, WithClock(clockwork.NewFakeClockAt(t0)))
		if !errors.Is(err, ErrInsecureKey) || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("err = %v, want ErrInsecureKey", err)
		}
	})
	t.Run("foreign key", func(t *testing.T) {
		dir, _ := setup(t)
		other := newTestCA(t)
		otherDir := t.TempDir()
		if err := other.WriteDir(otherDir, false); err != nil {
			t.Fatal(err)
		}
		k, _ := os.ReadFile(filepath.Join(otherDir, CAKeyFile))
		if err := os.WriteFile(filepath.Join(dir, CAKeyFile), k, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCA(dir, WithClock(clockwork.NewFakeClockAt(t0))); !errors.Is(err, ErrBadKey) {
			t.Fatalf("err = %v, want ErrBadKey", err)
		}
	})
	t.Run("expired", func(t *testing.T) {
		dir, _ := setup(t)
		_, err := LoadCA(dir, WithClock(clockwork.NewFakeClockAt(t0.Add(DefaultCATTL+time.Second))))
		if !errors.Is(err, ErrExpired) {
			t.Fatalf("err = %v, want ErrExpired", err)
		}
	})
	t.Run("leaf as CA", func(t *testing.T) {
		dir, ca := setup(t)
		is, err := ca.Issue(CellIdentity("r", "c").Leaf(nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, CACertFile), is.CertPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCA(dir, WithClock(clockwork.NewFakeClockAt(t0))); !errors.Is(err, ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
	})
}

func TestIssue(t *testing.T) {
	clk := clockwork.NewFakeClockAt(t0)
	ca := newTestCA(t, WithClock(clk))
	t.Run("region identity", func(t *testing.T) {
		l := Identity{Kind: KindRegion, Name: "us-east"}.Leaf([]string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
		is, err := ca.Issue(l)
		if err != nil {
			t.Fatal(err)
		}
		c := is.Cert
		if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://isobar/region/us-east" {
			t.Errorf("URIs = %v", c.URIs)
		}
		if !slices.Equal(c.DNSNames, []string{"localhost"}) || len(c.IPAddresses) != 1 || !c.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) {
			t.Errorf("SANs = %v %v", c.DNSNames, c.IPAddresses)
		}
		if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
			t.Errorf("EKU = %v", c.ExtKeyUsage)
		}
		if c.IsCA {
			t.Error("leaf is a CA")
		}
		if c.Subject.CommonName != "us-east" {
			t.Errorf("CN = %q", c.Subject.CommonName)
		}
		if !c.NotAfter.Equal(t0.Add(DefaultLeafTTL)) {
			t.Errorf("NotAfter = %v", c.NotAfter)
		}
		id, err := PeerIdentity(c)
		if err != nil || id != (Identity{Kind: KindRegion, Name: "us-east"}) {
			t.Errorf("PeerIdentity = %v, %v", id, err)
		}
		if _, err := is.TLSCertificate(); err != nil {
			t.Errorf("pair does not load: %v", err)
		}
		if is.Cert.SerialNumber.Sign() <= 0 {
			t.Error("serial not positive")
		}
	})
	t.Run("serials differ", func(t *testing.T) {
		a, _ := ca.Issue(CellIdentity("r", "a").Leaf(nil, nil))
		b, _ := ca.Issue(CellIdentity("r", "a").Leaf(nil, nil))
		if a.Cert.SerialNumber.Cmp(b.Cert.SerialNumber) == 0 {
			t.Error("two leaves share a serial")
		}
	})
	t.Run("default ttl is cut to the CA", func(t *testing.T) {
		c2 := clockwork.NewFakeClockAt(t0)
		ca2 := newTestCA(t, WithClock(c2))
		c2.Advance(DefaultCATTL - 10*24*time.Hour)
		is, err := ca2.Issue(CellIdentity("r", "late").Leaf(nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		if !is.Cert.NotAfter.Equal(ca2.Certificate().NotAfter) {
			t.Errorf("NotAfter = %v, want the CA's %v", is.Cert.NotAfter, ca2.Certificate().NotAfter)
		}
	})
	for _, tc := range []struct {
		name string
		leaf Leaf
		want string
	}{
		{"no name", Leaf{Client: true}, "name"},
		{"slash in name", Leaf{Name: "../x", Client: true}, "only letters"},
		{"no usage", Leaf{Name: "x"}, "server use, client use or both"},
		{"server without SAN", Leaf{Name: "x", Server: true}, "DNS or IP SAN"},
		{"relative URI", Leaf{Name: "x", Client: true, URIs: []string{"cell/x"}}, "absolute URI"},
		{"bad isobar URI", Leaf{Name: "x", Client: true, URIs: []string{"spiffe://isobar/planet/x"}}, "identity kind"},
		{"bad DNS", Leaf{Name: "x", Client: true, DNS: []string{"a..b"}}, "bad label"},
		{"bad IP", Leaf{Name: "x", Client: true, IPs: []net.IP{{1, 2, 3}}}, "not an IPv4"},
		{"ttl beyond CA", Leaf{Name: "x", Client: true, TTL: 2 * DefaultCATTL}, "outlives the CA"},
		{"tiny ttl", Leaf{Name: "x", Client: true, TTL: time.Second}, "at least 1m"},
		{"long name", Leaf{Name: strings.Repeat("n", 65), Client: true}, "longer than 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ca.Issue(tc.leaf)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
	t.Run("expired CA refuses", func(t *testing.T) {
		c3 := clockwork.NewFakeClockAt(t0)
		late := newTestCA(t, WithClock(c3))
		c3.Advance(DefaultCATTL + time.Second)
		if _, err := late.Issue(CellIdentity("r", "x").Leaf(nil, nil)); !errors.Is(err, ErrExpired) {
			t.Fatalf("err = %v, want ErrExpired", err)
		}
	})
}

func TestWriteLeaf(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	is, err := ca.Issue(CellIdentity("r", "c1").Leaf(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	cp, kp, err := WriteLeaf(dir, "c1", is, false)
	if err != nil {
		t.Fatal(err)
	}
	if cp != filepath.Join(dir, "c1.pem") || kp != filepath.Join(dir, "c1-key.pem") {
		t.Errorf("paths = %s %s", cp, kp)
	}
	if fi, _ := os.Stat(kp); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode = %v", fi.Mode().Perm())
	}
	if fi, _ := os.Stat(cp); fi.Mode().Perm() != 0o644 {
		t.Errorf("cert mode = %v", fi.Mode().Perm())
	}
	if _, _, err := WriteLeaf(dir, "c1", is, false); !errors.Is(err, ErrExists) {
		t.Errorf("rewrite: err = %v, want ErrExists", err)
	}
	if _, _, err := WriteLeaf(dir, "ca", is, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("name ca: err = %v, want ErrInvalid", err)
	}
	if _, _, err := WriteLeaf(dir, "../escape", is, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("name ../escape: err = %v, want ErrInvalid", err)
	}
}

func TestIssueTo(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	cp, kp, err := ca.IssueTo(dir, Identity{Kind: KindGateway, Name: "eu"}.Leaf(nil, nil), false)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := ParseCertificates(mustRead(t, cp))
	if err != nil || cs[0].URIs[0].String() != GatewayURI("eu") {
		t.Fatalf("%s: %v %v", cp, cs, err)
	}
	if kp != filepath.Join(dir, "eu-key.pem") {
		t.Errorf("key path %s", kp)
	}
	if _, _, err := ca.IssueTo(dir, Identity{Kind: KindGateway, Name: "eu"}.Leaf(nil, nil), false); !errors.Is(err, ErrExists) {
		t.Errorf("second IssueTo: %v", err)
	}
	if _, _, err := ca.IssueTo(dir, Leaf{Name: "x"}, true); !errors.Is(err, ErrInvalid) {
		t.Errorf("invalid leaf: %v", err)
	}
}

func TestParseCertificates(t *testing.T) {
	ca := newTestCA(t)
	is, err := ca.Issue(CellIdentity("r", "c").Leaf(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	bundle := append(append(append([]byte{}, is.KeyPEM...), is.CertPEM...), ca.CertPEM()...)
	cs, err := ParseCertificates(bundle)
	if err != nil || len(cs) != 2 || !cs[1].IsCA {
		t.Fatalf("bundle: %d certs, %v", len(cs), err)
	}
	if cs, err := ParseCertificates(ca.Certificate().Raw); err != nil || len(cs) != 1 {
		t.Fatalf("DER: %v", err)
	}
	for name, data := range map[string][]byte{
		"empty":    nil,
		"key only": is.KeyPEM,
		"garbage":  []byte("hello"),
		"bad PEM":  []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
	} {
		if _, err := ParseCertificates(data); !errors.Is(err, ErrNoCertificate) {
			t.Errorf("%s: err = %v, want ErrNoCertificate", name, err)
		}
	}
}

func TestDescribe(t *testing.T) {
	now := t0.Add(time.Hour)
	ca := newTestCA(t, WithClock(clockwork.NewFakeClockAt(t0)))
	is, err := ca.Issue(Identity{Kind: KindGlobal, Name: "g-0"}.Leaf([]string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := Describe(&b, is.Cert, now, "  "); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"subject:     CN=g-0,O=isobar",
		"issuer:      CN=isobar development CA,O=isobar",
		"not after:   2026-05-30T12:00:00Z (valid, expires in 89d)",
		"uses:        server, client",
		"URI SANs:    spiffe://isobar/global/g-0",
		"DNS SANs:    localhost",
		"IP SANs:     127.0.0.1",
		"identity:    global g-0",
		"key:         ECDSA P-256",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("Describe lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	_ = Describe(&b, is.Cert, t0.Add(DefaultLeafTTL+3*24*time.Hour), "")
	if !strings.Contains(b.String(), "EXPIRED 3d ago") {
		t.Errorf("expired: %s", b.String())
	}
	b.Reset()
	_ = Describe(&b, ca.Certificate(), now, "")
	if !strings.Contains(b.String(), "CA:          true") || !strings.Contains(b.String(), "sign certificates") {
		t.Errorf("CA: %s", b.String())
	}
}
