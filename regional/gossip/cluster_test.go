package gossip

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	summarybounds "github.com/isobar-mesh/isobar/summary"
)

const converge = 15 * time.Second

// Three regions and a global: every node ends up with every other region's
// latest summary, whether it was set before the publisher started, after it
// joined, or is too large for a UDP gossip packet; a newer summary replaces
// the old one everywhere; an older one is ignored everywhere.
func TestSummariesSpread(t *testing.T) {
	a := newTestNode(t, regional("a"), Deps{})
	if err := a.SetLocalSummary(summary("a", "i1", 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	b := startNode(t, regional("b", a.Addr()), Deps{})
	c := startNode(t, regional("c", a.Addr()), Deps{})
	g := startNode(t, Config{Role: RoleGlobal, Join: []string{a.Addr()}}, Deps{})
	nodes := []*testNode{a, b, c, g}

	if err := b.SetLocalSummary(summary("b", "i1", 1, 1)); err != nil {
		t.Fatal(err)
	}
	big := summary("c", "i1", 1, 30)
	if err := c.SetLocalSummary(big); err != nil {
		t.Fatal(err)
	}
	if env := c.localEnvelope(); len(env) <= c.udpMax {
		t.Fatalf("c's envelope of %d bytes fits UDP (%d): the TCP path goes untested", len(env), c.udpMax)
	}

	want := map[string]uint64{"a": 1, "b": 1, "c": 1}
	waitSeqs := func(what string) {
		t.Helper()
		for _, n := range nodes {
			waitFor(t, converge, n.Name()+" holding "+what, func() bool {
				got := n.Summaries()
				for region, seq := range want {
					if region == n.cfg.Region {
						continue
					}
					if ps, ok := got[region]; !ok || ps.Summary.GetSequence() != seq || !ps.Alive {
						return false
					}
				}
				return true
			})
		}
	}
	waitSeqs("every first summary")
	for _, n := range nodes {
		if _, ok := n.Summaries()[n.cfg.Region]; ok && n.cfg.Region != "" {
			t.Errorf("%s lists its own region among the peers' summaries", n.Name())
		}
	}
	if got := g.Summaries()["c"].Summary; !proto.Equal(got, big) {
		t.Errorf("global holds a different summary for c than c published")
	}

	// Membership: everyone alive with the advertised role, region, ingress.
	for _, n := range nodes {
		waitFor(t, converge, n.Name()+" seeing 4 members", func() bool {
			alive := 0
			for _, m := range n.Members() {
				if m.Alive {
					alive++
				}
			}
			return alive == 4
		})
		m, _ := member(n, "regional/b")
		if m.Role != RoleRegional || m.Region != "b" || m.Ingress != "b.ingress:8443" || m.Addr != b.Addr() {
			t.Errorf("%s sees b as %+v", n.Name(), m)
		}
		m, _ = member(n, g.Name())
		if m.Role != RoleGlobal || m.Region != "" {
			t.Errorf("%s sees the global as %+v", n.Name(), m)
		}
	}

	// An update replaces the old summary everywhere.
	if err := b.SetLocalSummary(summary("b", "i1", 2, 1)); err != nil {
		t.Fatal(err)
	}
	want["b"] = 2
	waitSeqs("b's second summary")

	// An older summary, validly signed by b, is ignored everywhere.
	stale := summary("b", "i1", 1, 1)
	stale.IngressAddress = "stale.example:1"
	env := sealEnvelope(b.Name(), b.priv, mustMarshal(t, stale))
	for _, n := range []*testNode{a, c, g} {
		sendRaw(t, b, n, env)
		if v := awaitVerdict(t, n, env); v != ignoredStale {
			t.Errorf("%s: stale summary judged %q, want %q", n.Name(), v, ignoredStale)
		}
		if ps := n.Summaries()["b"]; ps.Summary.GetSequence() != 2 || ps.Summary.GetIngressAddress() == "stale.example:1" {
			t.Errorf("%s: stale summary replaced the newer one: %v", n.Name(), ps.Summary)
		}
	}

	// The node's own summary is refused locally when not newer.
	if err := b.SetLocalSummary(summary("b", "i1", 2, 1)); !errors.Is(err, ErrStaleSummary) {
		t.Errorf("same sequence again: err %v, want ErrStaleSummary", err)
	}
}

// Every regional node measures a plausible loopback RTT to every other
// region, and so does the global.
func TestRTT(t *testing.T) {
	a := startNode(t, regional("a"), Deps{})
	b := startNode(t, regional("b", a.Addr()), Deps{})
	c := startNode(t, regional("c", a.Addr()), Deps{})
	g := startNode(t, Config{Role: RoleGlobal, Join: []string{a.Addr()}}, Deps{})
	for _, n := range []*testNode{a, b, c, g} {
		waitFor(t, converge, n.Name()+" measuring RTT to every other region", func() bool {
			rtt := n.RTT()
			for _, r := range []string{"a", "b", "c"} {
				if _, ok := rtt[r]; !ok && r != n.cfg.Region {
					return false
				}
			}
			return true
		})
		rtt := n.RTT()
		if _, ok := rtt[n.cfg.Region]; ok {
			t.Errorf("%s lists an RTT to its own region", n.Name())
		}
		for r, d := range rtt {
			if d <= 0 || d >= time.Second {
				t.Errorf("%s: RTT to %s = %v, want within (0, 1s) on loopback", n.Name(), r, d)
			}
		}
		// The probes carry coordinates: the node's own is placed and
		// valid for the region's summary.
		waitFor(t, converge, n.Name()+" placing its coordinate", func() bool { return n.Coordinate() != nil })
		if c := n.Coordinate(); summarybounds.CoordinateProto(c) == nil {
			t.Errorf("%s: coordinate %+v would not validate", n.Name(), c)
		}
	}
}

// A node that leaves is marked left at once; a node that dies is declared
// dead within the profile's suspicion bound. Their summaries stay, marked
// not alive, and their regions drop out of RTT.
func TestDepartures(t *testing.T) {
	a := startNode(t, regional("a"), Deps{})
	b := startNode(t, regional("b", a.Addr()), Deps{})
	c := startNode(t, regional("c", a.Addr()), Deps{})
	for _, n := range []*testNode{b, c} {
		if err := n.SetLocalSummary(summary(n.cfg.Region, "i1", 7, 1)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, converge, "a holding b's and c's summaries and RTTs", func() bool {
		s, rtt := a.Summaries(), a.RTT()
		return s["b"].Alive && s["c"].Alive && rtt["b"] > 0 && rtt["c"] > 0
	})

	b.Stop()
	// Stop left rather than vanished: memberlist tells the leaving node of
	// its own departure only when it leaves.
	if m, _ := member(b, b.Name()); m.Alive {
		t.Error("b stopped without leaving")
	}
	waitFor(t, 5*time.Second, "a seeing b leave", func() bool {
		m, ok := member(a, b.Name())
		return ok && !m.Alive
	})

	bound := suspicionBound(a.mc, 3)
	killed := time.Now()
	c.stop(false)
	waitFor(t, bound, "a declaring c dead", func() bool {
		m, ok := member(a, c.Name())
		return ok && !m.Alive
	})
	t.Logf("silent death detected after %v (bound %v)", time.Since(killed).Round(time.Millisecond), bound)

	s := a.Summaries()
	for _, r := range []string{"b", "c"} {
		ps, ok := s[r]
		if !ok || ps.Summary.GetSequence() != 7 {
			t.Errorf("a lost %s's summary: %+v", r, ps)
		}
		if ps.Alive {
			t.Errorf("%s's summary still marked alive", r)
		}
		if ps.ReceivedAt.IsZero() {
			t.Errorf("%s's summary has no receive time", r)
		}
	}
	if rtt := a.RTT(); len(rtt) != 0 {
		t.Errorf("RTT still lists departed regions: %v", rtt)
	}
}

// Bad input from peers: each is refused and counted by reason, none
// crashes the receiver, none replaces the good summary it holds.
func TestRefusals(t *testing.T) {
	validate := func(s *isobarpb.RegionSummary) error {
		if s.GetIngressAddress() == "reject-me" {
			return errors.New("ingress refused by policy")
		}
		return nil
	}
	z := startNode(t, regional("z"), Deps{Validate: validate})
	x := startNode(t, regional("x", z.Addr()), Deps{})
	y := startNode(t, regional("y", z.Addr()), Deps{})
	g := startNode(t, Config{Role: RoleGlobal, Region: "x", Join: []string{z.Addr()}}, Deps{})
	if err := x.SetLocalSummary(summary("x", "i1", 5, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "z holding x's summary and knowing every member", func() bool {
		alive := 0
		for _, m := range z.Members() {
			if m.Alive {
				alive++
			}
		}
		return heldSeq(z, "x") == 5 && alive == 4
	})
	good := z.Summaries()["x"].Summary

	rejected := summary("y", "i1", 1, 1)
	rejected.IngressAddress = "reject-me"
	cases := []struct {
		name    string
		from    *testNode
		payload []byte
		want    verdict
	}{
		{"oversized", y, bytes.Repeat([]byte{kindSummary}, DefaultMaxSummaryBytes+envelopeOverhead+1), refusedOversized},
		{"garbage", y, []byte("\x01garbage"), refusedUndecodable},
		{"unknown kind", y, []byte("\x07"), refusedUndecodable},
		{"summary bytes not protobuf", y, sealEnvelope(y.Name(), y.priv, []byte{0xff, 0xff, 0xff}), refusedUndecodable},
		{"region X under region Y's name", y,
			sealEnvelope(y.Name(), y.priv, mustMarshal(t, summary("x", "forged", 99, 1))), refusedRegionMismatch},
		{"X's name with Y's key", y,
			sealEnvelope(x.Name(), y.priv, mustMarshal(t, summary("x", "forged", 99, 1))), refusedBadSignature},
		{"X's name and key, Y's signature", y,
			seal(x.Name(), x.priv.Public().(ed25519.PublicKey), y.priv, mustMarshal(t, summary("x", "forged", 99, 1))), refusedBadSignature},
		{"a global speaks for its region", g,
			sealEnvelope(g.Name(), g.priv, mustMarshal(t, summary("x", "global", 99, 1))), refusedNotRegional},
		{"fails Validate", y, sealEnvelope(y.Name(), y.priv, mustMarshal(t, rejected)), refusedInvalid},
		{"fails basic checks", y, sealEnvelope(y.Name(), y.priv, mustMarshal(t, summary("y", "i1", 0, 1))), refusedInvalid},
		{"unknown sender", y,
			sealEnvelope("regional/nowhere", y.priv, mustMarshal(t, summary("nowhere", "i1", 1, 1))), refusedUnknownSender},
	}
	counts := map[verdict]float64{}
	for _, tc := range cases {
		sendRaw(t, tc.from, z, tc.payload)
		if v := awaitVerdict(t, z, tc.payload); v != tc.want {
			t.Errorf("%s: verdict %q, want %q", tc.name, v, tc.want)
		}
		counts[tc.want]++
	}
	for reason, n := range counts {
		if got := testutil.ToFloat64(z.m.refused.WithLabelValues(string(reason))); got != n {
			t.Errorf("refused{reason=%q} = %v, want %v", reason, got, n)
		}
	}
	s := z.Summaries()
	if !proto.Equal(s["x"].Summary, good) {
		t.Errorf("x's summary changed: %v", s["x"].Summary)
	}
	for _, r := range []string{"y", "nowhere"} {
		if _, ok := s[r]; ok {
			t.Errorf("a refused summary for %s was stored", r)
		}
	}
	// The receiver is still healthy: a real update still gets through.
	if err := x.SetLocalSummary(summary("x", "i1", 6, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "z taking x's next summary", func() bool { return heldSeq(z, "x") == 6 })
}

// A node whose seed is not up yet retries with backoff (on the injected
// clock) and joins once the seed is there.
func TestJoinRetry(t *testing.T) {
	port := freePort(t)
	clk := clockwork.NewFakeClock()
	a := startNode(t, regional("a", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))), Deps{Clock: clk})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("a never waited to retry its join: %v", err)
	}
	if got := testutil.ToFloat64(a.m.joins.WithLabelValues("failed")); got < 1 {
		t.Fatalf("join failures = %v, want ≥ 1", got)
	}
	cfg := regional("b")
	cfg.BindPort = port
	b := startNode(t, cfg, Deps{})
	if m, ok := member(a, b.Name()); ok && m.Alive {
		t.Fatal("a joined b before its backoff elapsed")
	}
	clk.Advance(a.cfg.JoinBackoffMax)
	// The two see each other during the join's push/pull, before Join
	// returns and the join is counted: wait for both.
	waitFor(t, converge, "a and b seeing each other, a's join counted", func() bool {
		ma, okA := member(b, a.Name())
		mb, okB := member(a, b.Name())
		return okA && okB && ma.Alive && mb.Alive && testutil.ToFloat64(a.m.joins.WithLabelValues("ok")) >= 1
	})
	if got := testutil.ToFloat64(a.m.joins.WithLabelValues("ok")); got != 1 {
		t.Errorf("successful joins = %v, want 1", got)
	}
}

// freePort returns a loopback port free for both TCP and UDP right now.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		_ = u.Close()
		return port
	}
	t.Fatal("no free port")
	return 0
}

