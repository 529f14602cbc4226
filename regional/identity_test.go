package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// idPKI is a development CA from package certs writing leaves to a
// directory, for tests of who may talk to whom.
type idPKI struct {
	t      *testing.T
	dir    string
	ca     *certs.CA
	caFile string
}

func newIDPKI(t *testing.T, opts ...certs.Option) *idPKI {
	t.Helper()
	ca, err := certs.NewCA(certs.CAConfig{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	p := &idPKI{t: t, dir: t.TempDir(), ca: ca}
	if err := ca.WriteDir(p.dir, false); err != nil {
		t.Fatal(err)
	}
	p.caFile = p.dir + "/" + certs.CACertFile
	return p
}

// issue writes a leaf for id (with a 127.0.0.1 SAN for servers, and for
// cells, which advertise endpoints on 127.0.0.1: the endpoint binding).
func (p *idPKI) issue(name string, id certs.Identity) (certFile, keyFile string) {
	p.t.Helper()
	var ips []net.IP
	if id.Kind == certs.KindRegion || id.Kind == certs.KindGlobal || id.Kind == certs.KindCell {
		ips = []net.IP{net.ParseIP("127.0.0.1")}
	}
	return p.issueLeaf(name, id.Leaf(nil, ips))
}

// issueLeaf writes l under name (its common name and file name).
func (p *idPKI) issueLeaf(name string, l certs.Leaf) (certFile, keyFile string) {
	p.t.Helper()
	l.Name = name
	c, k, err := p.ca.IssueTo(p.dir, l, false)
	if err != nil {
		p.t.Fatal(err)
	}
	return c, k
}

// rawCreds presents certFile/keyFile as they are (expired or foreign
// pairs included: certs.ClientConfig would refuse to load them) and
// trusts p's CA.
func (p *idPKI) rawCreds(certFile, keyFile string) credentials.TransportCredentials {
	p.t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		p.t.Fatal(err)
	}
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: p.ca.Pool(), MinVersion: tls.VersionTLS13})
}

