package gossip

import (
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/certs"
)

// testKey is a cluster key for tests (AES-256).
var testKey = []byte("0123456789abcdef0123456789abcdef")

func newTestCA(t *testing.T) *certs.CA {
	t.Helper()
	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// leafCert issues a certificate for id from ca.
func leafCert(t *testing.T, ca *certs.CA, id certs.Identity) *tls.Certificate {
	t.Helper()
	is, err := ca.Issue(id.Leaf(nil, []net.IP{net.IPv4(127, 0, 0, 1)}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := is.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// identity is a node's Identity holding id's certificate from ca.
func identity(t *testing.T, ca *certs.CA, id certs.Identity) *Identity {
	cert := leafCert(t, ca, id)
	return &Identity{Certificate: func() (*tls.Certificate, error) { return cert, nil }, Roots: ca.Pool()}
}

func keyed(c Config) Config {
	c.SecretKey = testKey
	return c
}

// Gossip bound to identities, on loopback: x and y hold their regions'
// certificates. f holds the cluster key and runs as a regional member
// claiming the region "evil": without a proof, with a proof made with a
// cell's certificate, with one made with region x's (stolen) certificate,
// and claiming region x itself. None of it introduces a region at y, keeps
// one alive, gives one an RTT, or changes x's summary; each refusal is
// counted. (Before identities, f's own summaries were applied: a member's
// region was whatever its metadata said.)
func TestUnprovenMemberCannotIntroduceRegion(t *testing.T) {
	ca := newTestCA(t)
	x := startNode(t, keyed(regional("x")), Deps{Identity: identity(t, ca, certs.Identity{Kind: certs.KindRegion, Name: "x"})})
	y := startNode(t, keyed(regional("y", x.Addr())), Deps{Identity: identity(t, ca, certs.Identity{Kind: certs.KindRegion, Name: "y"})})
	f := startNode(t, keyed(regional("evil", x.Addr())), Deps{})
	if err := x.SetLocalSummary(summary("x", "i1", 5, 1)); err != nil {
		t.Fatal(err)
	}
	if err := f.SetLocalSummary(summary("evil", "i1", 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "y holding x's summary and refusing f's", func() bool {
		return heldSeq(y, "x") == 5 && testutil.ToFloat64(y.m.refused.WithLabelValues(refusedNoIdentity)) > 0
	})
	if m, ok := member(y, x.Name()); !ok || !m.Verified {
		t.Fatalf("x not verified at y: %+v", m)
	}

	fmeta, fpub := f.meta, f.priv.Public().(ed25519.PublicKey)
	cellProof, err := makeProof(leafCert(t, ca, certs.CellIdentity("evil", "c1")), f.Name(), fmeta)
	if err != nil {
		t.Fatal(err)
	}
	stolenProof, err := makeProof(leafCert(t, ca, certs.Identity{Kind: certs.KindRegion, Name: "x"}), f.Name(), fmeta)
	if err != nil {
		t.Fatal(err)
	}
	otherCA := newTestCA(t)
	foreignProof, err := makeProof(leafCert(t, otherCA, certs.Identity{Kind: certs.KindRegion, Name: "evil"}), f.Name(), fmeta)
	if err != nil {
		t.Fatal(err)
	}
	// A valid region-x proof, but of x's metadata, replayed under f's name.
	replayed, err := makeProof(leafCert(t, ca, certs.Identity{Kind: certs.KindRegion, Name: "x"}), x.Name(), x.meta)
	if err != nil {
		t.Fatal(err)
	}
	evil := mustMarshal(t, summary("evil", "i1", 2, 1))
	future := summary("x", "forged", 99, 1)
	future.At = timestamppb.New(time.Now().Add(365 * 24 * time.Hour))
	cases := []struct {
		name    string
		payload []byte
		want    verdict
	}{
		{"no proof", sealEnvelope(f.Name(), f.priv, evil), refusedNoIdentity},
		{"a cell's certificate", sealProof(f.Name(), fpub, f.priv, evil, cellProof), refusedBadIdentity},
		{"region x's certificate for region evil", sealProof(f.Name(), fpub, f.priv, evil, stolenProof), refusedBadIdentity},
		{"another CA", sealProof(f.Name(), fpub, f.priv, evil, foreignProof), refusedBadIdentity},
		{"x's proof replayed under f's name", sealProof(f.Name(), fpub, f.priv, evil, replayed), refusedBadIdentity},
		{"garbage proof", sealProof(f.Name(), fpub, f.priv, evil, []byte{1, 2, 3}), refusedBadIdentity},
		{"region x, a year ahead", sealProof(f.Name(), fpub, f.priv, mustMarshal(t, future), stolenProof), refusedFuture},
	}
	for _, tc := range cases {
		sendRaw(t, f, y, tc.payload)
		if v := awaitVerdict(t, y, tc.payload); v != tc.want {
			t.Errorf("%s: verdict %q, want %q", tc.name, v, tc.want)
		}
	}
	if _, ok := y.Summaries()["evil"]; ok {
		t.Fatal("an unproven member introduced region evil")
	}
	if _, ok := y.RTT()["evil"]; ok {
		t.Fatal("an unproven member's region has an RTT (the fallback would route to it)")
	}
	if m, ok := member(y, f.Name()); !ok || m.Verified {
		t.Fatalf("f verified at y: %+v", m)
	}
	if got := heldSeq(y, "x"); got != 5 {
		t.Fatalf("x held at sequence %d, want 5", got)
	}
	// x's next summary still gets through.
	if err := x.SetLocalSummary(summary("x", "i1", 6, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "y taking x's next summary", func() bool { return heldSeq(y, "x") == 6 })
	waitFor(t, converge, "y measuring x's RTT", func() bool { _, ok := y.RTT()["x"]; return ok })
}

// A forged member claiming another region with a summary a year ahead
// changes nothing: the receiver refuses a time beyond its clock plus the
// skew allowance. (Before, between two senders for a region the later
// sender-supplied time won, so the forgery masked the real summaries for a
// year.)
func TestForgedFutureSummaryChangesNothing(t *testing.T) {
	x := newPeer(t, "regional/x", RoleRegional, "x")
	forger := newPeer(t, "regional/x-forged", RoleRegional, "x")
	clk := clockwork.NewFakeClockAt(t0)
	cfg := Config{Role: RoleRegional, Region: "self", NodeName: "regional/self"}.withDefaults(nil)
	b := newBook(cfg, Deps{Clock: clk, Logger: testLogger(t)}, nilMetrics(t))
	for _, p := range []*peer{x, forger} {
		b.memberUp(p.name, net.IPv4(127, 0, 0, 1), 7946, p.meta())
	}
	if v := b.receive(x.env(t, at(summary("x", "i1", 1, 1), 0))); v != applied {
		t.Fatalf("x's summary: %q", v)
	}
	for _, ahead := range []time.Duration{365 * 24 * time.Hour, cfg.MaxClockSkew + time.Second} {
		if v := b.receive(forger.env(t, at(summary("x", "forged", 1, 9), ahead))); v != refusedFuture {
			t.Fatalf("forged summary %v ahead: verdict %q, want %q", ahead, v, refusedFuture)
		}
	}
	clk.Advance(time.Second)
	if v := b.receive(x.env(t, at(summary("x", "i1", 2, 1), time.Second))); v != applied {
		t.Fatalf("x's next summary: %q", v)
	}
	if s := b.summaries(true)["x"].Summary; s.GetIncarnation() != "i1" || s.GetSequence() != 2 {
		t.Fatalf("held for x: %v", s)
	}
	// Within the allowance a time ahead is accepted (clocks differ).
	if v := b.receive(x.env(t, at(summary("x", "i1", 3, 1), time.Second+cfg.MaxClockSkew))); v != applied {
		t.Fatalf("x's summary within the skew allowance: %q", v)
	}
	if n := testutil.ToFloat64(b.m.refused.WithLabelValues(refusedFuture)); n != 2 {
		t.Fatalf("refused{future} = %v, want 2", n)
	}
}

// A node's own configuration is checked at New: an Identity needs the
// cluster key, Roots, and (regional) a certificate naming its region.
func TestIdentityConfig(t *testing.T) {
	ca := newTestCA(t)
	xid := identity(t, ca, certs.Identity{Kind: certs.KindRegion, Name: "x"})
	cases := []struct {
		name string
		cfg  Config
		id   *Identity
		want error
	}{
		{"no key", regional("x"), xid, nil},
		{"no roots", keyed(regional("x")), &Identity{Certificate: xid.Certificate}, nil},
		{"regional without a certificate", keyed(regional("x")), &Identity{Roots: ca.Pool()}, nil},
		{"another region's certificate", keyed(regional("y")), xid, ErrBadIdentity},
		{"a cell's certificate", keyed(regional("x")), identity(t, ca, certs.CellIdentity("x", "c1")), ErrBadIdentity},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, Deps{Identity: tc.id})
			var fe *FieldError
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || (tc.want == nil && !errors.As(err, &fe)) {
				t.Fatalf("New = %v, want a refusal (%v)", err, tc.want)
			}
			t.Log(err)
		})
	}
	if _, err := New(keyed(Config{Role: RoleGlobal}), Deps{Identity: &Identity{Roots: ca.Pool()}}); err != nil {
		t.Fatalf("a global node with Roots only: %v", err)
	}
}

// FuzzVerifyProof: any proof bytes are refused with ErrBadIdentity or
// verify, never panic; only the real proof verifies.
func FuzzVerifyProof(f *testing.F) {
	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		f.Fatal(err)
	}
	is, err := ca.Issue(certs.Identity{Kind: certs.KindRegion, Name: "x"}.Leaf(nil, []net.IP{net.IPv4(127, 0, 0, 1)}))
	if err != nil {
		f.Fatal(err)
	}
	cert, err := is.TLSCertificate()
	if err != nil {
		f.Fatal(err)
	}
	meta := []byte("meta")
	good, err := makeProof(&cert, "regional/x", meta)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{proofVersion, 1, 0, 0})
	f.Add([]byte{})
	roots, now := ca.Pool(), is.Cert.NotBefore.Add(time.Hour)
	f.Fuzz(func(t *testing.T, b []byte) {
		region, _, err := verifyProof(b, "regional/x", meta, roots, now)
		if err != nil {
			if !errors.Is(err, ErrBadIdentity) {
				t.Fatalf("error %v is not ErrBadIdentity", err)
			}
			return
		}
		if region != "x" {
			t.Fatalf("verified region %q", region)
		}
	})
}