// Every metric passes promlint, is named isobar_gossip_*, and the per-region
// gauges carry the regions.
func TestMetrics(t *testing.T) {
	a := startNode(t, regional("a"), Deps{})
	b := startNode(t, regional("b", a.Addr()), Deps{})
	if err := b.SetLocalSummary(summary("b", "i1", 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "a holding b's summary and RTT", func() bool {
		return heldSeq(a, "b") == 1 && a.RTT()["b"] > 0
	})
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	got := map[string]map[string]bool{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "isobar_gossip_") {
			t.Errorf("metric %s outside isobar_gossip_", mf.GetName())
		}
		got[mf.GetName()] = map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				got[mf.GetName()][l.GetName()+"="+l.GetValue()] = true
			}
		}
	}
	for name, label := range map[string]string{
		"isobar_gossip_members":                  "role=regional",
		"isobar_gossip_rtt_seconds":              "region=b",
		"isobar_gossip_summary_age_seconds":      "region=b",
		"isobar_gossip_summaries_refused_total":  "reason=bad_signature",
		"isobar_gossip_summaries_received_total": "",
		"isobar_gossip_summaries_applied_total":  "",
	} {
		if _, ok := got[name]; !ok {
			t.Errorf("metric %s missing", name)
			continue
		}
		if label != "" && !got[name][label] {
			t.Errorf("metric %s has no series with %s: %v", name, label, got[name])
		}
	}
	if v := testutil.ToFloat64(a.m.applied); v < 1 {
		t.Errorf("applied = %v, want ≥ 1", v)
	}
}

