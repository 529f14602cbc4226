package regional

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// playReads plays rounds of heartbeats on mr's fake clock: in round k
// every cell of ids sends at start+k×HeartbeatInterval, and the controller
// reads (applies) it delay(id, k) later, or with the one before it when
// that was read later (a stream is read in order; negative: the cell sent
// nothing).
// The registry sweeps every CycleInterval, as its loop does, and after
// each sweep swept(now) runs. It returns the time after the last event.
func playReads(mr *massRegistry, ids []string, rounds int, delay func(id string, k int) time.Duration, swept func(now time.Time)) time.Time {
	mr.t.Helper()
	type event struct {
		at   time.Time
		id   string // "": a sweep
		sent time.Time
		k    int
	}
	cfg := mr.r.cfg
	start := mr.clock.Now()
	var evs []event
	last := map[string]time.Time{} // a stream is read in order
	for k := range rounds {
		sent := start.Add(time.Duration(k) * cfg.HeartbeatInterval)
		for _, id := range ids {
			if d := delay(id, k); d >= 0 {
				at := sent.Add(d)
				if at.Before(last[id]) {
					at = last[id]
				}
				last[id] = at
				evs = append(evs, event{at: at, id: id, sent: sent, k: k})
			}
		}
	}
	end := start.Add(time.Duration(rounds)*cfg.HeartbeatInterval + 3*cfg.TTL())
	for at := start.Add(cfg.CycleInterval); !at.After(end); at = at.Add(cfg.CycleInterval) {
		evs = append(evs, event{at: at})
	}
	// Reads before a sweep at the same instant, as a loop that found them
	// queued would.
	slices.SortStableFunc(evs, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(b.id, a.id)
	})
	for _, ev := range evs {
		mr.clock.Advance(ev.at.Sub(mr.clock.Now()))
		if ev.id == "" {
			mr.r.sweep(ev.at)
			if swept != nil {
				swept(ev.at)
			}
			continue
		}
		var i int
		_, _ = fmt.Sscanf(ev.id, "cell-%d", &i)
		hb := heartbeat(ev.id, fmt.Sprintf("10.0.0.%d:8000", i+1), isobarpb.LifecycleState_LIFECYCLE_STATE_READY, uint64(100+ev.k))
		hb.SentAt = timestamppb.New(ev.sent)
		mr.r.applyHeartbeat(ev.at, hb)
	}
	return mr.clock.Now()
}

// lagRamp: read on time (1 ms of transit) for four rounds, then later by
// 300 ms a round up to 900 ms, where the controller stays behind.
func lagRamp(k int) time.Duration {
	switch {
	case k < 4:
		return time.Millisecond
	case k == 4:
		return 300 * time.Millisecond
	case k == 5:
		return 600 * time.Millisecond
	}
	return 900 * time.Millisecond
}

// TestReadLagWidensTheTTL: a controller falls 900 ms behind reading its
// streams, unevenly: one cell's heartbeats, sent on time, are read 300 ms
// and 1.2 s late in turn (the next with the late one), up to 1.4 s apart
// against a TTL of 1 s. Its read lag
// widens the TTL and no cell is failed; with the allowance off (no mass
// expiry hold, so no cap) the same reads fail that cell.
func TestReadLagWidensTheTTL(t *testing.T) {
	for _, c := range []struct {
		name     string
		hold     time.Duration
		wantFail bool
	}{
		{"read lag allowed", 0, false},
		{"holds off: no allowance", -1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			mr := newMassRegistry(t, 10, MassExpiryConfig{Hold: c.hold})
			delay := func(id string, k int) time.Duration {
				if id == "cell-00" && k >= 6 {
					if k%2 == 0 {
						return 300 * time.Millisecond
					}
					return 1200 * time.Millisecond
				}
				return lagRamp(k)
			}
			var maxLag float64
			playReads(mr, mr.ids(0, 10), 14, delay, func(time.Time) {
				maxLag = max(maxLag, testutil.ToFloat64(mr.r.metrics.ingestLag))
			})
			failed := testutil.ToFloat64(mr.r.metrics.ttlFailures)
			if (failed > 0) != c.wantFail {
				t.Errorf("isobar_regional_ttl_failures_total %v, want failures: %v", failed, c.wantFail)
			}
			// The 90th percentile of the excesses (899 ms for nine cells,
			// 299 ms or 1,199 ms for cell-00).
			if maxLag < 0.85 || maxLag > 0.95 {
				t.Errorf("isobar_regional_ingest_lag_seconds reached %v, want about 0.9", maxLag)
			}
		})
	}
}

// TestReadLagStillFailsSilentCells: while the controller reads 900 ms
// late, a cell that stops sending is failed once its TTL and the read lag
// have passed since its last heartbeat was read, never within the TTL
// alone, and within the TTL and the cap.
func TestReadLagStillFailsSilentCells(t *testing.T) {
	mr := newMassRegistry(t, 10, MassExpiryConfig{})
	var lastRead, failedAt time.Time
	start := mr.clock.Now()
	delay := func(id string, k int) time.Duration {
		if id == "cell-09" && k >= 8 {
			return -1 // silent from round 8
		}
		return lagRamp(k)
	}
	lastRead = start.Add(7*mr.r.cfg.HeartbeatInterval + lagRamp(7))
	playReads(mr, mr.ids(0, 10), 14, delay, func(now time.Time) {
		if failedAt.IsZero() && mr.r.cells["cell-09"].state == lifecycle.Failed {
			failedAt = now
		}
	})
	if failedAt.IsZero() {
		t.Fatal("the silent cell was never failed")
	}
	ttl := mr.r.cfg.TTL()
	if got := failedAt.Sub(lastRead); got < ttl+800*time.Millisecond || got > ttl+time.Second {
		t.Errorf("silent cell failed %v after its last heartbeat was read; want the TTL (%v) and the read lag (~900 ms)", got, ttl)
	}
	if n := testutil.ToFloat64(mr.r.metrics.ttlFailures); n != 1 {
		t.Errorf("isobar_regional_ttl_failures_total %v, want 1 (the silent cell only)", n)
	}
}