// A cellagent may heartbeat only as the cell and region its certificate
// names, and only a cell identity (the URI SAN, never a common name or DNS
// SAN) counts. Each refusal is PermissionDenied, ends the stream, is
// counted by reason and never reaches the registry.
func TestHeartbeatIdentityRefusals(t *testing.T) {
	pki := newTestPKI(t)
	srvCert, srvKey := pki.leaf(t, "regional", certs.RegionURI("r1"), true)
	c, _ := startController(t, func(cfg *Config) {
		cfg.TLS = TLSFiles{Cert: srvCert, Key: srvKey, CA: pki.caFile}
	})
	rejected := func(reason string) float64 { return testutil.ToFloat64(c.metrics.rejected.WithLabelValues(reason)) }

	own := func(name, uri string) isobarpb.CellRegistryClient {
		cert, key := pki.leaf(t, name, uri, false)
		return dialController(t, c.Addr(), pki.clientCreds(t, cert, key))
	}
	cellA := own("cell-a", CellURI("r1", "cell-a"))

	// The right certificate is accepted: the refusals below are about
	// identity, not a broken setup.
	s := openStream(t, cellA)
	_ = s.Send(heartbeat("cell-a", "127.0.0.1:3001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
	if ack, err := recvAck(t, s); err != nil || ack.Error != "" {
		t.Fatalf("cell-a with its own certificate: %v %v", ack, err)
	}

	wrongRegion := heartbeat("cell-a", "127.0.0.1:3001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1)
	wrongRegion.Region = "r2"
	for _, tc := range []struct {
		name   string
		client isobarpb.CellRegistryClient
		hb     *isobarpb.CellHeartbeat
		reason string
		want   string // in the error
	}{
		{"another cell's id", cellA, heartbeat("cell-b", "127.0.0.1:3002", 2, 1), "identity_mismatch", "cell-a"},
		{"another region in the heartbeat", cellA, wrongRegion, "identity_region", "r2"},
		{"a certificate of another region", own("r2-cell-c", CellURI("r2", "cell-c")),
			heartbeat("cell-c", "127.0.0.1:3003", 2, 1), "identity_region", "region r2"},
		{"the older cell form without a region", own("old-cell-d", "spiffe://isobar/cell/cell-d"),
			heartbeat("cell-d", "127.0.0.1:3004", 2, 1), "no_identity", "older cell identity"},
		{"common name only", own("cell-e", ""), heartbeat("cell-e", "127.0.0.1:3005", 2, 1), "no_identity", "no spiffe://isobar/"},
		{"a gateway", own("gw", certs.GatewayURI("r1")), heartbeat("cell-f", "127.0.0.1:3006", 2, 1), "no_identity", "not a cell"},
		{"a regional controller", own("r1", certs.RegionURI("r1")), heartbeat("cell-g", "127.0.0.1:3007", 2, 1), "no_identity", "not a cell"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := rejected(tc.reason)
			s := openStream(t, tc.client)
			_ = s.Send(tc.hb)
			_, err := recvAck(t, s)
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want PermissionDenied mentioning %q", err, tc.want)
			}
			if got := rejected(tc.reason); got != before+1 {
				t.Errorf("rejected{%s} = %v, want %v", tc.reason, got, before+1)
			}
		})
	}
	for _, id := range []string{"cell-b", "cell-c", "cell-d", "cell-e", "cell-f", "cell-g"} {
		if _, ok := c.Registry().View().Cell(id); ok {
			t.Errorf("refused cell %s reached the registry", id)
		}
	}
	waitCell(t, c, "cell-a", nil) // it comes at the next cycle tick
}

// Expired certificates and certificates of another CA are refused at the
// TLS handshake: no stream is served.
func TestHeartbeatHandshakeRefusals(t *testing.T) {
	start := time.Now()
	clk := clockwork.NewFakeClockAt(start.Add(-72 * time.Hour))
	pki := newIDPKI(t, certs.WithClock(clk))
	l := certs.CellIdentity("r1", "old").Leaf(nil, nil)
	l.TTL = time.Hour
	expCert, expKey := pki.issueLeaf("expired", l) // expired 71 h ago
	clk.Advance(72 * time.Hour)
	srvCert, srvKey := pki.issue("regional", certs.Identity{Kind: certs.KindRegion, Name: "r1"})
	goodCert, goodKey := pki.issue("good", certs.CellIdentity("r1", "good"))
	other := newIDPKI(t)
	foreignCert, foreignKey := other.issue("foreign", certs.CellIdentity("r1", "foreign"))

	c, _ := startController(t, func(cfg *Config) {
		cfg.TLS = TLSFiles{Cert: srvCert, Key: srvKey, CA: pki.caFile}
	})
	send := func(creds credentials.TransportCredentials, id string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		s, err := dialController(t, c.Addr(), creds).Heartbeat(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(heartbeat(id, "127.0.0.1:3100", 2, 1)); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		ack, err := s.Recv()
		if err == nil && ack.Error != "" {
			return errors.New(ack.Error)
		}
		return err
	}
	if err := send(pki.rawCreds(goodCert, goodKey), "good"); err != nil {
		t.Fatalf("a valid certificate was refused: %v", err)
	}
	for _, tc := range []struct {
		name      string
		cert, key string
		id        string
	}{
		{"expired", expCert, expKey, "old"},
		{"another CA", foreignCert, foreignKey, "foreign"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := send(pki.rawCreds(tc.cert, tc.key), tc.id)
			if code := status.Code(err); code != codes.Unavailable {
				t.Fatalf("got %v (%v); want the handshake to fail (Unavailable)", code, err)
			}
			if _, ok := c.Registry().View().Cell(tc.id); ok {
				t.Errorf("cell %s reached the registry", tc.id)
			}
		})
	}
}

// fakeGlobal is a GlobalControl server that sends a plan as soon as a
// stream opens, then ends the stream after the first summary, which it
// records.
type fakeGlobal struct {
	isobarpb.UnimplementedGlobalControlServer
	plan      *isobarpb.RoutingPlan
	summaries chan *isobarpb.RegionSummary
}

func (f *fakeGlobal) Sync(stream isobarpb.GlobalControl_SyncServer) error {
	if err := stream.Send(f.plan); err != nil {
		return err
	}
	sm, err := stream.Recv()
	if err != nil {
		return nil
	}
	f.summaries <- sm
	return nil
}

func serveFakeGlobal(t *testing.T, f *fakeGlobal, creds credentials.TransportCredentials) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	gs := grpc.NewServer(opts...)
	isobarpb.RegisterGlobalControlServer(gs, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(ln) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return ln.Addr().String()
}

// A region takes plans only from a global identity: a server using a
// region certificate from the same CA (say, a compromised regional
// controller posing as the leader) is refused before any summary is sent
// or plan read, counted and logged; a plaintext server is refused when
// the region runs with TLS.
func TestForgedPlanRefused(t *testing.T) {
	pki := newIDPKI(t)
	regCert, regKey := pki.issue("b", certs.Identity{Kind: certs.KindRegion, Name: "b"})
	dial, err := ClientDialOptions(TLSFiles{Cert: regCert, Key: regKey, CA: pki.caFile})
	if err != nil {
		t.Fatal(err)
	}
	serverCreds := func(id certs.Identity) credentials.TransportCredentials {
		l := id.Leaf(nil, []net.IP{net.ParseIP("127.0.0.1")})
		l.Server = true // a gateway's identity on a server certificate, for the forgery
		c, k := pki.issueLeaf(string(id.Kind)+"-"+id.Name, l)
		tc, err := certs.ServerConfig(c, k, pki.caFile)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(tc)
	}

	for _, tc := range []struct {
		name    string
		creds   credentials.TransportCredentials // nil: plaintext
		dial    []grpc.DialOption
		applied bool
		reason  string
	}{
		{"global identity", serverCreds(certs.Identity{Kind: certs.KindGlobal, Name: "g1"}), dial, true, ""},
		{"region identity", serverCreds(certs.Identity{Kind: certs.KindRegion, Name: "a"}), dial, false, "not_global"},
		{"gateway identity", serverCreds(certs.Identity{Kind: certs.KindGateway, Name: "b"}), dial, false, "not_global"},
		{"plaintext", nil, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, false, "not_mtls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRegFixture(t)
			s := newTestSyncer(DefaultConfig("b").Global, "b", f.reg, syncDeps{DialOptions: tc.dial, Clock: f.clock, Metrics: f.m})
			s.leader.mtls = true
			s.summary.latest.Store(&isobarpb.RegionSummary{Region: "b", Sequence: 1})
			fg := &fakeGlobal{plan: testPlan(7, 1, f.clock.Now()), summaries: make(chan *isobarpb.RegionSummary, 1)}
			addr := serveFakeGlobal(t, fg, tc.creds)
			refused := func() float64 { return testutil.ToFloat64(f.m.planPeerRefused.WithLabelValues(tc.reason)) }

			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if tc.applied {
				got, _ := s.leader.stream(ctx, addr)
				if r := s.Routes(); !got || r == nil || r.Epoch != 7 {
					t.Fatalf("plan from a global identity not installed: %v %+v", got, r)
				}
				if len(fg.summaries) != 1 {
					t.Fatal("no summary reached the global identity")
				}
				return
			}
			got, err := s.leader.stream(ctx, addr)
			if got || !errors.Is(err, ErrPlanSource) {
				t.Fatalf("stream = %v, %v; want ErrPlanSource", got, err)
			}
			if r := s.Routes(); r != nil {
				t.Fatalf("forged plan installed: %+v", r)
			}
			if refused() != 1 || testutil.ToFloat64(f.m.plans.WithLabelValues("applied")) != 0 {
				t.Errorf("refused{%s} = %v, applied = %v", tc.reason, refused(), testutil.ToFloat64(f.m.plans.WithLabelValues("applied")))
			}
			select {
			case sm := <-fg.summaries:
				t.Errorf("a summary reached the forged leader: %v", sm)
			default:
			}
		})
	}
}

