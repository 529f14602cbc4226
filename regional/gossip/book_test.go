package gossip

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// peer is a member identity for book tests.
type peer struct {
	name, role, region string
	priv               ed25519.PrivateKey
}

func newPeer(t testing.TB, name, role, region string) *peer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &peer{name: name, role: role, region: region, priv: priv}
}

func (p *peer) pub() ed25519.PublicKey { return p.priv.Public().(ed25519.PublicKey) }

func (p *peer) meta() []byte {
	return encodeMeta(nodeMeta{Role: p.role, Region: p.region, Ingress: p.region + ":1", PubKey: p.pub()})
}

// restart gives the peer a new key, as a restarted process has.
func (p *peer) restart(t testing.TB) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.priv = priv
}

func (p *peer) env(t testing.TB, s *isobarpb.RegionSummary) []byte {
	return sealEnvelope(p.name, p.priv, mustMarshal(t, s))
}

func testBook(t testing.TB, clk clockwork.Clock, validate func(*isobarpb.RegionSummary) error, peers ...*peer) *book {
	// Summaries of these tests are stamped up to minutes after t0, the
	// clock's start: a day's skew allowance keeps the future check
	// (TestForgedFutureSummaryChangesNothing) out of the ordering tests.
	cfg := Config{Role: RoleRegional, Region: "self", NodeName: "regional/self", MaxClockSkew: 24 * time.Hour}.withDefaults(rand.Reader)
	b := newBook(cfg, Deps{Clock: clk, Logger: slog.New(slog.DiscardHandler), Validate: validate}, nilMetrics(t))
	for _, p := range peers {
		b.memberUp(p.name, net.IPv4(127, 0, 0, 1), 7946, p.meta())
	}
	return b
}

func at(s *isobarpb.RegionSummary, d time.Duration) *isobarpb.RegionSummary {
	s.At = timestamppb.New(t0.Add(d))
	return s
}

