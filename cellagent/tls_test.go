package cellagent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testPKI is a throwaway CA with a controller and a cell certificate.
type testPKI struct {
	caPool                    *x509.CertPool
	server                    tls.Certificate
	caFile, certFile, keyFile string
}

// newTestPKI issues a controller certificate for region and a cell
// certificate for cellID of that region.
func newTestPKI(t *testing.T, region, cellID string) testPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "isobar test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(tmpl *x509.Certificate) (tls.Certificate, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalECPrivateKey(key)
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return pair, certPEM, keyPEM
	}
	srvID, _ := url.Parse("spiffe://isobar/region/" + region)
	server, _, _ := issue(&x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "regional"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, URIs: []*url.URL{srvID},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	})
	id, _ := url.Parse("spiffe://isobar/region/" + region + "/cell/" + cellID)
	_, certPEM, keyPEM := issue(&x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: cellID},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), URIs: []*url.URL{id},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	})
	p := testPKI{
		caPool: x509.NewCertPool(), server: server,
		caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "cell.pem"), keyFile: filepath.Join(dir, "cell-key.pem"),
	}
	p.caPool.AddCert(ca)
	for file, data := range map[string][]byte{
		p.caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		p.certFile: certPEM,
		p.keyFile:  keyPEM,
	} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestAgentMutualTLS: the agent presents its cell certificate to a
// controller that requires one, and heartbeats flow.
func TestAgentMutualTLS(t *testing.T) {
	const cell = "us-east-1a-gpu1"
	pki := newTestPKI(t, "us-east-1", cell)
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pki.server},
		ClientCAs:    pki.caPool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	h := newHarness(t, func(h *harness, c *Config) {
		h.reg.stop()
		h.reg = newFakeRegistry(t, grpc.Creds(creds))
		c.ControllerAddr = h.reg.addr
		c.TLS = TLSFiles{Cert: pki.certFile, Key: pki.keyFile, CA: pki.caFile}
	})
	hb := h.start()
	if hb.GetCellId() != cell || hb.GetState() != stateReady {
		t.Fatalf("heartbeat over mTLS = %v", hb)
	}
	select {
	case uris := <-h.reg.peers:
		if len(uris) != 1 || uris[0] != "spiffe://isobar/region/us-east-1/cell/"+cell {
			t.Fatalf("client identity = %v", uris)
		}
	default:
		t.Fatal("controller saw no client certificate")
	}
}

// The agent's handshake fails unless the controller presents its region's
// controller identity: a server with another region's certificate from the
// same CA cannot pose as the controller.
func TestAgentRefusesAnotherRegionsController(t *testing.T) {
	pki := newTestPKI(t, "eu-west-1", "c0") // the server is eu-west-1's controller
	cfg, err := loadTLS(TLSFiles{Cert: pki.certFile, Key: pki.keyFile, CA: pki.caFile, ServerName: "127.0.0.1"}, "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.caPool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := ln.Accept(); err == nil {
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
	if err == nil {
		_ = c.Close()
		t.Fatal("handshake with another region's controller succeeded")
	}
	if !strings.Contains(err.Error(), "spiffe://isobar/region/us-east-1") {
		t.Errorf("error %v does not name the expected controller identity", err)
	}
	<-done
}
