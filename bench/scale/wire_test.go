package scale

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/stats"
)

const adsMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// event feeds one RPC event of method to w at the clock's time and
// advances the clock by a millisecond.
func event(w *wireLog, clock *clockwork.FakeClock, method string, s stats.RPCStats) {
	ctx := w.TagRPC(context.Background(), &stats.RPCTagInfo{FullMethodName: method})
	w.HandleRPC(ctx, s)
	clock.Advance(time.Millisecond)
}

// TestWireLogRecordsADSResponsesOnly: the client's log takes the responses
// it read on ADS streams (either flavour), the server's those it wrote;
// requests, other methods and the other side's events are left out.
func TestWireLogRecordsADSResponsesOnly(t *testing.T) {
	start := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		client bool
		method string
		ev     stats.RPCStats
		want   bool
	}{
		{true, adsMethod, &stats.InPayload{Client: true}, true},
		{true, "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources", &stats.InPayload{Client: true}, true},
		{true, adsMethod, &stats.OutPayload{Client: true}, false},
		{true, adsMethod, &stats.InPayload{}, false},
		{true, "/isobar.v1.CellRegistry/Heartbeat", &stats.InPayload{Client: true}, false},
		{true, adsMethod, &stats.End{Client: true}, false},
		{false, adsMethod, &stats.OutPayload{}, true},
		{false, adsMethod, &stats.InPayload{}, false},
		{false, adsMethod, &stats.OutPayload{Client: true}, false},
		{false, "/isobar.v1.CellRegistry/Heartbeat", &stats.OutPayload{}, false},
	}
	for i, c := range cases {
		clock := clockwork.NewFakeClockAt(start)
		w := newWireLog(clock, c.client)
		event(w, clock, c.method, c.ev)
		_, got := w.lastBefore(start.Add(time.Hour))
		if got != c.want {
			t.Errorf("case %d (client %v, %s, %T): recorded %v, want %v", i, c.client, c.method, c.ev, got, c.want)
		}
	}
}

func TestWireLogLastBeforeAndBound(t *testing.T) {
	start := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	clock := clockwork.NewFakeClockAt(start)
	w := newWireLog(clock, true)
	if _, ok := w.lastBefore(start.Add(time.Hour)); ok {
		t.Fatal("an empty log found a time")
	}
	for range maxWireTimes + 3 {
		event(w, clock, adsMethod, &stats.InPayload{Client: true})
	}
	if len(w.at) > maxWireTimes {
		t.Errorf("%d times kept, bound %d", len(w.at), maxWireTimes)
	}
	last := start.Add(time.Duration(maxWireTimes+2) * time.Millisecond)
	for _, c := range []struct {
		t    time.Time
		want time.Time
		ok   bool
	}{
		{last.Add(time.Second), last, true},
		{last, last, true},
		{last.Add(-time.Microsecond), last.Add(-time.Millisecond), true},
		{start, time.Time{}, false}, // dropped with the oldest half
	} {
		got, ok := w.lastBefore(c.t)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("lastBefore(%v) = %v, %v; want %v, %v", c.t, got, ok, c.want, c.ok)
		}
	}
}

