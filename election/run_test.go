package election

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// runner runs a Candidate's Run loop and records its terms.
type runner struct {
	c      *Candidate
	terms  chan *Leadership
	cancel context.CancelFunc
	done   chan error
}

// startRun runs c.Run with a lead that reports each term and holds it
// until its ctx ends; active counts leads running at once across runners.
func startRun(t *testing.T, c *Candidate, active *atomic.Int32, overlap *atomic.Bool) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{c: c, terms: make(chan *Leadership, 16), cancel: cancel, done: make(chan error, 1)}
	var wg sync.WaitGroup
	wg.Go(func() {
		r.done <- c.Run(ctx, func(ctx context.Context, l *Leadership) error {
			if active.Add(1) > 1 {
				overlap.Store(true)
			}
			defer active.Add(-1)
			r.terms <- l
			<-ctx.Done()
			return nil
		})
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

func TestRunHandsOverOnShutdown(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := newCand(t, cli, Config{Prefix: testPrefix, ID: "a"}, regA)
	b := newCand(t, cli, Config{Prefix: testPrefix, ID: "b"}, regB)
	var active atomic.Int32
	var overlap atomic.Bool

	ra := startRun(t, a, &active, &overlap)
	la := recv(t, ra.terms, 5*time.Second, "a's first term")
	rb := startRun(t, b, &active, &overlap)
	eventually(t, 5*time.Second, "b waiting and observing a", func() bool {
		info, ok := b.KnownLeader()
		return ok && info.ID == "a" && len(prefixKeys(t, cli, testPrefix)) == 2
	})
	if err := a.Run(context.Background(), func(context.Context, *Leadership) error { return nil }); !errors.Is(err, ErrBusy) {
		t.Fatalf("second Run: %v, want ErrBusy", err)
	}

	// a shuts down: its Run ends the term (lead returns first), revokes,
	// and b takes over.
	clk := clockwork.NewRealClock()
	t0 := clk.Now()
	ra.cancel()
	if err := recv(t, ra.done, 5*time.Second, "a's Run to return"); err != nil {
		t.Fatalf("a.Run = %v, want nil on ctx end", err)
	}
	if !isClosed(la.Done) {
		t.Fatal("a's Run returned with its term open")
	}
	lb := recv(t, rb.terms, 5*time.Second, "b's term")
	t.Logf("shutdown hand-off: standby leads %v after the leader's ctx was cancelled", clk.Since(t0))
	if lb.Epoch <= la.Epoch {
		t.Fatalf("epochs %d then %d", la.Epoch, lb.Epoch)
	}
	eventually(t, 5*time.Second, "b knows it leads", func() bool {
		info, _ := b.KnownLeader()
		return info == LeaderInfo{ID: "b", Epoch: lb.Epoch}
	})
	if v := testutil.ToFloat64(b.m.leaderChanges); v != 1 {
		t.Errorf("b's leader_changes_total = %v, want 1 (a -> b)", v)
	}
	if v := testutil.ToFloat64(b.m.isLeader); v != 1 {
		t.Errorf("b's is_leader = %v", v)
	}
	if v := testutil.ToFloat64(a.m.isLeader); v != 0 {
		t.Errorf("a's is_leader = %v after shutdown", v)
	}

	// A lead that steps down (returns while leading) gets a fresh term
	// with a fresh session; with no rival it wins again.
	if err := b.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	lb2 := recv(t, rb.terms, 5*time.Second, "b's second term")
	if lb2.Epoch <= lb.Epoch || lb2.Key == lb.Key {
		t.Fatalf("second term %+v reuses the first %+v", lb2, lb)
	}
	rb.cancel()
	if err := recv(t, rb.done, 5*time.Second, "b's Run to return"); err != nil {
		t.Fatalf("b.Run = %v", err)
	}
	if overlap.Load() {
		t.Error("two leads ran at once")
	}
	if ks := prefixKeys(t, cli, testPrefix); len(ks) != 0 {
		t.Fatalf("keys left after both Runs returned: %v", ks)
	}
}

// A lead that fails at once must not make Run spin: terms are spaced by
// the back-off on the injected clock.
func TestRunBacksOffFailingLead(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	clk := clockwork.NewFakeClock()
	c, err := NewCandidate(cli, Config{Prefix: testPrefix, ID: "a", TTL: time.Second},
		Deps{Logger: testLogger(t), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	called := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(context.Context, *Leadership) error {
			calls.Add(1)
			called <- struct{}{}
			return errors.New("boom")
		})
	}()
	recv(t, called, 5*time.Second, "first lead")
	// Run now waits on the fake clock (back-off and observer timers).
	if err := clk.BlockUntilContext(ctxT(t, 5*time.Second), 1); err != nil {
		t.Fatalf("Run is not waiting on its back-off: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("lead called %d times before the back-off elapsed, want 1", n)
	}
	clk.Advance(defaultMaxBackoff)
	recv(t, called, 5*time.Second, "second lead after the back-off")
	cancel()
	if err := recv(t, done, 5*time.Second, "Run to return"); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("lead called %d times, want 2", calls.Load())
	}
}

func TestRunReturnsWhenClientClosed(t *testing.T) {
	e := startEtcd(t)
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	c := newCand(t, cli, Config{Prefix: testPrefix, ID: "a"}, nil)
	if err := c.Run(context.Background(), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Run(nil lead) = %v", err)
	}
	terms := make(chan *Leadership, 1)
	done := make(chan error, 1)
	go func() {
		done <- c.Run(context.Background(), func(ctx context.Context, l *Leadership) error {
			terms <- l
			<-ctx.Done()
			return nil
		})
	}()
	l := recv(t, terms, 5*time.Second, "term")
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, l.Done, 5*time.Second, "Done after the client closed")
	if err := recv(t, done, 5*time.Second, "Run to return"); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("Run = %v, want ErrClientClosed", err)
	}
}

