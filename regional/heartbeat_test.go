package regional

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// startController runs a controller on loopback with fast timers.
func startController(t *testing.T, mut func(*Config)) (*Controller, *prometheus.Registry) {
	t.Helper()
	cfg := DefaultConfig("r1")
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.TTLGrace = 100 * time.Millisecond
	cfg.CycleInterval = 20 * time.Millisecond
	cfg.ProbeInterval = 50 * time.Millisecond
	if mut != nil {
		mut(&cfg)
	}
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	prom := prometheus.NewRegistry()
	c, err := New(cfg, Deps{Registerer: prom, GRPCListener: glis, HTTPListener: hlis})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c, prom
}

func dialController(t *testing.T, addr string, creds credentials.TransportCredentials) isobarpb.CellRegistryClient {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return isobarpb.NewCellRegistryClient(conn)
}

func openStream(t *testing.T, cl isobarpb.CellRegistryClient) isobarpb.CellRegistry_HeartbeatClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	s, err := cl.Heartbeat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func recvAck(t *testing.T, s isobarpb.CellRegistry_HeartbeatClient) (*isobarpb.HeartbeatAck, error) {
	t.Helper()
	return s.Recv()
}

func TestHeartbeatBadInput(t *testing.T) {
	c, _ := startController(t, nil)
	cl := dialController(t, c.Addr(), nil)
	rejected := func(reason string) float64 {
		return testutil.ToFloat64(c.metrics.rejected.WithLabelValues(reason))
	}

	t.Run("soft refusals keep the stream open", func(t *testing.T) {
		s := openStream(t, cl)
		hb := heartbeat("soft", "127.0.0.1:2001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
		if err := s.Send(hb); err != nil {
			t.Fatal(err)
		}
		if ack, err := recvAck(t, s); err != nil || ack.Error != "" || ack.Interval.AsDuration() != 100*time.Millisecond {
			t.Fatalf("first ack = %v, %v", ack, err)
		}
		// The ack precedes the registry's apply: await it.
		waitCell(t, c, "soft", func(cv CellView) bool { return cv.Sequence == 1 })
		cases := []struct {
			name, reason, want string
			mut                func(*isobarpb.CellHeartbeat)
		}{
			{"NaN signal", "invalid", "finite", func(h *isobarpb.CellHeartbeat) { h.Signals.QueueDepth = f64(math.NaN()) }},
			{"Inf signal", "invalid", "finite", func(h *isobarpb.CellHeartbeat) { h.Signals.TtftP95Seconds = f64(math.Inf(1)) }},
			{"negative signal", "invalid", "negative", func(h *isobarpb.CellHeartbeat) { h.Signals.Running = f64(-1) }},
			{"fraction above 1", "invalid", "fraction", func(h *isobarpb.CellHeartbeat) { h.Signals.GpuUtil = f64(87) }},
			{"bad endpoint", "invalid", "endpoint", func(h *isobarpb.CellHeartbeat) { h.Endpoint = "nowhere" }},
			{"unknown state", "invalid", "lifecycle", func(h *isobarpb.CellHeartbeat) { h.State = 42 }},
			{"replayed sequence", "stale_sequence", "sequence 1 after 1", func(h *isobarpb.CellHeartbeat) { h.Sequence = 1 }},
		}
		for _, tc := range cases {
			before := rejected(tc.reason)
			hb := heartbeat("soft", "127.0.0.1:2001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 2)
			tc.mut(hb)
			if err := s.Send(hb); err != nil {
				t.Fatal(err)
			}
			ack, err := recvAck(t, s)
			if err != nil {
				t.Fatalf("%s: stream closed: %v", tc.name, err)
			}
			if !strings.Contains(ack.Error, tc.want) {
				t.Errorf("%s: ack error %q, want it to mention %q", tc.name, ack.Error, tc.want)
			}
			if got := rejected(tc.reason); got != before+1 {
				t.Errorf("%s: rejected{%s} = %v, want %v", tc.name, tc.reason, got, before+1)
			}
		}
		// The registry never saw a bad value.
		cv, ok := c.Registry().View().Cell("soft")
		if !ok || cv.Sequence != 1 || cv.Endpoint != "127.0.0.1:2001" {
			t.Fatalf("registry holds %+v", cv)
		}
	})

	t.Run("wrong region ends the stream", func(t *testing.T) {
		s := openStream(t, cl)
		hb := heartbeat("lost", "127.0.0.1:2002", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
		hb.Region = "elsewhere"
		_ = s.Send(hb)
		_, err := recvAck(t, s)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "elsewhere") {
			t.Fatalf("err = %v", err)
		}
		if rejected("wrong_region") != 1 {
			t.Errorf("wrong_region counter = %v", rejected("wrong_region"))
		}
	})

	t.Run("duplicate cell id on a second stream", func(t *testing.T) {
		first := openStream(t, cl)
		_ = first.Send(heartbeat("dup", "127.0.0.1:2003", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
		if _, err := recvAck(t, first); err != nil {
			t.Fatal(err)
		}
		// The ack is sent when the heartbeat is handed to the registry,
		// not when the registry has applied it: await the apply.
		waitCell(t, c, "dup", nil)
		second := openStream(t, cl)
		_ = second.Send(heartbeat("dup", "127.0.0.1:2004", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
		_, err := recvAck(t, second)
		if status.Code(err) != codes.AlreadyExists {
			t.Fatalf("second stream: %v, want AlreadyExists", err)
		}
		if rejected("duplicate_cell") != 1 {
			t.Errorf("duplicate_cell counter = %v", rejected("duplicate_cell"))
		}
		cv, _ := c.Registry().View().Cell("dup")
		if cv.Endpoint != "127.0.0.1:2003" {
			t.Errorf("the duplicate overwrote the cell: %s", cv.Endpoint)
		}
	})

	t.Run("oversized message", func(t *testing.T) {
		s := openStream(t, cl)
		hb := heartbeat("big", "127.0.0.1:2005", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
		hb.Capability.Model = strings.Repeat("x", 100<<10)
		_ = s.Send(hb)
		_, err := recvAck(t, s)
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("err = %v, want ResourceExhausted", err)
		}
		if rejected("oversized") != 1 {
			t.Errorf("oversized counter = %v", rejected("oversized"))
		}
		if _, ok := c.Registry().View().Cell("big"); ok {
			t.Error("oversized heartbeat reached the registry")
		}
	})

	t.Run("unknown cell on the drain API", func(t *testing.T) {
		resp, err := http.Post("http://"+c.HTTPAddr()+"/v1/cells/ghost/drain", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("status = %d", resp.StatusCode)
		}
	})
}

// testPKI is a throwaway CA with helpers to mint leaf certificates.
type testPKI struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "isobar test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	p := &testPKI{dir: t.TempDir(), caCert: cert, caKey: key}
	p.caFile = filepath.Join(p.dir, "ca.pem")
	writePEM(t, p.caFile, "CERTIFICATE", der)
	return p
}

// leaf writes a certificate/key pair and returns their paths.
func (p *testPKI) leaf(t *testing.T, name string, uri string, server bool) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	if server || strings.Contains(uri, "/cell/") {
		// Servers are dialled on 127.0.0.1; cells advertise endpoints
		// there (the endpoint binding checks the IP SAN).
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	if uri != "" {
		u, _ := url.Parse(uri)
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (p *testPKI) clientCreds(t *testing.T, certFile, keyFile string) credentials.TransportCredentials {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13})
}

func TestHeartbeatMTLSIdentity(t *testing.T) {
	pki := newTestPKI(t)
	srvCert, srvKey := pki.leaf(t, "regional", "", true)
	c, _ := startController(t, func(cfg *Config) {
		cfg.TLS = TLSFiles{Cert: srvCert, Key: srvKey, CA: pki.caFile}
	})
	aCert, aKey := pki.leaf(t, "cell-a", CellURI("r1", "cell-a"), false)
	cl := dialController(t, c.Addr(), pki.clientCreds(t, aCert, aKey))

	// Right identity: accepted.
	s := openStream(t, cl)
	_ = s.Send(heartbeat("cell-a", "127.0.0.1:3001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
	if ack, err := recvAck(t, s); err != nil || ack.Error != "" {
		t.Fatalf("cell-a with its own certificate: %v %v", ack, err)
	}

	// cell-a's certificate claiming cell-b: refused and counted.
	s2 := openStream(t, cl)
	_ = s2.Send(heartbeat("cell-b", "127.0.0.1:3002", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
	_, err := recvAck(t, s2)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "cell-a") {
		t.Fatalf("impersonation: %v, want PermissionDenied naming the real identity", err)
	}
	if got := testutil.ToFloat64(c.metrics.rejected.WithLabelValues("identity_mismatch")); got != 1 {
		t.Errorf("identity_mismatch counter = %v", got)
	}
	if _, ok := c.Registry().View().Cell("cell-b"); ok {
		t.Error("impersonated cell reached the registry")
	}

	// No client certificate at all: the TLS handshake fails.
	pool := x509.NewCertPool()
	pool.AddCert(pki.caCert)
	anon := dialController(t, c.Addr(), credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s3, err := anon.Heartbeat(ctx); err == nil {
		_ = s3.Send(heartbeat("cell-a", "127.0.0.1:3001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
		if _, err = s3.Recv(); err == nil {
			t.Fatal("a client without a certificate was served")
		}
	}
}