// With TLS, only this region's gateways may read xDS or report: a gateway
// of another region, a cell or a regional controller certificate is
// refused with PermissionDenied and counted.
func TestXDSAndReportsOnlyForThisRegionsGateways(t *testing.T) {
	pki := newIDPKI(t)
	srvCert, srvKey := pki.issue("regional", certs.Identity{Kind: certs.KindRegion, Name: "r1"})
	c, prom := startController(t, func(cfg *Config) {
		cfg.TLS = TLSFiles{Cert: srvCert, Key: srvKey, CA: pki.caFile}
	})
	counter := func(name string, labels ...string) float64 {
		mfs, err := prom.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if len(labels) == 0 || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == labels[0]) {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	conn := func(name string, id certs.Identity) *grpc.ClientConn {
		cert, key := pki.issue(name, id)
		cc, err := grpc.NewClient(c.Addr(), grpc.WithTransportCredentials(pki.rawCreds(cert, key)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	// A cell so that the snapshot has a cluster to answer with.
	cell := conn("cell-a", certs.CellIdentity("r1", "cell-a"))
	s := openStream(t, isobarpb.NewCellRegistryClient(cell))
	_ = s.Send(heartbeat("cell-a", "127.0.0.1:3001", isobarpb.LifecycleState_LIFECYCLE_STATE_READY, 1))
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}

	fetchCDS := func(cc *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		st, err := discovery.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "gw"}, TypeUrl: resource.ClusterType}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		for {
			resp, err := st.Recv()
			if err != nil || len(resp.GetResources()) > 0 {
				return err
			}
		}
	}
	report := func(cc *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		rs, err := isobarpb.NewDataPlaneClient(cc).Report(ctx)
		if err != nil {
			return err
		}
		_ = rs.Send(&isobarpb.DataPlaneReport{Node: "gw", Region: "r1", IntervalSeconds: 1})
		_ = rs.CloseSend()
		for {
			if _, err := rs.Recv(); err != nil {
				return err
			}
		}
	}

	gw := conn("gw-r1", certs.Identity{Kind: certs.KindGateway, Name: "r1"})
	if err := fetchCDS(gw); err != nil {
		t.Fatalf("this region's gateway could not read xDS: %v", err)
	}
	if err := report(gw); status.Code(err) == codes.PermissionDenied {
		t.Fatalf("this region's gateway could not report: %v", err)
	}
	for i, tc := range []struct {
		name string
		id   certs.Identity
	}{
		{"gateway of another region", certs.Identity{Kind: certs.KindGateway, Name: "r2"}},
		{"a cell", certs.CellIdentity("r1", "cell-x")},
		{"a regional controller", certs.Identity{Kind: certs.KindRegion, Name: "r1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := conn(fmt.Sprintf("intruder-%d", i), tc.id)
			before := counter("isobar_regional_xds_streams_refused_total")
			if err := fetchCDS(cc); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.id.String()) {
				t.Fatalf("xDS: %v; want PermissionDenied naming %s", err, tc.id)
			}
			if got := counter("isobar_regional_xds_streams_refused_total"); got != before+1 {
				t.Errorf("xds refused = %v, want %v", got, before+1)
			}
			before = counter("isobar_regional_dataplane_reports_total", "forbidden")
			if err := report(cc); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("report: %v; want PermissionDenied", err)
			}
			if got := counter("isobar_regional_dataplane_reports_total", "forbidden"); got != before+1 {
				t.Errorf("reports{forbidden} = %v, want %v", got, before+1)
			}
		})
	}
}