// The receive pipeline, step by step: each envelope's verdict and the
// sequence held for its region afterwards.
func TestBookVerdicts(t *testing.T) {
	x := newPeer(t, "regional/x", RoleRegional, "x")
	y := newPeer(t, "regional/y", RoleRegional, "y")
	g := newPeer(t, "global/1", RoleGlobal, "x")
	self := newPeer(t, "regional/self", RoleRegional, "self")
	stranger := newPeer(t, "regional/stranger", RoleRegional, "stranger")
	clk := clockwork.NewFakeClockAt(t0)
	validate := func(s *isobarpb.RegionSummary) error {
		if s.GetIngressAddress() == "reject-me" {
			return errors.New("policy")
		}
		return nil
	}
	b := testBook(t, clk, validate, x, y, g)
	rejected := summary("x", "i1", 50, 1)
	rejected.IngressAddress = "reject-me"
	xOld := newPeer(t, "regional/x", RoleRegional, "x")
	xOld.priv = x.priv

	first := x.env(t, summary("x", "i1", 3, 1))
	steps := []struct {
		name    string
		env     func() []byte
		want    verdict
		region  string
		heldSeq uint64
	}{
		{"first summary", func() []byte { return first }, applied, "x", 3},
		{"same bytes again", func() []byte { return first }, ignoredDuplicate, "x", 3},
		{"lower sequence", func() []byte { return x.env(t, summary("x", "i1", 2, 1)) }, ignoredStale, "x", 3},
		{"equal sequence, other content", func() []byte { return x.env(t, summary("x", "i1", 3, 2)) }, ignoredStale, "x", 3},
		{"higher sequence", func() []byte { return x.env(t, summary("x", "i1", 4, 1)) }, applied, "x", 4},
		{"new incarnation, earlier time", func() []byte { return x.env(t, at(summary("x", "i2", 1, 1), 0)) }, ignoredStale, "x", 4},
		{"new incarnation, later time", func() []byte { return x.env(t, at(summary("x", "i2", 1, 1), time.Hour)) }, applied, "x", 1},
		{"fails Validate", func() []byte { return x.env(t, rejected) }, refusedInvalid, "x", 1},
		{"sequence 0", func() []byte { return x.env(t, summary("x", "i2", 0, 1)) }, refusedInvalid, "x", 1},
		{"no time", func() []byte { s := summary("x", "i2", 60, 1); s.At = nil; return x.env(t, s) }, refusedInvalid, "x", 1},
		{"region too long", func() []byte {
			s := summary(string(make([]byte, 129)), "i2", 60, 1)
			return x.env(t, s)
		}, refusedInvalid, "x", 1},
		{"other region under own name", func() []byte { return y.env(t, summary("x", "i2", 99, 1)) }, refusedRegionMismatch, "x", 1},
		{"a global for its region", func() []byte { return g.env(t, summary("x", "i2", 99, 1)) }, refusedNotRegional, "x", 1},
		{"unknown sender", func() []byte { return stranger.env(t, summary("stranger", "i1", 1, 1)) }, refusedUnknownSender, "stranger", 0},
		{"our own, relayed back", func() []byte { return self.env(t, summary("self", "i1", 1, 1)) }, ignoredOwn, "self", 0},
		{"x's name, y's key", func() []byte {
			return sealEnvelope(x.name, y.priv, mustMarshal(t, summary("x", "i2", 99, 1)))
		}, refusedBadSignature, "x", 1},
		{"x's name and key, y's signature", func() []byte {
			return seal(x.name, x.pub(), y.priv, mustMarshal(t, summary("x", "i2", 99, 1)))
		}, refusedBadSignature, "x", 1},
		{"tampered summary", func() []byte {
			e := x.env(t, summary("x", "i2", 99, 1))
			e[len(e)-sigLen-3] ^= 0x01 // inside the summary's last field
			return e
		}, refusedBadSignature, "x", 1},
		{"oversized", func() []byte {
			return x.env(t, summary("x", "i2", 99, 200))
		}, refusedOversized, "x", 1},
		{"empty", func() []byte { return nil }, refusedUndecodable, "x", 1},
		{"truncated", func() []byte { e := x.env(t, summary("x", "i2", 99, 1)); return e[:len(e)-1] }, refusedUndecodable, "x", 1},
		{"y's first summary", func() []byte { return y.env(t, summary("y", "j", 1, 1)) }, applied, "y", 1},
	}
	for _, st := range steps {
		got := b.receive(st.env())
		if got != st.want {
			t.Errorf("%s: verdict %q, want %q", st.name, got, st.want)
		}
		if seq := b.summaries(false)[st.region].Summary.GetSequence(); seq != st.heldSeq {
			t.Errorf("%s: %s held at sequence %d, want %d", st.name, st.region, seq, st.heldSeq)
		}
	}

	// x restarts: its new key speaks for x at once, whatever the sequence;
	// envelopes signed with its old key (still relayed by others) are stale,
	// before and after the new key's first summary.
	oldKeyEnv := x.env(t, at(summary("x", "i2", 7, 1), 2*time.Hour))
	oldKeyEnv2 := x.env(t, at(summary("x", "i2", 8, 1), 2*time.Hour))
	x.restart(t)
	b.memberDown(x.name)
	b.memberUp(x.name, net.IPv4(127, 0, 0, 1), 7946, x.meta())
	if v := b.receive(oldKeyEnv); v != ignoredStale {
		t.Errorf("old key after restart: verdict %q, want %q", v, ignoredStale)
	}
	if v := b.receive(x.env(t, at(summary("x", "i3", 1, 1), 0))); v != applied {
		t.Errorf("new key after restart: verdict %q, want %q", v, applied)
	}
	if v := b.receive(oldKeyEnv2); v != ignoredStale {
		t.Errorf("old key after the new key's summary: verdict %q, want %q", v, ignoredStale)
	}
	if got := b.summaries(false)["x"].Summary.GetIncarnation(); got != "i3" {
		t.Errorf("held incarnation %q after restart, want i3", got)
	}

	// Counters add up: every envelope received is applied, refused or ignored.
	total := testutil.ToFloat64(b.m.received)
	sum := testutil.ToFloat64(b.m.applied)
	for _, r := range refusalReasons {
		sum += testutil.ToFloat64(b.m.refused.WithLabelValues(r))
	}
	for _, r := range ignoreReasons {
		sum += testutil.ToFloat64(b.m.ignored.WithLabelValues(r))
	}
	if total != float64(len(steps)+3) || sum != total {
		t.Errorf("received %v, applied+refused+ignored %v, want both %d", total, sum, len(steps)+3)
	}
}

