package gossip

import (
	"bytes"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
)

// FuzzReceive feeds arbitrary bytes to the receive path of gossip messages
// (a user message, and a push-pull state) of a book that knows two regional
// members and a global. It must never panic; whatever it applies must be a
// summary that passes the basic checks, for the sender's own region, from a
// regional member; and every message must be accounted for exactly once.
func FuzzReceive(f *testing.F) {
	x := newPeer(f, "regional/x", RoleRegional, "x")
	y := newPeer(f, "regional/y", RoleRegional, "y")
	g := newPeer(f, "global/1", RoleGlobal, "")
	good := x.env(f, summary("x", "i", 1, 2))
	f.Add(good)
	f.Add(y.env(f, summary("x", "i", 2, 1)))
	f.Add(g.env(f, summary("x", "i", 2, 1)))
	f.Add(good[:len(good)/2])
	f.Add(encodeState([][]byte{good, y.env(f, summary("y", "i", 1, 0))}))
	f.Add([]byte{kindSummary})
	f.Add([]byte{kindState, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		b := testBook(t, clockwork.NewFakeClockAt(t0), nil, x, y, g)
		b.receive(raw)
		b.receiveState(raw)
		var sum float64
		sum += testutil.ToFloat64(b.m.applied)
		for _, r := range refusalReasons {
			sum += testutil.ToFloat64(b.m.refused.WithLabelValues(r))
		}
		for _, r := range ignoreReasons {
			sum += testutil.ToFloat64(b.m.ignored.WithLabelValues(r))
		}
		if got := testutil.ToFloat64(b.m.received); got != sum || got < 2 {
			t.Fatalf("received %v, accounted %v", got, sum)
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		for region, h := range b.held {
			if err := basicCheck(h.sum); err != nil {
				t.Fatalf("held summary fails the basic checks: %v", err)
			}
			rec := b.mems[h.origin]
			if rec == nil || rec.meta.Role != RoleRegional || rec.meta.Region != region || !bytes.Equal(rec.meta.PubKey, h.key) {
				t.Fatalf("summary for %s held from %s", region, h.origin)
			}
			e, err := decodeEnvelope(h.env, b.maxBytes)
			if err != nil || !e.verify(h.key) {
				t.Fatalf("held envelope does not verify: %v", err)
			}
			var s = h.sum
			if !proto.Equal(s, mustUnmarshal(t, e.Summary)) {
				t.Fatal("held summary differs from its envelope")
			}
		}
	})
}

// FuzzDecodeMeta: member metadata never panics the decoder, and what
// decodes re-encodes to the same fields.
func FuzzDecodeMeta(f *testing.F) {
	p := newPeer(f, "regional/x", RoleRegional, "x")
	f.Add(p.meta())
	f.Add(encodeMeta(nodeMeta{Role: RoleGlobal, PubKey: p.pub()}))
	f.Add([]byte{1, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		again, err := decodeMeta(encodeMeta(m))
		if err != nil || again.Role != m.Role || again.Region != m.Region || again.Ingress != m.Ingress ||
			!bytes.Equal(again.PubKey, m.PubKey) {
			t.Fatalf("round trip: %+v -> %+v (%v)", m, again, err)
		}
	})
}

func mustUnmarshal(t *testing.T, b []byte) proto.Message {
	t.Helper()
	s := summary("", "", 0, 0)
	proto.Reset(s)
	if err := proto.Unmarshal(b, s); err != nil {
		t.Fatal(err)
	}
	return s
}
