package election

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const testPrefix = "/t/election/"

func TestTwoCandidatesOneLeads(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	regA := prometheus.NewRegistry()
	a := newCand(t, cli, Config{Prefix: testPrefix, ID: "a"}, regA)
	b := newCand(t, cli, Config{Prefix: testPrefix, ID: "b"}, nil)
	ctx := ctxT(t, 20*time.Second)

	obsCtx, stopObs := context.WithCancel(ctx)
	obs := Observe(obsCtx, cli, testPrefix)
	if got := recv(t, obs, 5*time.Second, "first observation"); got.Elected() {
		t.Fatalf("before any campaign Observe = %+v, want no leader", got)
	}
	if _, _, err := Leader(ctx, cli, testPrefix); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Leader before any campaign: err = %v, want ErrNoLeader", err)
	}

	la, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	if la.ID != "a" || !strings.HasPrefix(la.Key, testPrefix) || la.Epoch <= 0 {
		t.Fatalf("leadership = %+v", la)
	}
	if got := recv(t, obs, 5*time.Second, "leader a observed"); got != (LeaderInfo{ID: "a", Epoch: la.Epoch}) {
		t.Fatalf("Observe = %+v, want a@%d", got, la.Epoch)
	}
	if _, err := a.Campaign(ctx); !errors.Is(err, ErrBusy) {
		t.Fatalf("second Campaign while leading: err = %v, want ErrBusy", err)
	}

	bres := campaignAsync(t, ctx, b)
	eventually(t, 5*time.Second, "b's key under the prefix", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 2 })
	select {
	case r := <-bres:
		t.Fatalf("b's Campaign returned while a leads: %+v", r)
	default:
	}
	id, epoch, err := Leader(ctx, cli, testPrefix)
	if err != nil || id != "a" || epoch != la.Epoch {
		t.Fatalf("Leader = %q, %d, %v; want a, %d", id, epoch, err, la.Epoch)
	}
	if v := testutil.ToFloat64(a.m.isLeader); v != 1 {
		t.Fatalf("is_leader = %v, want 1", v)
	}

	// Planned hand-off: b leads once a resigns (how long it took is logged;
	// it is a figure for the drills, not a bound a loaded machine keeps).
	clk := clockwork.NewRealClock()
	t0 := clk.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	r := recv(t, bres, 30*time.Second, "b elected after a resigned")
	took := clk.Since(t0)
	t.Logf("resign hand-off: standby leads %v after Resign was called", took)
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	if !isClosed(la.Done) {
		t.Error("a's Done still open after Resign returned")
	}
	if r.l.Epoch <= la.Epoch {
		t.Errorf("epochs %d then %d: want strictly increasing", la.Epoch, r.l.Epoch)
	}
	if got := recv(t, obs, 5*time.Second, "leader b observed"); got != (LeaderInfo{ID: "b", Epoch: r.l.Epoch}) {
		t.Fatalf("Observe = %+v, want b@%d", got, r.l.Epoch)
	}
	if v := testutil.ToFloat64(a.m.isLeader); v != 0 {
		t.Errorf("a's is_leader = %v after resigning, want 0", v)
	}
	if v := testutil.ToFloat64(a.m.terms); v != 1 {
		t.Errorf("a's terms_total = %v, want 1", v)
	}

	// The last leader resigns: observers see "no leader".
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("b.Resign: %v", err)
	}
	if got := recv(t, obs, 5*time.Second, "no leader observed"); got.Elected() {
		t.Fatalf("Observe = %+v after everyone resigned, want no leader", got)
	}
	if ks := prefixKeys(t, cli, testPrefix); len(ks) != 0 {
		t.Fatalf("keys left after both resigned: %v", ks)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("Resign without a term: %v, want nil", err)
	}
	stopObs()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for range obs {
		}
	}()
	closedWithin(t, closed, 5*time.Second, "Observe's channel to close after its ctx ended")
	if problems, err := testutil.GatherAndLint(regA); err != nil || len(problems) != 0 {
		t.Fatalf("metric lint: %v %v", problems, err)
	}
}