// Summaries of departed members stay, with their receive time, marked not
// alive; members are forgotten after ForgetAfter; RTT is an EWMA per region
// of alive regional members only.
func TestBookMembershipAndRTT(t *testing.T) {
	x := newPeer(t, "regional/x", RoleRegional, "x")
	x2 := newPeer(t, "regional/x-2", RoleRegional, "x")
	g := newPeer(t, "global/1", RoleGlobal, "")
	clk := clockwork.NewFakeClockAt(t0)
	b := testBook(t, clk, nil, x, x2, g)
	b.memberUp("regional/self", net.IPv4(127, 0, 0, 1), 1, newPeer(t, "regional/self", RoleRegional, "self").meta())

	clk.Advance(time.Minute)
	if v := b.receive(x.env(t, summary("x", "i", 1, 1))); v != applied {
		t.Fatalf("verdict %q", v)
	}
	ps := b.summaries(true)["x"]
	if !ps.Alive || !ps.ReceivedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("summary %+v: want alive, received at t0+1m", ps)
	}

	b.pingRTT(x.name, 10*time.Millisecond)
	b.pingRTT(x2.name, 20*time.Millisecond) // same region: one EWMA
	b.pingRTT(g.name, 5*time.Millisecond)   // globals have no region RTT
	b.pingRTT("regional/self", time.Millisecond)
	b.pingRTT("unknown", time.Millisecond)
	rtt := b.rtts()
	want := time.Duration(0.2*float64(20*time.Millisecond) + 0.8*float64(10*time.Millisecond))
	if len(rtt) != 1 || rtt["x"] != want {
		t.Errorf("rtt %v, want only x=%v", rtt, want)
	}
	if got := b.othersAlive.Load(); got != 3 {
		t.Errorf("others alive %d, want 3", got)
	}

	// One member of x gone: still alive through the other.
	b.memberDown(x.name)
	if !b.summaries(false)["x"].Alive || len(b.rtts()) != 1 {
		t.Error("region x should stay alive while x-2 is")
	}
	// Both gone: the summary stays, not alive; RTT drops the region.
	clk.Advance(time.Minute)
	b.memberDown(x2.name)
	ps = b.summaries(false)["x"]
	if ps.Alive || ps.Summary.GetSequence() != 1 || !ps.ReceivedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("after departure: %+v, want kept, not alive, receive time unchanged", ps)
	}
	if len(b.rtts()) != 0 {
		t.Errorf("rtt %v after x's members left", b.rtts())
	}
	// Push-pull no longer relays it (a receiver could not verify it).
	envs, err := decodeState(b.localState(nil))
	if err != nil || len(envs) != 0 {
		t.Errorf("state relays %d summaries of departed members (err %v)", len(envs), err)
	}
	// Forgotten once departed longer than ForgetAfter (checked on the next
	// membership change); the summary stays.
	clk.Advance(b.forget + time.Second)
	b.memberUp(g.name, net.IPv4(127, 0, 0, 1), 7946, g.meta())
	for _, m := range b.members() {
		if m.Name == x.name || m.Name == x2.name {
			t.Errorf("%s not forgotten", m.Name)
		}
	}
	if _, ok := b.summaries(false)["x"]; !ok {
		t.Error("summary dropped with its members")
	}
}

