package scale

import (
	"testing"
	"time"
)

// TestAlignedIngestCountsBySentAt: the aligned ingest counts the heartbeats
// the cells numbered between the two views' marks over what the marks'
// sent_at span should hold, so the read lag at either end does not enter;
// refused heartbeats are taken off, and a cell that restarted in between
// (or is missing from a view) is left out.
func TestAlignedIngestCountsBySentAt(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 18, 0, 0, 0, time.UTC)
	const interval = 500 * time.Millisecond
	a := snapshot{marks: map[string]heartbeatMark{
		"a": {"i1", 10, t0},
		"b": {"i1", 7, t0.Add(300 * time.Millisecond)},
		"c": {"i1", 90, t0}, // restarts in between
		"d": {"i1", 5, t0},  // gone at the end
	}}
	b := snapshot{marks: map[string]heartbeatMark{
		"a": {"i1", 50, t0.Add(20 * time.Second)},                      // 40 over 20 s: all of them
		"b": {"i1", 45, t0.Add(300*time.Millisecond + 19*time.Second)}, // 38 over 19 s: all of them
		"c": {"i2", 3, t0.Add(20 * time.Second)},
		"e": {"i1", 9, t0.Add(20 * time.Second)}, // new at the end
	}}
	got := alignedIngest(a, b, interval)
	if got == nil || *got != 1 {
		t.Fatalf("aligned ingest %v, want 1 (every heartbeat numbered in the span)", got)
	}
	b.rejected = 7.8 // 10 % of the 78 numbered
	if got := alignedIngest(a, b, interval); got == nil || *got < 0.8999 || *got > 0.9001 {
		t.Fatalf("aligned ingest with 7.8 refused = %v, want 0.9", got)
	}
	// A cell whose sender skipped heartbeats numbers fewer over its span.
	b.rejected = 0
	b.marks["a"] = heartbeatMark{"i1", 30, t0.Add(20 * time.Second)} // 20 of 40
	if got := alignedIngest(a, b, interval); got == nil || *got < 58.0/78-1e-9 || *got > 58.0/78+1e-9 {
		t.Fatalf("aligned ingest with a sender that skipped = %v, want %v", got, 58.0/78)
	}
	if got := alignedIngest(snapshot{}, b, interval); got != nil {
		t.Fatalf("aligned ingest with no marks at the start = %v, want nil", *got)
	}
}
