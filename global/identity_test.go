package global_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// With mTLS the leader accepts a region's summaries only from that
// region's identity (the URI SAN spiffe://isobar/region/<region>; common
// names, DNS SANs and other kinds do not count), and the handshake refuses
// expired certificates and those of another CA. Refusals are
// PermissionDenied and counted.
func TestSyncIdentity(t *testing.T) {
	start := time.Now()
	clk := clockwork.NewFakeClockAt(start.Add(-72 * time.Hour))
	ca, err := certs.NewCA(certs.CAConfig{}, certs.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, certs.CACertFile)
	issue := func(ca *certs.CA, dir, name string, l certs.Leaf) (string, string) {
		t.Helper()
		l.Name = name
		c, k, err := ca.IssueTo(dir, l, false)
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	region := func(r string) certs.Leaf { // a regional controller's client use
		l := certs.Identity{Kind: certs.KindRegion, Name: r}.Leaf(nil, nil)
		l.Server = false
		return l
	}
	expLeaf := region("a")
	expLeaf.TTL = time.Hour
	expCert, expKey := issue(ca, dir, "expired-a", expLeaf) // expired 71 h ago
	clk.Advance(72 * time.Hour)
	srvCert, srvKey := issue(ca, dir, "g1", certs.Identity{Kind: certs.KindGlobal, Name: "g1"}.Leaf(nil, []net.IP{net.ParseIP("127.0.0.1")}))

	other, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	otherDir := t.TempDir()
	foreignCert, foreignKey := issue(other, otherDir, "foreign-a", region("a"))

	e := startEtcd(t)
	g := startGlobal(t, "g1", e, func(c *global.Config) {
		c.Regions = []string{"a", "b"}
		c.TLSCert, c.TLSKey, c.TLSCA = srvCert, srvKey, caFile
	})
	waitLeader(t, 5*time.Second, g)
	rejected := func(reason string) float64 { return metric(t, g, "isobar_global_summaries_rejected_total", reason) }

	// open opens a Sync stream presenting the pair; the error is the
	// stream's (a refused handshake may fail here or at the first Recv).
	open := func(certFile, keyFile string) (isobarpb.GlobalControl_SyncClient, error) {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS13})
		conn, err := grpc.NewClient(g.srv.Addr(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return isobarpb.NewGlobalControlClient(conn).Sync(ctx)
	}
	summary := func(r string) *isobarpb.RegionSummary {
		return &isobarpb.RegionSummary{Region: r, Incarnation: "x", Sequence: 1, At: timestamppb.Now(),
			Models: []*isobarpb.ModelSummary{{Model: "m", CapacityRps: 10, DemandRps: 5}}}
	}
	exchange := func(s isobarpb.GlobalControl_SyncClient, err error, r string) error {
		if err != nil {
			return err
		}
		if err := s.Send(summary(r)); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = s.Recv()
		return err
	}
	exchange2 := func(certFile, keyFile, r string) error {
		s, err := open(certFile, keyFile)
		return exchange(s, err, r)
	}

	// Region a's own certificate: its summary is taken and a plan comes
	// back, so the refusals below are about identity.
	aCert, aKey := issue(ca, dir, "a", region("a"))
	if err := exchange2(aCert, aKey, "a"); err != nil {
		t.Fatalf("region a with its own certificate: %v", err)
	}

	cnOnly := certs.Leaf{DNS: []string{"b"}, Client: true} // names b only as CN and DNS SAN
	for i, tc := range []struct {
		name    string
		leaf    certs.Leaf
		summary string
		reason  string
		want    string
	}{
		{"another region's summary", region("a"), "b", "identity_mismatch", "region b"},
		{"a cell certificate", certs.CellIdentity("b", "c0").Leaf(nil, nil), "b", "no_identity", "not a regional controller"},
		{"a gateway certificate", certs.Identity{Kind: certs.KindGateway, Name: "b"}.Leaf(nil, nil), "b", "no_identity", "not a regional controller"},
		{"common name and DNS SAN only", cnOnly, "b", "no_identity", "no spiffe://isobar/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, k := issue(ca, dir, fmt.Sprintf("case-%d", i), tc.leaf)
			before := rejected(tc.reason)
			err := exchange2(c, k, tc.summary)
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want PermissionDenied mentioning %q", err, tc.want)
			}
			if got := rejected(tc.reason); got != before+1 {
				t.Errorf("rejected{%s} = %v, want %v", tc.reason, got, before+1)
			}
		})
	}

	for _, tc := range []struct{ name, cert, key string }{
		{"expired", expCert, expKey},
		{"another CA", foreignCert, foreignKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := exchange2(tc.cert, tc.key, "a"); status.Code(err) != codes.Unavailable {
				t.Fatalf("got %v; want the handshake to fail (Unavailable)", err)
			}
		})
	}
}
