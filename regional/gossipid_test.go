package regional

import (
	"crypto/tls"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/gossip"
)

// Fallback routing never reaches a region claimed by a member without a
// region identity. Three gossip members on loopback share the cluster key:
// b (this region) and c hold their regions' certificates; f holds only the
// key and claims region "evil", with a huge capacity and its own ingress.
// b's fallback table (what fallback mode puts into EDS) routes to c and has
// no trace of evil. (Before identities, a member's region was whatever its
// metadata said, and evil's ingress went into b's EDS.)
func TestFallbackIgnoresUnprovenRegion(t *testing.T) {
	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ident := func(region string) *gossip.Identity {
		is, err := ca.Issue(certs.Identity{Kind: certs.KindRegion, Name: region}.Leaf(nil, []net.IP{net.IPv4(127, 0, 0, 1)}))
		if err != nil {
			t.Fatal(err)
		}
		cert, err := is.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return &gossip.Identity{Roots: ca.Pool(), Certificate: func() (*tls.Certificate, error) { return &cert, nil }}
	}
	key := []byte("0123456789abcdef0123456789abcdef")
	start := func(region, ingress string, id *gossip.Identity, reg prometheus.Registerer, join ...string) *gossip.Node {
		n, err := gossip.New(gossip.Config{Role: gossip.RoleRegional, Region: region, IngressAddress: ingress, Join: join,
			Profile: gossip.ProfileLocal, SecretKey: key}, gossip.Deps{Identity: id, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Stop)
		return n
	}
	breg := prometheus.NewRegistry()
	b := start("b", "127.0.0.2:8000", ident("b"), breg)
	c := start("c", "127.0.0.3:8000", ident("c"), nil, b.Addr())
	f := start("evil", "127.0.0.9:8000", nil, nil, b.Addr())
	clock := clockwork.NewRealClock()
	sum := func(region, ingress string, capacity float64) *isobarpb.RegionSummary {
		return &isobarpb.RegionSummary{Region: region, Incarnation: "i1", Sequence: 1, At: timestamppb.New(clock.Now()),
			IngressAddress: ingress, Models: []*isobarpb.ModelSummary{{Model: "m", CellsReady: 4, CapacityRps: capacity, DemandRps: 1}}}
	}
	if err := c.SetLocalSummary(sum("c", "127.0.0.3:8000", 10)); err != nil {
		t.Fatal(err)
	}
	if err := f.SetLocalSummary(sum("evil", "127.0.0.9:8000", 1e6)); err != nil {
		t.Fatal(err)
	}
	refusedNoIdentity := func() float64 {
		mfs, _ := breg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "isobar_gossip_summaries_refused_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == "no_identity" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	deadline := clock.Now().Add(20 * time.Second)
	for {
		_, haveC := b.Summaries()["c"]
		_, rttC := b.RTT()["c"]
		if haveC && rttC && refusedNoIdentity() > 0 {
			break
		}
		if clock.Now().After(deadline) {
			t.Fatalf("b did not take c's summary and RTT and refuse evil's: summaries %v rtt %v refused %v", b.Summaries(), b.RTT(), refusedNoIdentity())
		}
		<-clock.After(10 * time.Millisecond)
	}

	fx := newRegFixture(t)
	s := newTestSyncer(DefaultConfig("b").Global, "b", fx.reg, syncDeps{Gossip: b, Clock: clock, Metrics: fx.m})
	self := sum("b", "127.0.0.2:8000", 1)
	self.Models[0].DemandRps = 50 // more than b can serve: the fallback spills
	tbl := s.planner.plan(clock.Now(), self)
	if tbl.Source != RoutesFallback || tbl.Ingress["c"] != "127.0.0.3:8000" {
		t.Fatalf("fallback without c: %+v", tbl)
	}
	if a, ok := tbl.Ingress["evil"]; ok {
		t.Fatalf("fallback routes to the unproven region evil at %s: %+v", a, tbl)
	}
	if share := tbl.Models["m"].Routes["evil"]; share != 0 {
		t.Fatalf("fallback sends %v of m to evil", share)
	}
}