// ControllerDialOptions reaches only the named region's controller: the
// same gateway certificate dialling a controller of another region fails
// at the handshake.
func TestControllerDialOptions(t *testing.T) {
	pki := newIDPKI(t)
	srvCert, srvKey := pki.issue("regional", certs.Identity{Kind: certs.KindRegion, Name: "r1"})
	c, _ := startController(t, func(cfg *Config) {
		cfg.TLS = TLSFiles{Cert: srvCert, Key: srvKey, CA: pki.caFile}
	})
	gwCert, gwKey := pki.issue("gw", certs.Identity{Kind: certs.KindGateway, Name: "r1"})
	files := TLSFiles{Cert: gwCert, Key: gwKey, CA: pki.caFile}
	report := func(region string) error {
		dial, err := ControllerDialOptions(files, region)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(c.Addr(), dial...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		rs, err := isobarpb.NewDataPlaneClient(cc).Report(ctx)
		if err != nil {
			return err
		}
		_ = rs.CloseSend()
		_, err = rs.Recv()
		return err
	}
	if err := report("r1"); !errors.Is(err, io.EOF) {
		t.Fatalf("own region's controller: %v, want a clean end of stream", err)
	}
	if err := report("r2"); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "region r2") {
		t.Fatalf("another region's controller: %v, want a handshake failure naming region r2", err)
	}
}
