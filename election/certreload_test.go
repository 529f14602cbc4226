package election

import (
	"crypto/tls"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/certs"
)

// TestEtcdClientCertificateReloaded (issue 22 item 12): the etcd client
// certificate is re-read when its files change, like isobar's own: after
// the files are replaced, the next TLS connection presents the new
// certificate; a broken replacement is ignored and the last good pair
// stays. On the old code the pair was loaded once, so every connection
// after a rotation still presented the old (possibly expired) certificate.
func TestEtcdClientCertificateReloaded(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := ca.IssueTo(dir, certs.Leaf{Name: "etcd-server", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	client := certs.Leaf{Name: "etcd-client", Client: true}
	cliCert, cliKey, err := ca.IssueTo(dir, client, false)
	if err != nil {
		t.Fatal(err)
	}

	// A TLS server requiring client certificates that reports the serial
	// of each one presented.
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serials := make(chan *big.Int, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if err := tc.Handshake(); err == nil {
				serials <- tc.ConnectionState().PeerCertificates[0].SerialNumber
			} else {
				serials <- nil
			}
			_ = c.Close()
		}
	}()

	files := TLSFiles{CertFile: cliCert, KeyFile: cliKey, CAFile: filepath.Join(dir, certs.CACertFile)}
	cfg, err := files.clientTLS()
	if err != nil {
		t.Fatal(err)
	}
	presented := func() *big.Int {
		t.Helper()
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg.Clone())
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		// TLS 1.3: the client certificate is checked after the client's
		// handshake returns; read to see the server's verdict.
		_, _ = c.Read(make([]byte, 1))
		_ = c.Close()
		return <-serials
	}
	leafSerial := func() *big.Int {
		t.Helper()
		b, err := os.ReadFile(cliCert)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := certs.ParseCertificates(b)
		if err != nil {
			t.Fatal(err)
		}
		return cs[0].SerialNumber
	}

	first := leafSerial()
	if got := presented(); got == nil || got.Cmp(first) != 0 {
		t.Fatalf("first connection presented serial %v, want %v", got, first)
	}
	if _, _, err := ca.IssueTo(dir, client, true); err != nil { // rotation: new key pair in place
		t.Fatal(err)
	}
	rotated := leafSerial()
	if rotated.Cmp(first) == 0 {
		t.Fatal("reissue kept the serial")
	}
	if got := presented(); got == nil || got.Cmp(rotated) != 0 {
		t.Fatalf("after rotation the new connection presented serial %v, want the new certificate's %v (old %v)", got, rotated, first)
	}
	// A broken replacement is ignored: the last good pair stays.
	if err := os.WriteFile(cliCert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := presented(); got == nil || got.Cmp(rotated) != 0 {
		t.Fatalf("after a broken replacement: serial %v, want the last good %v", got, rotated)
	}
	// Unreadable at start: the error names the file.
	if _, err := (TLSFiles{CertFile: cliCert, KeyFile: cliKey}).clientTLS(); err == nil {
		t.Fatal("a broken certificate file was accepted at load")
	} else if !strings.Contains(err.Error(), cliCert) {
		t.Fatalf("load error %v does not name %s", err, cliCert)
	}
}
