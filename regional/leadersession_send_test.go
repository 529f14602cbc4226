package regional

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/internal/eventually"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// sentSummaries is a Sync client stream that records what is sent.
type sentSummaries struct {
	grpc.ClientStream
	mu   sync.Mutex
	seqs []uint64
}

func (s *sentSummaries) Send(sm *isobarpb.RegionSummary) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seqs = append(s.seqs, sm.GetSequence())
	return nil
}

func (s *sentSummaries) Recv() (*isobarpb.RoutingPlan, error) { return nil, context.Canceled }

func (s *sentSummaries) sent() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint64(nil), s.seqs...)
}

// countedLatest hands out its summary and counts the calls: the sender
// asks once per tick, after the previous tick's send.
type countedLatest struct {
	p     atomic.Pointer[isobarpb.RegionSummary]
	calls atomic.Int64
}

func (f *countedLatest) Latest() *isobarpb.RegionSummary {
	p := f.p.Load()
	f.calls.Add(1)
	return p
}

// A tick that finds no new summary sends nothing: the leader would refuse
// the same summary again as stale.
func TestLeaderSessionSendsEachSummaryOnce(t *testing.T) {
	clock := clockwork.NewFakeClock()
	latest := &countedLatest{}
	latest.p.Store(&isobarpb.RegionSummary{Region: "r1", Sequence: 1})
	l := &leaderSession{cfg: GlobalConfig{SummaryInterval: time.Second}, latest: latest, clock: clock}
	stream := &sentSummaries{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); l.send(ctx, stream, make(chan error, 1)) }()
	defer func() { cancel(); <-done }()
	eventually.True(t, 10*time.Second, "the first send", func() bool { return len(stream.sent()) == 1 })
	// A tick with the same summary: the sender has read it once more
	// (and, before the fix, sent it again) before the next one is built.
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	eventually.True(t, 10*time.Second, "the second tick", func() bool { return latest.calls.Load() >= 2 })
	latest.p.Store(&isobarpb.RegionSummary{Region: "r1", Sequence: 2})
	clock.Advance(time.Second)
	eventually.True(t, 10*time.Second, "a second send", func() bool { return len(stream.sent()) >= 2 })
	if got := stream.sent(); got[1] != 2 {
		t.Fatalf("sent sequences %v, want [1 2]: the same summary went twice", got)
	}
}