// With push-pull off, each dissemination path is on its own: a small
// summary reaches the others by UDP gossip, a large one by direct TCP
// sends.
func TestDisseminationPaths(t *testing.T) {
	noPushPull := func(n *testNode) *testNode {
		n.mc.PushPullInterval = 0 // memberlist: 0 disables periodic push-pull
		if err := n.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		return n
	}
	a := noPushPull(newTestNode(t, regional("a"), Deps{}))
	b := noPushPull(newTestNode(t, regional("b", a.Addr()), Deps{}))
	c := noPushPull(newTestNode(t, regional("c", a.Addr()), Deps{}))
	waitFor(t, converge, "three members everywhere", func() bool {
		return a.book.othersAlive.Load() == 2 && b.book.othersAlive.Load() == 2 && c.book.othersAlive.Load() == 2
	})
	// Joins are over: from now on only broadcasts and fan-outs carry a's
	// summary.
	small := summary("a", "i", 1, 1)
	if err := a.SetLocalSummary(small); err != nil {
		t.Fatal(err)
	}
	if len(a.localEnvelope()) > a.udpMax {
		t.Fatalf("small envelope of %d bytes does not fit UDP", len(a.localEnvelope()))
	}
	for _, n := range []*testNode{b, c} {
		waitFor(t, converge, n.Name()+" receiving a's summary by UDP gossip", func() bool { return heldSeq(n, "a") == 1 })
	}
	if got := testutil.ToFloat64(a.m.directSends.WithLabelValues("ok")); got != 0 {
		t.Errorf("a small summary went out by %v direct sends", got)
	}
	if err := a.SetLocalSummary(summary("a", "i", 2, 30)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*testNode{b, c} {
		waitFor(t, converge, n.Name()+" receiving a's large summary by TCP", func() bool { return heldSeq(n, "a") == 2 })
	}
	sends := func() float64 { return testutil.ToFloat64(a.m.directSends.WithLabelValues("ok")) }
	waitFor(t, converge, "a counting its direct sends", func() bool { return sends() >= 2 })
	if got := sends(); got != 2 {
		t.Errorf("direct sends = %v, want 2 (one per other member)", got)
	}
}

// With a secret key, members sharing it gossip; a member with another key
// cannot join.
func TestEncryption(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	withKey := func(c Config, k []byte) Config { c.SecretKey = k; return c }
	a := startNode(t, withKey(regional("a"), key), Deps{})
	b := startNode(t, withKey(regional("b", a.Addr()), key), Deps{})
	if err := b.SetLocalSummary(summary("b", "i", 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "a holding b's summary over encrypted gossip", func() bool { return heldSeq(a, "b") == 1 })

	intruder := startNode(t, withKey(regional("c", a.Addr()), bytes.Repeat([]byte{8}, 32)), Deps{})
	waitFor(t, converge, "the intruder's join failing", func() bool {
		return testutil.ToFloat64(intruder.m.joins.WithLabelValues("failed")) >= 1
	})
	if _, ok := member(a, intruder.Name()); ok {
		t.Error("a member with another key joined")
	}
}