// TestRemovalTimesTraceTheWire: a death's removal is traced to the last
// response the client read before it, and that to the last the server
// wrote before the read; without logs only the removal is timed.
func TestRemovalTimesTraceTheWire(t *testing.T) {
	start := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	rm := newRemovals(1)
	rm.asked("c", at(-20))
	rm.died("c", at(0))
	rm.see(at(300), map[string]uint32{})
	rcv, snt := newWireLog(nil, true), newWireLog(nil, false)
	for _, ms := range []int{-50, 100, 250, 400} {
		rcv.record(at(ms))
	}
	for _, ms := range []int{-60, 90, 240, 245, 390} {
		snt.record(at(ms))
	}
	got := rm.times(rcv, snt)
	if len(got) != 1 || got[0] != (deathTime{removed: 300, received: 250, sent: 245, lag: 20}) {
		t.Errorf("times = %+v, want removed 300, received 250, sent 245, lag 20", got)
	}
	got = rm.times(nil, nil)
	if len(got) != 1 || got[0].removed != 300 || !math.IsNaN(got[0].received) || !math.IsNaN(got[0].sent) {
		t.Errorf("times without logs = %+v, want removed 300, the rest NaN", got)
	}
	var f Figures
	f.breakDown(rm.times(rcv, snt))
	if f.DeathToSentP50Ms == nil || *f.DeathToSentP50Ms != 245 || *f.DeathToReceivedP50Ms != 250 || *f.ClientApplyP50Ms != 50 {
		t.Errorf("breakdown %v %v %v, want 245, 250, 50", f.DeathToSentP50Ms, f.DeathToReceivedP50Ms, f.ClientApplyP50Ms)
	}
	if f.DeathToSentMeanMs == nil || *f.DeathToSentMeanMs != 245 {
		t.Errorf("sent mean %v, want 245", f.DeathToSentMeanMs)
	}
	// A write or read the logs hold from before the death did not carry
	// its removal: the death is left untraced at that step.
	early := newWireLog(nil, false)
	early.record(at(-60))
	if got := rm.times(rcv, early); len(got) != 1 || got[0].received != 250 || !math.IsNaN(got[0].sent) {
		t.Errorf("times with only a write before the death = %+v, want received 250, sent NaN", got)
	}
	earlyRcv := newWireLog(nil, true)
	earlyRcv.record(at(-50))
	if got := rm.times(earlyRcv, snt); len(got) != 1 || !math.IsNaN(got[0].received) || !math.IsNaN(got[0].sent) {
		t.Errorf("times with only a read before the death = %+v, want received and sent NaN", got)
	}
	// A death traced to the read only (the write it came in logged after
	// the read) is left out of the whole breakdown, not out of sent alone:
	// the figures are over the same deaths and keep their order.
	f = Figures{}
	f.breakDown([]deathTime{{removed: 300, received: 250, sent: 245, lag: 20}, {removed: 12, received: 10, sent: math.NaN(), lag: 5}})
	if f.DeathsTraced != 1 || *f.DeathToSentP50Ms != 245 || *f.DeathToReceivedP50Ms != 250 || *f.ClientApplyP50Ms != 50 || *f.KillLagP50Ms != 5 {
		t.Errorf("partly traced: %d traced, breakdown %v %v %v, kill lag %v; want 1, 245, 250, 50 and the lag over both deaths (P50 5)",
			f.DeathsTraced, *f.DeathToSentP50Ms, *f.DeathToReceivedP50Ms, *f.ClientApplyP50Ms, *f.KillLagP50Ms)
	}
	f = Figures{}
	f.breakDown(rm.times(nil, nil))
	if f.DeathToSentP50Ms != nil || f.DeathToReceivedP50Ms != nil || f.ClientApplyP50Ms != nil || f.DeathToSentMeanMs != nil {
		t.Error("untraced deaths gave a breakdown")
	}
}

// TestRemovalBeforeItsDeathsTimeCameBack: the time of a death comes back
// from the cell after the ask; an assignment without the cell that arrived
// in between, at or after the death, is its removal, and one from before
// the death (a TTL failure, say) is not.
func TestRemovalBeforeItsDeathsTimeCameBack(t *testing.T) {
	start := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	rm := newRemovals(2)
	rm.asked("a", at(0))
	rm.asked("b", at(0))
	none := map[string]uint32{}
	if rm.see(at(-5), none) {
		t.Fatal("done on an assignment from before the asks")
	}
	rm.see(at(10), map[string]uint32{"b": 1}) // a out before its death at 30
	rm.see(at(40), none)                      // a and b out
	if rm.done() {
		t.Fatal("done before the deaths' times came back")
	}
	rm.died("a", at(30))
	rm.died("b", at(20))
	if !rm.done() {
		t.Fatal("not done: both were out of the assignment at 40")
	}
	got := map[float64]float64{}
	for _, d := range rm.times(nil, nil) {
		got[d.lag] = d.removed
	}
	if len(got) != 2 || got[30] != 10 || got[20] != 20 {
		t.Errorf("lag → removed %v, want 30 → 10 (a, out at 10 before its death does not count) and 20 → 20", got)
	}
	rm = newRemovals(1)
	rm.asked("c", at(0))
	rm.died("c", at(5))
	if rm.see(at(3), none) || !rm.see(at(9), none) {
		t.Error("after its death's time: an assignment before it counted, or one after did not")
	}
}