// A killed leader (its client gone, no revoke) is replaced once its lease
// expires. The takeover time is logged, not bounded.
func TestKilledLeaderReplacedWithinTTL(t *testing.T) {
	e := startEtcd(t)
	cliA := newClient(t, e)
	cliB := newClient(t, e)
	const ttl = time.Second
	a := newCand(t, cliA, Config{Prefix: testPrefix, ID: "a", TTL: ttl}, nil)
	b := newCand(t, cliB, Config{Prefix: testPrefix, ID: "b", TTL: ttl}, nil)
	ctx := ctxT(t, 60*time.Second)

	la, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	bres := campaignAsync(t, ctx, b)
	eventually(t, 5*time.Second, "b waiting", func() bool { return len(prefixKeys(t, cliB, testPrefix)) == 2 })

	clk := clockwork.NewRealClock()
	t0 := clk.Now()
	if err := cliA.Close(); err != nil { // the process dies: no revoke, no resign
		t.Fatalf("close a's client: %v", err)
	}
	r := recv(t, bres, 30*time.Second, "b elected after a was killed")
	took := clk.Since(t0)
	t.Logf("killed leader: standby leads %v after the kill (TTL %v)", took, ttl)
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	if r.l.Epoch <= la.Epoch {
		t.Errorf("epochs %d then %d: want strictly increasing", la.Epoch, r.l.Epoch)
	}
	closedWithin(t, la.Done, 2*time.Second, "the killed leader's Done")
	if err := FencedPut(ctx, cliB, la, "/t/plan", "stale"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("FencedPut by the killed leader: %v, want ErrNotLeader", err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("b.Resign: %v", err)
	}
}

func TestFencing(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	reg := prometheus.NewRegistry()
	a := newCand(t, cli, Config{Prefix: testPrefix, ID: "a"}, reg)
	b := newCand(t, cli, Config{Prefix: testPrefix, ID: "b"}, nil)
	ctx := ctxT(t, 20*time.Second)
	const plan = "/t/plan"
	get := func() string {
		t.Helper()
		resp, err := cli.Get(ctx, plan)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}

	la, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	if err := FencedPut(ctx, cli, la, plan, "a1"); err != nil {
		t.Fatalf("leader's FencedPut: %v", err)
	}
	if got := get(); got != "a1" {
		t.Fatalf("plan = %q, want a1", got)
	}
	if err := FencedPut(ctx, cli, la, testPrefix+"sneaky", "x"); !errors.Is(err, ErrKeyInPrefix) {
		t.Fatalf("FencedPut into the election prefix: %v, want ErrKeyInPrefix", err)
	}
	if _, err := FencedTxn(ctx, cli, la, nil, []clientv3.Op{clientv3.OpDelete("/t/", clientv3.WithPrefix())}, nil); !errors.Is(err, ErrKeyInPrefix) {
		t.Fatalf("FencedTxn deleting a range over the prefix: %v, want ErrKeyInPrefix", err)
	}
	if len(prefixKeys(t, cli, testPrefix)) != 1 {
		t.Fatal("the election key was touched")
	}

	// The caller's own comparison fails while a leads: ErrCompareFailed,
	// and the else ops ran.
	resp, err := FencedTxn(ctx, cli, la,
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(plan), "=", "other")},
		[]clientv3.Op{clientv3.OpPut(plan, "never")},
		[]clientv3.Op{clientv3.OpGet(plan)})
	if !errors.Is(err, ErrCompareFailed) {
		t.Fatalf("FencedTxn with a failing cmp: %v, want ErrCompareFailed", err)
	}
	if len(resp.Responses) != 1 || string(resp.Responses[0].GetResponseRange().Kvs[0].Value) != "a1" {
		t.Fatalf("else responses = %v, want the caller's one Get", resp.Responses)
	}

	bres := campaignAsync(t, ctx, b)
	eventually(t, 5*time.Second, "b waiting", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 2 })
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	r := recv(t, bres, 5*time.Second, "b elected")
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	lb := r.l

	// The deposed leader is refused, locally (its Done is closed) ...
	if err := FencedPut(ctx, cli, la, plan, "a-stale"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed FencedPut: %v, want ErrNotLeader", err)
	}
	// ... and by etcd, for a writer that has not noticed yet (its Done
	// still open: the race the fence exists for).
	unaware := *la
	unaware.Done = make(chan struct{})
	resp, err = FencedTxn(ctx, cli, &unaware, nil, []clientv3.Op{clientv3.OpPut(plan, "a-racing")}, nil)
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("racing deposed FencedTxn: %v, want ErrNotLeader", err)
	}
	if resp == nil || resp.Succeeded || len(resp.Responses) != 0 {
		t.Fatalf("refused txn response = %+v", resp)
	}
	if got := get(); got != "a1" {
		t.Fatalf("plan = %q after refused writes, want a1", got)
	}
	if v := testutil.ToFloat64(a.m.fencedRefused); v != 2 {
		t.Errorf("fenced_writes_refused_total = %v, want 2", v)
	}
	if err := FencedPut(ctx, cli, lb, plan, "b1"); err != nil {
		t.Fatalf("new leader's FencedPut: %v", err)
	}
	if got := get(); got != "b1" {
		t.Fatalf("plan = %q, want b1", got)
	}

	// A third term (a again): epochs strictly increase.
	ares := campaignAsync(t, ctx, a)
	eventually(t, 5*time.Second, "a waiting", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 2 })
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("b.Resign: %v", err)
	}
	r = recv(t, ares, 5*time.Second, "a elected again")
	if r.err != nil {
		t.Fatalf("a.Campaign: %v", r.err)
	}
	epochs := []int64{la.Epoch, lb.Epoch, r.l.Epoch}
	if !slices.IsSorted(epochs) || epochs[0] == epochs[1] || epochs[1] == epochs[2] {
		t.Fatalf("epochs %v: want strictly increasing", epochs)
	}
	if err := FencedPut(ctx, cli, lb, plan, "b-stale"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("b's stale FencedPut: %v", err)
	}
	if err := FencedPut(ctx, cli, r.l, plan, "a2"); err != nil || get() != "a2" {
		t.Fatalf("a's second-term FencedPut: %v (plan %q)", err, get())
	}
	if v := testutil.ToFloat64(a.m.terms); v != 2 {
		t.Errorf("a's terms_total = %v, want 2", v)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// Depose (operators, drills) deletes the leader's key; the leader notices
// through its key watch, even though its session is healthy.
func TestDeposeEndsTerm(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	a := newCand(t, cli, Config{Prefix: testPrefix, ID: "a"}, nil)
	b := newCand(t, cli, Config{Prefix: testPrefix, ID: "b"}, nil)
	ctx := ctxT(t, 20*time.Second)
	if _, err := Depose(ctx, cli, testPrefix); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Depose with nobody leading: %v", err)
	}
	la, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bres := campaignAsync(t, ctx, b)
	eventually(t, 5*time.Second, "b waiting", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 2 })
	got, err := Depose(ctx, cli, strings.TrimSuffix(testPrefix, "/"))
	if err != nil || got != (LeaderInfo{ID: "a", Epoch: la.Epoch}) {
		t.Fatalf("Depose = %+v, %v", got, err)
	}
	closedWithin(t, la.Done, 5*time.Second, "deposed leader's Done")
	r := recv(t, bres, 5*time.Second, "b elected")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := FencedPut(ctx, cli, la, "/t/plan", "x"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed FencedPut: %v", err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// a's monitor revoked its lease after noticing: nothing is left.
	eventually(t, 5*time.Second, "empty prefix", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 0 })
}