// etcd goes away while a candidate leads: its term ends (within about
// TTL + 1 s on a quiet machine, logged), Run neither crashes nor spins, and once etcd is back on the
// same data and addresses the candidate leads again with a larger epoch.
func TestEtcdOutage(t *testing.T) {
	e := startEtcd(t)
	cfg := e.Config()
	cli := newClient(t, e)
	const ttl = time.Second
	reg := prometheus.NewRegistry()
	c := newCand(t, cli, Config{Prefix: testPrefix, ID: "a", TTL: ttl}, reg)
	var active atomic.Int32
	var overlap atomic.Bool
	r := startRun(t, c, &active, &overlap)
	l1 := recv(t, r.terms, 5*time.Second, "first term")

	clk := clockwork.NewRealClock()
	t0 := clk.Now()
	e.Stop()
	stopped := clk.Since(t0)
	closedWithin(t, l1.Done, ttl+30*time.Second, "Done while etcd is down") // a bound, not a timing: the figure is logged below
	lost := clk.Since(t0)
	// Expected: the client's lease deadline (TTL after the last keep-alive
	// answer) plus its once-a-second deadline check. That is a timing, so
	// it is logged, not asserted: under the race detector on a busy 2-core
	// machine it was 6 s once (CI, 2026-12-06). The bound above catches a
	// term that never ends; the drills time the failover.
	t.Logf("etcd down: stop took %v; term ended %v after the stop began (TTL %v, expected about TTL + 1 s)", stopped, lost, ttl)
	if err := FencedPut(ctxT(t, time.Second), cli, l1, "/t/plan", "x"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("FencedPut after the term ended: %v", err)
	}
	// Wait until the loop is back to campaigning (the term's cleanup, which
	// cannot reach etcd, is bounded by TTL), so the outage spans it.
	eventually(t, ttl+5*time.Second, "term cleanup", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.term == nil
	})

	ctx := ctxT(t, 30*time.Second)
	t1 := clk.Now()
	e2, err := StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatalf("restart etcd on %s: %v", cfg.ClientAddr, err)
	}
	t.Cleanup(e2.Stop)
	if got := e2.Endpoints(); got[0] != e.Endpoints()[0] {
		t.Fatalf("restarted on %v, was %v", got, e.Endpoints())
	}
	l2 := recv(t, r.terms, 20*time.Second, "term after etcd came back")
	t.Logf("etcd back: leading again %v after the restart began (outage %v); epochs %d -> %d",
		clk.Since(t1), clk.Since(t0), l1.Epoch, l2.Epoch)
	if l2.Epoch <= l1.Epoch {
		t.Fatalf("epoch %d after the outage, was %d: the data did not survive the restart", l2.Epoch, l1.Epoch)
	}
	failures := testutil.ToFloat64(c.m.campaignFailures)
	t.Logf("campaign failures during the outage: %v", failures)
	if failures > 5 {
		t.Errorf("campaign_failures_total = %v over a few seconds of outage: Run spins", failures)
	}
	if err := FencedPut(ctx, cli, l2, "/t/plan", "after"); err != nil {
		t.Fatalf("FencedPut in the new term: %v", err)
	}
	r.cancel()
	if err := recv(t, r.done, 5*time.Second, "Run to return"); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if overlap.Load() {
		t.Error("two leads ran at once")
	}
}

// With etcd down, a waiting Campaign still returns when its ctx is
// cancelled (upstream concurrency.Election.Campaign resigns with the
// client's context there and blocks until etcd is back). etcd stays down to
// the end, so returning at all is the property; the time is logged.
func TestCampaignCancelWhileEtcdDown(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	const ttl = time.Second
	if _, err := cli.Put(ctxT(t, 5*time.Second), testPrefix+"0-sitting", "sitting"); err != nil {
		t.Fatal(err)
	}
	c := newCand(t, cli, Config{Prefix: testPrefix, ID: "a", TTL: ttl}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := campaignAsync(t, ctx, c)
	eventually(t, 5*time.Second, "a waiting", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 2 })
	e.Stop()
	clk := clockwork.NewRealClock()
	t0 := clk.Now()
	cancel()
	r := recv(t, res, 30*time.Second, "Campaign to return after cancel with etcd down")
	took := clk.Since(t0)
	t.Logf("cancelled campaign returned %v after cancel with etcd down (cleanup bounded by TTL %v)", took, ttl)
	// etcd's stop may reach the waiting campaign before the cancel does:
	// then it ends with etcd's unavailability, which is as good (the
	// caller retries); anything else is not.
	if !errors.Is(r.err, context.Canceled) && status.Code(r.err) != codes.Unavailable {
		t.Fatalf("Campaign = %v, want context.Canceled (or etcd unavailable, had the stop won the race)", r.err)
	}
}