// TestReadLagOfFewCellsWidensNothing: one cell in ten whose sent_at
// claims its heartbeats are read seconds late moves nothing (the 90th
// percentile of ten excludes it), and two cells are too few to speak for
// the controller however late both say they are read.
func TestReadLagOfFewCellsWidensNothing(t *testing.T) {
	mr := newMassRegistry(t, 10, MassExpiryConfig{})
	var maxLag float64
	playReads(mr, mr.ids(0, 10), 12, func(id string, k int) time.Duration {
		if id == "cell-00" && k%2 == 1 {
			return 5 * time.Second // read at its time, but its sent_at says 5 s earlier
		}
		return time.Millisecond
	}, func(time.Time) { maxLag = max(maxLag, testutil.ToFloat64(mr.r.metrics.ingestLag)) })
	if maxLag != 0 {
		t.Errorf("one cell in ten moved the read lag to %v s", maxLag)
	}

	two := newMassRegistry(t, 2, MassExpiryConfig{})
	maxLag = 0
	playReads(two, two.ids(0, 2), 14, func(_ string, k int) time.Duration { return lagRamp(k) },
		func(time.Time) { maxLag = max(maxLag, testutil.ToFloat64(two.r.metrics.ingestLag)) })
	if maxLag != 0 {
		t.Errorf("two cells moved the read lag to %v s", maxLag)
	}
}

// TestBaselineDelay: a cell's baseline is its least delay and creeps
// towards a delay that lasts (a clock step), a millisecond a heartbeat; a
// new incarnation (another host's clock) restarts it without an excess;
// a cell offers one excess an interval.
func TestBaselineDelay(t *testing.T) {
	mr := newMassRegistry(t, 1, MassExpiryConfig{})
	c := mr.r.cells["cell-00"]
	note := func(d time.Duration, fresh bool) { // one heartbeat, in an interval of its own
		mr.r.lag.interval++
		c.skew, c.skewKnown = -d, true
		mr.r.noteDelay(c, fresh)
	}
	note(10*time.Millisecond, false)
	note(4*time.Millisecond, false)
	if c.baselineDelay != 4*time.Millisecond || len(mr.r.lag.samples) != 0 {
		t.Fatalf("baseline %v with %d excesses, want the least delay (4ms) and none", c.baselineDelay, len(mr.r.lag.samples))
	}
	for range 3 { // the cell's clock stepped: 50 ms more from now on
		note(54*time.Millisecond, false)
	}
	want := []time.Duration{50 * time.Millisecond, 49 * time.Millisecond, 48 * time.Millisecond}
	if !slices.Equal(mr.r.lag.samples, want) || c.baselineDelay != 7*time.Millisecond {
		t.Errorf("excesses %v, baseline %v; want %v and 7ms", mr.r.lag.samples, c.baselineDelay, want)
	}
	note(5*time.Second, true)
	if c.baselineDelay != 5*time.Second || len(mr.r.lag.samples) != 3 {
		t.Errorf("new incarnation: baseline %v with %d excesses, want 5s and no new one", c.baselineDelay, len(mr.r.lag.samples))
	}
	c.skewKnown = false
	mr.r.lag.interval++
	mr.r.noteDelay(c, false)
	if len(mr.r.lag.samples) != 3 {
		t.Error("a heartbeat without sent_at added an excess")
	}
	c.skewKnown = true // two heartbeats in one interval: one excess
	c.skew = -6 * time.Second
	mr.r.noteDelay(c, false)
	c.skew = -7 * time.Second
	mr.r.noteDelay(c, false)
	if len(mr.r.lag.samples) != 4 || mr.r.lag.samples[3] != time.Second {
		t.Errorf("excesses %v: want one more, the interval's first (1s)", mr.r.lag.samples)
	}
}

// TestTickAppliesTheInboxFirst: heartbeats received before a tick, still in
// the registry's inbox (its loop held up by a long cycle), are applied
// before the tick's sweep judges their cells; with the sweep first they
// were failed (holds off here, so no mass hold hides it).
func TestTickAppliesTheInboxFirst(t *testing.T) {
	mr := newMassRegistry(t, 4, MassExpiryConfig{Hold: -1})
	mr.clock.Advance(mr.r.cfg.HeartbeatInterval)
	mr.seq++
	for i, id := range mr.ids(0, 4) {
		if err := mr.r.Submit(heartbeat(id, fmt.Sprintf("10.0.0.%d:8000", i+1), isobarpb.LifecycleState_LIFECYCLE_STATE_READY, mr.seq)); err != nil {
			t.Fatal(err)
		}
	}
	mr.clock.Advance(mr.r.cfg.TTL()) // the loop comes back a TTL after they were received
	mr.r.tick()
	if n := testutil.ToFloat64(mr.r.metrics.ttlFailures); n != 0 {
		t.Errorf("%v cells failed whose heartbeats were in the inbox", n)
	}
	mr.want("after the tick", 4, 0, 0)
}