// Campaign's ctx bounds the term too; cancelling it ends the term and the
// key goes at once.
func TestCampaignContextEndsTerm(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	a := newCand(t, cli, Config{Prefix: testPrefix, ID: "a"}, nil)
	b := newCand(t, cli, Config{Prefix: testPrefix, ID: "b"}, nil)
	ctx, cancel := context.WithCancel(ctxT(t, 20*time.Second))
	la, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// b's campaign is cancelled while waiting: its key goes with it.
	bctx, bcancel := context.WithCancel(ctx)
	bres := campaignAsync(t, bctx, b)
	eventually(t, 5*time.Second, "b waiting", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 2 })
	bcancel()
	r := recv(t, bres, 5*time.Second, "b's cancelled campaign")
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Campaign: %v, want context.Canceled", r.err)
	}
	if ks := prefixKeys(t, cli, testPrefix); len(ks) != 1 || ks[0] != la.Key {
		t.Fatalf("keys after b's cancelled campaign: %v, want only %s", ks, la.Key)
	}
	if v := testutil.ToFloat64(b.m.campaignFailures); v != 0 {
		t.Errorf("campaign_failures_total = %v after a cancellation, want 0", v)
	}
	cancel()
	closedWithin(t, la.Done, 5*time.Second, "Done after Campaign's ctx ended")
	eventually(t, 5*time.Second, "key gone", func() bool { return len(prefixKeys(t, cli, testPrefix)) == 0 })
	if err := a.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
}
