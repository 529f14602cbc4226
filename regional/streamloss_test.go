package regional

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	dto "github.com/prometheus/client_model/go"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// A stream loss can overtake the heartbeat it names (it has its own
// lane): it is held until that heartbeat is applied and then makes the
// cell suspect, kept through earlier heartbeats of the same incarnation,
// and dropped by a later heartbeat, another incarnation or the TTL.
func TestStreamLossOvertakingItsHeartbeat(t *testing.T) {
	r, clk := bareRegistry(t, slog.DiscardHandler)
	const ready = isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	beat := func(id string, seq uint64) bool {
		return r.applyHeartbeat(clk.Now(), heartbeat(id, "127.0.0.1:"+map[string]string{"a": "1001", "b": "1002", "c": "1003", "d": "1004"}[id], ready, seq))
	}
	lose := func(id, inc string, seq uint64) bool {
		return r.applyStreamLoss(clk.Now(), &streamLoss{id: id, incarnation: inc, sequence: seq})
	}
	suspect := func(id string) bool { return r.cells[id] != nil && r.cells[id].suspect }

	// A cell not known yet: its first heartbeat is still queued.
	if lose("a", "i1", 1) || suspect("a") {
		t.Fatal("a loss applied before its heartbeat")
	}
	if !beat("a", 1) || !suspect("a") {
		t.Fatalf("the named heartbeat applied: urgent and suspect wanted (suspect %v)", suspect("a"))
	}
	if len(r.heldLosses) != 0 {
		t.Fatalf("held after it was applied: %v", r.heldLosses)
	}

	// A known cell whose last heartbeats are queued: kept through the
	// earlier one, applied with the named one.
	beat("b", 1)
	if lose("b", "i1", 3) || suspect("b") {
		t.Fatal("a loss naming heartbeat 3 applied at heartbeat 1")
	}
	if beat("b", 2); suspect("b") {
		t.Fatal("applied at heartbeat 2")
	}
	if !beat("b", 3) || !suspect("b") {
		t.Fatal("not applied with heartbeat 3")
	}

	// A later heartbeat (the agent reconnected and sent on) drops it.
	beat("c", 1)
	lose("c", "i1", 2)
	if beat("c", 3); suspect("c") || len(r.heldLosses) != 0 {
		t.Fatalf("a loss passed by a later heartbeat: suspect %v, held %v", suspect("c"), r.heldLosses)
	}
	// So does another incarnation's heartbeat.
	lose("c", "old", 9)
	if beat("c", 4); suspect("c") || len(r.heldLosses) != 0 {
		t.Fatalf("another incarnation's loss: suspect %v, held %v", suspect("c"), r.heldLosses)
	}
	// A loss for a heartbeat already passed is stale: not held.
	if lose("c", "i1", 3) || len(r.heldLosses) != 0 {
		t.Fatal("a stale loss held or applied")
	}

	// The TTL drops one whose heartbeat never comes.
	lose("d", "i1", 1)
	clk.Advance(r.cfg.TTL())
	r.sweep(clk.Now())
	if len(r.heldLosses) != 0 {
		t.Fatalf("held past the TTL: %v", r.heldLosses)
	}
}

// orderLog records the messages a registry logs, in order.
type orderLog struct{ msgs chan string }

func (h orderLog) Enabled(context.Context, slog.Level) bool { return true }
func (h orderLog) Handle(_ context.Context, r slog.Record) error {
	h.msgs <- r.Message
	return nil
}
func (h orderLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h orderLog) WithGroup(string) slog.Handler      { return h }

// A stream loss goes before the heartbeats queued ahead of it: with 200
// new cells' heartbeats in the inbox when the loop starts, the loss of a
// known cell is applied after at most one of them (the loop's first
// receive may take either lane), not after all 200 as in one queue.
func TestStreamLossGoesBeforeQueuedHeartbeats(t *testing.T) {
	const queued = 200
	log := orderLog{msgs: make(chan string, 4*queued)}
	r, clk := bareRegistry(t, log)
	const ready = isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	r.applyHeartbeat(clk.Now(), heartbeat("a", "127.0.0.1:1001", ready, 1)) // the loop is not running yet
	for i := range queued {
		if err := r.Submit(heartbeat(fmt.Sprintf("n%03d", i), fmt.Sprintf("10.0.0.1:%d", 2000+i), ready, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.StreamLost(t.Context(), "a", "i1", 1); err != nil {
		t.Fatal(err)
	}
	for len(log.msgs) > 0 { // a's own registration
		<-log.msgs
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	ahead, changes := 0, 0
	lost := false
	deadline := time.After(time.Minute) // a bound, not a timing: the loop is stuck if it passes
	for !lost || changes < queued {
		select {
		case msg := <-log.msgs:
			switch {
			case strings.HasPrefix(msg, "heartbeat stream broke"):
				lost, ahead = true, changes
			case msg == "cell state changed":
				changes++
			}
		case <-deadline:
			t.Fatalf("after a minute: loss applied %v, %d of %d cells registered", lost, changes, queued)
		}
	}
	if ahead > 1 {
		t.Errorf("the loss was applied after %d of the %d heartbeats queued before it; want at most 1", ahead, queued)
	}
}

// bareRegistry is a registry on a fake clock whose loop is not started:
// a test applies messages itself (apply, applyHeartbeat) or starts it.
func bareRegistry(t *testing.T, h slog.Handler) (*Registry, *clockwork.FakeClock) {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := clockwork.NewFakeClock()
	r, err := newRegistry(DefaultConfig("r1"), clk, slog.New(h), m, newRecordingPusher().push)
	if err != nil {
		t.Fatal(err)
	}
	r.auditAll = true
	return r, clk
}

// The loss's time from its report to the cell made suspect is measured,
// its hold for the heartbeat it names included
// (isobar_regional_stream_loss_seconds); a loss that changes nothing is
// not counted.
func TestStreamLossTimedFromItsReport(t *testing.T) {
	r, clk := bareRegistry(t, slog.DiscardHandler)
	const ready = isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	reported := clk.Now()
	if r.applyStreamLoss(clk.Now(), &streamLoss{id: "a", incarnation: "i1", sequence: 1, reported: reported}) {
		t.Fatal("applied before its heartbeat")
	}
	clk.Advance(40 * time.Millisecond) // the named heartbeat was queued this long
	if !r.applyHeartbeat(clk.Now(), heartbeat("a", "127.0.0.1:1001", ready, 1)) {
		t.Fatal("the named heartbeat did not apply the loss")
	}
	// The same loss again (the cell is suspect already) changes nothing.
	r.applyStreamLoss(clk.Now(), &streamLoss{id: "a", incarnation: "i1", sequence: 1, reported: reported})
	var m dto.Metric
	if err := r.metrics.streamLoss.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetHistogram().GetSampleCount(); got != 1 {
		t.Fatalf("samples = %d, want 1", got)
	}
	if got := m.GetHistogram().GetSampleSum(); math.Abs(got-0.040) > 1e-9 {
		t.Fatalf("sum = %v s, want 0.040 (report to suspect, the hold included)", got)
	}
}