// A push-pull state carries our envelope and the relayed ones; a peer
// applies each as if received directly.
func TestBookStateRelay(t *testing.T) {
	x := newPeer(t, "regional/x", RoleRegional, "x")
	y := newPeer(t, "regional/y", RoleRegional, "y")
	self := newPeer(t, "regional/self", RoleRegional, "self")
	clk := clockwork.NewFakeClockAt(t0)
	src := testBook(t, clk, nil, x, y)
	if v := src.receive(x.env(t, summary("x", "i", 4, 1))); v != applied {
		t.Fatal(v)
	}
	own := self.env(t, summary("self", "i", 9, 1))
	state := src.localState(own)

	dst := testBook(t, clk, nil, x, y)
	dst.self, dst.selfRegion = "regional/other", "other"
	dst.memberUp(self.name, net.IPv4(127, 0, 0, 1), 1, self.meta())
	dst.receiveState(state)
	got := dst.summaries(false)
	if got["x"].Summary.GetSequence() != 4 || got["self"].Summary.GetSequence() != 9 {
		t.Errorf("relayed state gave %v", got)
	}
	// A truncated state applies what it can read and counts the rest.
	dst2 := testBook(t, clk, nil, x, y)
	dst2.self, dst2.selfRegion = "regional/other", "other"
	dst2.memberUp(self.name, net.IPv4(127, 0, 0, 1), 1, self.meta())
	dst2.receiveState(state[:len(state)-5]) // cuts into the last entry, x's
	if testutil.ToFloat64(dst2.m.refused.WithLabelValues(refusedUndecodable)) != 1 {
		t.Error("truncated state not counted as undecodable")
	}
	if got := dst2.summaries(false); got["self"].Summary.GetSequence() != 9 || len(got) != 1 {
		t.Errorf("truncated state: want only the readable first entry applied, got %v", got)
	}
}

func TestSetLocalSummaryErrors(t *testing.T) {
	n, err := New(Config{Role: RoleRegional, Region: "a", Profile: ProfileLocal, MaxSummaryBytes: 4096}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	gl, err := New(Config{Role: RoleGlobal, Profile: ProfileLocal}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer gl.Stop()
	if err := n.SetLocalSummary(summary("a", "i", 5, 1)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		node *Node
		s    *isobarpb.RegionSummary
		want error
	}{
		{"global", gl, summary("a", "i", 6, 1), ErrNotRegional},
		{"nil", n, nil, ErrInvalidSummary},
		{"other region", n, summary("b", "i", 6, 1), ErrWrongRegion},
		{"sequence 0", n, summary("a", "i", 0, 1), ErrInvalidSummary},
		{"too large", n, summary("a", "i", 6, 40), ErrSummaryTooLarge},
		{"same sequence", n, summary("a", "i", 5, 1), ErrStaleSummary},
		{"lower sequence", n, summary("a", "i", 4, 1), ErrStaleSummary},
		{"new incarnation, earlier", n, at(summary("a", "j", 1, 1), 0), ErrStaleSummary},
		{"new incarnation, later", n, at(summary("a", "j", 1, 1), time.Hour), nil},
	} {
		if err := tc.node.SetLocalSummary(tc.s); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	// The published envelope is what peers will verify.
	e, err := decodeEnvelope(n.localEnvelope(), n.cfg.MaxSummaryBytes)
	if err != nil || !e.verify(n.priv.Public().(ed25519.PublicKey)) || e.Sender != "regional/a" {
		t.Errorf("local envelope: %+v, err %v", e, err)
	}
}

// Two live members publishing for one region (a misconfiguration) do not
// flap: the later time wins. When the holder's member is gone, the other
// takes over whatever the time.
func TestBookTwoPublishers(t *testing.T) {
	x := newPeer(t, "regional/x", RoleRegional, "x")
	x2 := newPeer(t, "regional/x-2", RoleRegional, "x")
	b := testBook(t, clockwork.NewFakeClockAt(t0), nil, x, x2)
	for _, st := range []struct {
		name string
		from *peer
		s    *isobarpb.RegionSummary
		want verdict
	}{
		{"x first", x, at(summary("x", "a", 10, 1), 10*time.Second), applied},
		{"x-2 earlier", x2, at(summary("x", "b", 50, 1), 5*time.Second), ignoredStale},
		{"x-2 later", x2, at(summary("x", "b", 1, 1), 20*time.Second), applied},
		{"x again, earlier than x-2", x, at(summary("x", "a", 11, 1), 15*time.Second), ignoredStale},
	} {
		if v := b.receive(st.from.env(t, st.s)); v != st.want {
			t.Errorf("%s: verdict %q, want %q", st.name, v, st.want)
		}
	}
	b.memberDown(x2.name)
	if v := b.receive(x.env(t, at(summary("x", "a", 12, 1), 16*time.Second))); v != applied {
		t.Errorf("x after x-2 left: verdict %q, want applied", v)
	}
	if got := b.summaries(false)["x"].Summary.GetSequence(); got != 12 {
		t.Errorf("held sequence %d, want 12", got)
	}
}
