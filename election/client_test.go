package election

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestClientConfigValidate(t *testing.T) {
	tlsFiles := TLSFiles{CertFile: "c.pem", KeyFile: "k.pem", CAFile: "ca.pem"}
	for _, tc := range []struct {
		name string
		cfg  ClientConfig
		want string // "" = valid
	}{
		{"host:port", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}}, ""},
		{"http url", ClientConfig{Endpoints: []string{"http://127.0.0.1:2379"}}, ""},
		{"https with tls", ClientConfig{Endpoints: []string{"https://127.0.0.1:2379"}, TLS: tlsFiles}, ""},
		{"bare with tls", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}, TLS: tlsFiles}, ""},
		{"ca only", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}, TLS: TLSFiles{CAFile: "ca.pem"}}, ""},
		{"no endpoints", ClientConfig{}, "Endpoints is empty"},
		{"no port", ClientConfig{Endpoints: []string{"127.0.0.1"}}, "want host:port"},
		{"port 0", ClientConfig{Endpoints: []string{"127.0.0.1:0"}}, "1-65535"},
		{"port text", ClientConfig{Endpoints: []string{"127.0.0.1:etcd"}}, "1-65535"},
		{"empty host", ClientConfig{Endpoints: []string{":2379"}}, "empty host"},
		{"bad scheme", ClientConfig{Endpoints: []string{"unix://x:1"}}, "scheme"},
		{"path", ClientConfig{Endpoints: []string{"http://127.0.0.1:2379/v3"}}, "nothing after"},
		{"http with tls", ClientConfig{Endpoints: []string{"http://127.0.0.1:2379"}, TLS: tlsFiles}, "plain http"},
		{"https without tls", ClientConfig{Endpoints: []string{"https://127.0.0.1:2379"}}, "no TLS files"},
		{"cert without key", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}, TLS: TLSFiles{CertFile: "c.pem", CAFile: "ca.pem"}}, "together"},
		{"one bad of two", ClientConfig{Endpoints: []string{"127.0.0.1:2379", "nope"}}, `"nope"`},
		{"negative timeout", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: -1}, "negative"},
		{"user and password over tls", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}, TLS: tlsFiles, Username: "u", Password: "p"}, ""},
		{"user without password", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}, TLS: tlsFiles, Username: "u"}, "together"},
		{"password without tls", ClientConfig{Endpoints: []string{"127.0.0.1:2379"}, Username: "u", Password: "p"}, "needs TLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.withDefaults().validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestNewClientErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewClient(ClientConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("empty config: %v", err)
	}
	_, err := NewClient(ClientConfig{Endpoints: []string{"127.0.0.1:1"}, TLS: TLSFiles{CAFile: filepath.Join(dir, "missing.pem")}})
	if err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Fatalf("missing CA file: %v, want an error naming it", err)
	}
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient(ClientConfig{Endpoints: []string{"127.0.0.1:1"}, TLS: TLSFiles{CAFile: junk}}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("junk CA: %v", err)
	}
	if _, err := NewClient(ClientConfig{Endpoints: []string{"127.0.0.1:1"}, TLS: TLSFiles{CertFile: junk, KeyFile: junk}}); err == nil || !strings.Contains(err.Error(), "junk.pem") {
		t.Fatalf("junk key pair: %v", err)
	}

	// Nobody listens: a clear error within DialTimeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = NewClient(ClientConfig{Endpoints: []string{addr}, DialTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("unreachable endpoint: %v, want an error naming %s", err, addr)
	}
}

// TLS end to end: an embedded member requiring client certificates, a
// client with one (works) and one without (refused, clearly).
func TestTLSClient(t *testing.T) {
	dir := t.TempDir()
	files := writeTestPKI(t, dir)
	e := startEtcdWith(t, EmbeddedConfig{Dir: filepath.Join(dir, "data"), TLS: files})
	if ep := e.Endpoints()[0]; !strings.HasPrefix(ep, "https://") {
		t.Fatalf("endpoint %q, want https", ep)
	}
	cli := newClient(t, e) // presents files.CertFile
	ctx := ctxT(t, 10*time.Second)
	c := newCand(t, cli, Config{ID: "tls"}, nil)
	l, err := c.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign over TLS: %v", err)
	}
	if err := FencedPut(ctx, cli, l, "/tls/plan", "ok"); err != nil {
		t.Fatal(err)
	}
	if err := c.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	_, err = NewClient(ClientConfig{Endpoints: e.Endpoints(), TLS: TLSFiles{CAFile: files.CAFile}, DialTimeout: time.Second})
	if err == nil {
		t.Fatal("client without a certificate was accepted by a member requiring one")
	}
	t.Logf("client without certificate: %v", err)
	if _, err := StartEmbedded(context.Background(), EmbeddedConfig{Dir: dir, TLS: TLSFiles{CertFile: files.CertFile, KeyFile: files.KeyFile}}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("embedded TLS without CA: %v", err)
	}
}

// Against a cluster with auth enabled, NewClient authenticates with
// Username/Password and a wrong password is refused at once.
func TestClientAuth(t *testing.T) {
	dir := t.TempDir()
	files := writeTestPKI(t, dir)
	e := startEtcdWith(t, EmbeddedConfig{Dir: filepath.Join(dir, "data"), TLS: files})
	admin := newClient(t, e)
	ctx := ctxT(t, 10*time.Second)
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.UserAdd(ctx, "isobar", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "isobar", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enable auth: %v", err)
		}
	}
	cfg := ClientConfig{Endpoints: e.Endpoints(), TLS: files, Username: "isobar", Password: "s3cret", DialTimeout: 5 * time.Second}
	cli, err := NewClient(cfg)
	if err != nil {
		t.Fatalf("NewClient with the right password: %v", err)
	}
	if _, err := cli.Put(ctx, "/auth/ok", "1"); err != nil {
		t.Errorf("put as isobar: %v", err)
	}
	_ = cli.Close()
	cfg.Password = "wrong"
	if cli, err := NewClient(cfg); err == nil {
		_ = cli.Close()
		t.Fatal("a wrong password was accepted")
	} else {
		t.Logf("wrong password: %v", err)
	}
}

func TestStartEmbeddedErrors(t *testing.T) {
	if _, err := StartEmbedded(context.Background(), EmbeddedConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no Dir: %v", err)
	}
	for _, addr := range []string{"nohostport", "127.0.0.1:99999"} {
		if _, err := StartEmbedded(context.Background(), EmbeddedConfig{Dir: t.TempDir(), ClientAddr: addr}); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("ClientAddr %q: %v", addr, err)
		}
	}
	// An address already taken by someone else is reported, not retried.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	_, err = StartEmbedded(context.Background(), EmbeddedConfig{Dir: t.TempDir(), ClientAddr: ln.Addr().String(), Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("taken address: %v", err)
	}
}

// writeTestPKI writes a CA and one certificate for 127.0.0.1 usable by the
// server and by clients.
func writeTestPKI(t *testing.T, dir string) TLSFiles {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := clockwork.NewRealClock().Now() // certificate validity is wall time
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "etcd"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := TLSFiles{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), CAFile: filepath.Join(dir, "ca.pem")}
	for path, block := range map[string]*pem.Block{
		f.CAFile:   {Type: "CERTIFICATE", Bytes: caDER},
		f.CertFile: {Type: "CERTIFICATE", Bytes: der},
		f.KeyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
