package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

var localhost = []net.IP{net.ParseIP("127.0.0.1")}

// pki is a CA directory with issued leaves, as isobar certs would leave it.
type pki struct {
	dir string
	ca  *CA
}

func newPKI(t *testing.T, opts ...Option) pki {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t, opts...)
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	return pki{dir: dir, ca: ca}
}

// issue writes a leaf and returns its cert and key paths.
func (p pki) issue(t *testing.T, name string, l Leaf) (string, string) {
	t.Helper()
	is, err := p.ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := WriteLeaf(p.dir, name, is, true)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func (p pki) caFile() string { return filepath.Join(p.dir, CACertFile) }

func (p pki) server(t *testing.T, name string, opts ...Option) *tls.Config {
	t.Helper()
	c, k := p.issue(t, name, Identity{Kind: KindRegion, Name: name}.Leaf(nil, localhost))
	cfg, err := ServerConfig(c, k, p.caFile(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (p pki) client(t *testing.T, id Identity, opts ...Option) *tls.Config {
	t.Helper()
	c, k := p.issue(t, id.Name, id.Leaf(nil, nil))
	cfg, err := ClientConfig(c, k, p.caFile(), "127.0.0.1", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// exchange is one TLS connection on 127.0.0.1: the server completes the
// handshake and writes "ok", the client reads it. Each side's error and
// the peer certificate each saw are returned. TLS 1.3 clients learn of a
// refused client certificate only when they read, hence the exchange.
type exchange struct {
	serverErr, clientErr   error
	serverPeer, clientPeer *x509.Certificate
}

func handshake(t *testing.T, srv, cli *tls.Config) exchange {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var (
		ex exchange
		wg sync.WaitGroup
	)
	deadline := time.Now().Add(10 * time.Second) // upper bound only
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			ex.serverErr = err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		tc := c.(*tls.Conn)
		if ex.serverErr = tc.Handshake(); ex.serverErr != nil {
			return
		}
		if st := tc.ConnectionState(); len(st.VerifiedChains) > 0 {
			ex.serverPeer = st.VerifiedChains[0][0]
		}
		_, ex.serverErr = c.Write([]byte("ok"))
	}()
	func() {
		d := &net.Dialer{Deadline: deadline}
		c, err := tls.DialWithDialer(d, "tcp", ln.Addr().String(), cli)
		if err != nil {
			ex.clientErr = err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		if st := c.ConnectionState(); len(st.PeerCertificates) > 0 {
			ex.clientPeer = st.PeerCertificates[0]
		}
		buf := make([]byte, 2)
		if _, err := io.ReadFull(c, buf); err != nil {
			ex.clientErr = err
		}
	}()
	wg.Wait()
	return ex
}

func TestMutualTLSHandshake(t *testing.T) {
	p := newPKI(t)
	ex := handshake(t, p.server(t, "us-east"), p.client(t, CellIdentity("r", "gpu0")))
	if ex.serverErr != nil || ex.clientErr != nil {
		t.Fatalf("server: %v; client: %v", ex.serverErr, ex.clientErr)
	}
	if id, err := PeerIdentity(ex.serverPeer); err != nil || id != (CellIdentity("r", "gpu0")) {
		t.Errorf("server saw %v, %v", id, err)
	}
	if id, err := PeerIdentity(ex.clientPeer); err != nil || id != (Identity{Kind: KindRegion, Name: "us-east"}) {
		t.Errorf("client saw %v, %v", id, err)
	}
}

func TestHandshakeRefusals(t *testing.T) {
	clk := clockwork.NewFakeClockAt(t0)
	p := newPKI(t, WithClock(clk))
	foreign := newPKI(t, WithClock(clk))
	srv := p.server(t, "r", WithClock(clk))

	t.Run("client from a foreign CA", func(t *testing.T) {
		// The client trusts our CA but presents a foreign certificate.
		c, k := foreign.issue(t, "f", CellIdentity("r", "f").Leaf(nil, nil))
		cfg, err := ClientConfig(c, k, foreign.caFile(), "127.0.0.1", WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		cfg.RootCAs = p.ca.Pool()
		ex := handshake(t, srv, cfg)
		if ex.serverErr == nil || ex.clientErr == nil {
			t.Fatalf("accepted: server %v, client %v", ex.serverErr, ex.clientErr)
		}
		if !strings.Contains(ex.serverErr.Error(), "certificate") {
			t.Errorf("server error = %v", ex.serverErr)
		}
	})
	t.Run("server from a foreign CA", func(t *testing.T) {
		c, k := foreign.issue(t, "fs", Identity{Kind: KindRegion, Name: "fs"}.Leaf(nil, localhost))
		fsrv, err := ServerConfig(c, k, foreign.caFile(), WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		fsrv.ClientCAs = p.ca.Pool()
		ex := handshake(t, fsrv, p.client(t, CellIdentity("r", "c"), WithClock(clk)))
		var ua x509.UnknownAuthorityError
		if !errors.As(ex.clientErr, &ua) {
			t.Fatalf("client error = %v, want unknown authority", ex.clientErr)
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		cfg := &tls.Config{RootCAs: p.ca.Pool(), ServerName: "127.0.0.1", Time: clk.Now}
		ex := handshake(t, srv, cfg)
		if ex.serverErr == nil || ex.clientErr == nil {
			t.Fatalf("accepted: server %v, client %v", ex.serverErr, ex.clientErr)
		}
	})
	t.Run("expired client certificate", func(t *testing.T) {
		c2 := clockwork.NewFakeClockAt(t0)
		q := newPKI(t, WithClock(c2))
		cli := q.client(t, CellIdentity("r", "old"), WithClock(c2))
		c2.Advance(DefaultLeafTTL + time.Hour)
		ex := handshake(t, q.server(t, "r", WithClock(c2)), cli)
		if ex.serverErr == nil || !strings.Contains(ex.serverErr.Error(), "expired") {
			t.Fatalf("server error = %v, want an expired certificate", ex.serverErr)
		}
		if ex.clientErr == nil {
			t.Fatal("client was not told its certificate was refused")
		}
	})
	t.Run("wrong server name", func(t *testing.T) {
		cli := p.client(t, CellIdentity("r", "c2"), WithClock(clk))
		cli.ServerName = "10.9.9.9"
		ex := handshake(t, srv, cli)
		var he x509.HostnameError
		if !errors.As(ex.clientErr, &he) {
			t.Fatalf("client error = %v, want a hostname error", ex.clientErr)
		}
	})
}

func TestConfigLoadErrorsNameTheFlag(t *testing.T) {
	clk := clockwork.NewFakeClockAt(t0)
	p := newPKI(t, WithClock(clk))
	cellCert, cellKey := p.issue(t, "cell", CellIdentity("r", "cell").Leaf(nil, nil))
	srvCert, srvKey := p.issue(t, "srv", Identity{Kind: KindRegion, Name: "srv"}.Leaf(nil, localhost))
	foreign := newPKI(t, WithClock(clk))
	missing := filepath.Join(p.dir, "missing.pem")
	garbage := filepath.Join(p.dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		server           bool
		cert, key, ca    string
		clock            clockwork.Clock
		wantIs           error
		wantIn1, wantIn2 string
	}{
		{"no ca flag", true, srvCert, srvKey, "", clk, ErrInvalid, "--tls-ca", "required"},
		{"no cert flag", true, "", srvKey, p.caFile(), clk, ErrInvalid, "--tls-cert", "required"},
		{"no key flag", false, cellCert, "", p.caFile(), clk, ErrInvalid, "--tls-key", "required"},
		{"missing ca", true, srvCert, srvKey, missing, clk, os.ErrNotExist, "--tls-ca", missing},
		{"missing cert", true, missing, srvKey, p.caFile(), clk, os.ErrNotExist, "--tls-cert", missing},
		{"missing key", false, cellCert, missing, p.caFile(), clk, os.ErrNotExist, "--tls-key", missing},
		{"garbage ca", true, srvCert, srvKey, garbage, clk, ErrNoCertificate, "--tls-ca", garbage},
		{"garbage cert", true, garbage, srvKey, p.caFile(), clk, ErrNoCertificate, "--tls-cert", garbage},
		{"cert as key", true, srvCert, srvCert, p.caFile(), clk, ErrBadKey, "--tls-key", srvCert},
		{"mismatched key", true, srvCert, cellKey, p.caFile(), clk, ErrBadKey, "--tls-cert", cellKey},
		{"leaf as ca", true, srvCert, srvKey, srvCert, clk, ErrInvalid, "--tls-ca", "not a CA"},
		{"client cert for a server", true, cellCert, cellKey, p.caFile(), clk, ErrUntrusted, "--tls-cert", "server use"},
		{"foreign ca", false, cellCert, cellKey, foreign.caFile(), clk, ErrUntrusted, "--tls-cert", "authority"},
		{"expired", false, cellCert, cellKey, p.caFile(), clockwork.NewFakeClockAt(t0.Add(DefaultLeafTTL + time.Minute)), ErrExpired, "--tls-cert", "isobar certs issue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.server {
				_, err = ServerConfig(tc.cert, tc.key, tc.ca, WithClock(tc.clock))
			} else {
				_, err = ClientConfig(tc.cert, tc.key, tc.ca, "", WithClock(tc.clock))
			}
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("err = %v, want %v", err, tc.wantIs)
			}
			if !strings.Contains(err.Error(), tc.wantIn1) || !strings.Contains(err.Error(), tc.wantIn2) {
				t.Fatalf("err = %q, want it to name %q and %q", err, tc.wantIn1, tc.wantIn2)
			}
		})
	}
}

func TestServerConfigSettings(t *testing.T) {
	p := newPKI(t)
	srv := p.server(t, "r")
	if srv.MinVersion != tls.VersionTLS13 || srv.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("server: min version %x, client auth %v", srv.MinVersion, srv.ClientAuth)
	}
	cli := p.client(t, CellIdentity("r", "c"))
	if cli.MinVersion != tls.VersionTLS13 || cli.InsecureSkipVerify {
		t.Errorf("client: min version %x, insecure %v", cli.MinVersion, cli.InsecureSkipVerify)
	}
}

func TestKeyPairReload(t *testing.T) {
	p := newPKI(t)
	id := Identity{Kind: KindRegion, Name: "r"}
	c, k := p.issue(t, "r", id.Leaf(nil, localhost))
	srv, err := ServerConfig(c, k, p.caFile())
	if err != nil {
		t.Fatal(err)
	}
	cli := p.client(t, CellIdentity("r", "c"))
	first := handshake(t, srv, cli)
	if first.clientErr != nil {
		t.Fatal(first.clientErr)
	}

	// Rotate: a new pair replaces the files; the next handshake uses it.
	p.issue(t, "r", id.Leaf(nil, localhost))
	second := handshake(t, srv, cli)
	if second.clientErr != nil {
		t.Fatal(second.clientErr)
	}
	if second.clientPeer.SerialNumber.Cmp(first.clientPeer.SerialNumber) == 0 {
		t.Fatal("server still presents the old certificate after rotation")
	}

	// A broken replacement is ignored: the last good pair stays.
	if err := os.WriteFile(c, []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	third := handshake(t, srv, cli)
	if third.clientErr != nil {
		t.Fatalf("handshake after a torn write: %v", third.clientErr)
	}
	if third.clientPeer.SerialNumber.Cmp(second.clientPeer.SerialNumber) != 0 {
		t.Fatal("server changed certificate to something after a torn write")
	}

	// The client side reloads too.
	cc, ck := p.issue(t, "c2", CellIdentity("r", "c2").Leaf(nil, nil))
	cli2, err := ClientConfig(cc, ck, p.caFile(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	p.issue(t, "c2", CellIdentity("r", "c2").Leaf(nil, nil))
	want, _ := ParseCertificates(mustRead(t, cc))
	ex := handshake(t, srv, cli2)
	if ex.serverErr != nil || ex.serverPeer.SerialNumber.Cmp(want[0].SerialNumber) != 0 {
		t.Fatalf("server saw %v (err %v), want the rotated client certificate", ex.serverPeer.SerialNumber, ex.serverErr)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGRPCMutualTLS runs the configs under gRPC, as every isobar
// component does: ALPN, the authority as server name, and the verified
// peer identity on the server.
func TestGRPCMutualTLS(t *testing.T) {
	p := newPKI(t)
	srvCfg := p.server(t, "eu")
	seen := make(chan Identity, 1)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvCfg)),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if pr, ok := peer.FromContext(ctx); ok {
				if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
					if id, err := PeerIdentity(ti.State.VerifiedChains[0][0]); err == nil {
						select {
						case seen <- id:
						default:
						}
					}
				}
			}
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ln) }()
	defer func() {
		gs.Stop()
		<-served
	}()

	c, k := p.issue(t, "gw", Identity{Kind: KindGateway, Name: "eu"}.Leaf(nil, nil))
	cliCfg, err := ClientConfig(c, k, p.caFile(), "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cliCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check over mTLS: %v", err)
	}
	if id := <-seen; id != (Identity{Kind: KindGateway, Name: "eu"}) {
		t.Fatalf("server saw %v", id)
	}

	// A client certificate from another CA is refused by the server.
	foreign := newPKI(t)
	fc, fk := foreign.issue(t, "x", Identity{Kind: KindGateway, Name: "x"}.Leaf(nil, nil))
	badCfg, err := ClientConfig(fc, fk, foreign.caFile(), "")
	if err != nil {
		t.Fatal(err)
	}
	badCfg.RootCAs = p.ca.Pool()
	bad, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(badCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if _, err := healthpb.NewHealthClient(bad).Check(ctx2, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("a client certificate from a foreign CA was accepted")
	}
}

// WithPeer fails the handshake of a peer whose identity the check refuses,
// on either side.
func TestWithPeer(t *testing.T) {
	p := newPKI(t)
	wantKind := func(k Kind) func(Identity) error {
		return func(id Identity) error {
			if id.Kind != k {
				return errors.New("wrong kind")
			}
			return nil
		}
	}
	if ex := handshake(t, p.server(t, "us-east"), p.client(t, CellIdentity("us-east", "c0"), WithPeer(wantKind(KindRegion)))); ex.clientErr != nil || ex.serverErr != nil {
		t.Fatalf("accepted kind: client %v, server %v", ex.clientErr, ex.serverErr)
	}
	ex := handshake(t, p.server(t, "us-east"), p.client(t, CellIdentity("us-east", "c1"), WithPeer(wantKind(KindGlobal))))
	if ex.clientErr == nil || !strings.Contains(ex.clientErr.Error(), "wrong kind") {
		t.Fatalf("client refusing a region server: client %v", ex.clientErr)
	}
	ex = handshake(t, p.server(t, "us-west", WithPeer(wantKind(KindGateway))), p.client(t, CellIdentity("us-west", "c2")))
	if ex.serverErr == nil || !strings.Contains(ex.serverErr.Error(), "wrong kind") || ex.clientErr == nil {
		t.Fatalf("server refusing a cell client: server %v, client %v", ex.serverErr, ex.clientErr)
	}
}
