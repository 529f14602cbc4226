package election

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// compactingWatcher fails every watch opened while armed the way a
// compaction does (a cancelled response with ErrCompacted): a campaign
// error that is not the caller's cancellation.
type compactingWatcher struct {
	clientv3.Watcher
	armed atomic.Bool
}

func (w *compactingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	if !w.armed.Load() {
		return w.Watcher.Watch(ctx, key, opts...)
	}
	ch := make(chan clientv3.WatchResponse, 1)
	ch <- clientv3.WatchResponse{Canceled: true, CompactRevision: 1}
	close(ch)
	return ch
}

// Pitfall 1 (etcd issue #21128): a campaign that fails for a reason other
// than ctx must not leave its key behind. The control shows that upstream
// concurrency.Election does leave it in this etcd version.
func TestFailedCampaignLeavesNoKey(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	faulty := newClient(t, e)
	w := &compactingWatcher{Watcher: faulty.Watcher}
	faulty.Watcher = w
	ctx := ctxT(t, 20*time.Second)

	const ours, theirs = "/ours/election/", "/upstream/election/"
	// A sitting leader in each election, so the campaigns have to wait
	// (and so watch).
	for _, p := range []string{ours, theirs} {
		if _, err := cli.Put(ctx, p+"0-sitting", "sitting"); err != nil {
			t.Fatal(err)
		}
	}
	w.armed.Store(true)

	t.Run("upstream leaves the key (control)", func(t *testing.T) {
		s, err := concurrency.NewSession(faulty, concurrency.WithTTL(30))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.Close() }()
		err = concurrency.NewElection(s, "/upstream/election").Campaign(ctx, "x")
		if !errors.Is(err, rpctypes.ErrCompacted) {
			t.Fatalf("upstream Campaign: %v, want ErrCompacted", err)
		}
		if ks := prefixKeys(t, cli, theirs); len(ks) != 2 {
			t.Fatalf("upstream left keys %v; expected its stray key next to the sitting one (pitfall no longer reproduces?)", ks)
		}
	})

	t.Run("Candidate removes it", func(t *testing.T) {
		c := newCand(t, faulty, Config{Prefix: ours, ID: "c", TTL: 30 * time.Second}, nil)
		_, err := c.Campaign(ctx)
		if !errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, ErrSessionLost) {
			t.Fatalf("Campaign: %v, want ErrCompacted (and not a lost session)", err)
		}
		// Checked right after the error, far inside the 30 s lease.
		if ks := prefixKeys(t, cli, ours); !slices.Equal(ks, []string{ours + "0-sitting"}) {
			t.Fatalf("keys after the failed campaign: %v, want only the sitting leader's", ks)
		}
		if v := testutil.ToFloat64(c.m.campaignFailures); v != 1 {
			t.Errorf("campaign_failures_total = %v, want 1", v)
		}
		// The candidate is free to campaign again; with the fault gone and
		// the sitting leader gone, it leads.
		w.armed.Store(false)
		if _, err := cli.Delete(ctx, ours+"0-sitting"); err != nil {
			t.Fatal(err)
		}
		l, err := c.Campaign(ctx)
		if err != nil {
			t.Fatalf("second Campaign: %v", err)
		}
		if err := c.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		closedWithin(t, l.Done, time.Second, "Done after Resign")
	})
}

// Pitfall 2 (etcd PR #10297): ResumeElection does not append "/" to its
// prefix. A resumed election on "/x/election" then reads "/x/election*" and
// can take a sibling election's key for its leader.
func TestResumeElectionPrefix(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := ctxT(t, 20*time.Second)
	const bare = "/x/election"
	// An older key of a sibling election: the first by create revision
	// under the bare string prefix.
	if _, err := cli.Put(ctx, "/x/election-other/0", "impostor"); err != nil {
		t.Fatal(err)
	}
	a := newCand(t, cli, Config{Prefix: bare, ID: "a"}, nil)
	if a.Prefix() != bare+"/" {
		t.Fatalf("Prefix() = %q, want %q", a.Prefix(), bare+"/")
	}
	l, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign with a prefix lacking '/': %v (the sibling's key must not count)", err)
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()

	t.Run("upstream ResumeElection picks the sibling (control)", func(t *testing.T) {
		resp, err := concurrency.ResumeElection(s, bare, l.Key, l.Epoch).Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(resp.Kvs[0].Value); got != "impostor" {
			t.Fatalf("upstream resumed leader = %q; expected the sibling's key (pitfall no longer reproduces?)", got)
		}
	})

	for _, p := range []string{bare, bare + "/"} {
		t.Run("wrappers with "+p, func(t *testing.T) {
			for name, el := range map[string]*concurrency.Election{
				"ResumeElection": ResumeElection(s, p, l.Key, l.Epoch),
				"NewElection":    NewElection(s, p),
			} {
				resp, err := el.Leader(ctx)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				kv := resp.Kvs[0]
				if string(kv.Value) != "a" || string(kv.Key) != l.Key || kv.CreateRevision != l.Epoch {
					t.Fatalf("%s leader = %s=%s@%d, want %s=a@%d", name, kv.Key, kv.Value, kv.CreateRevision, l.Key, l.Epoch)
				}
			}
			id, epoch, err := Leader(ctx, cli, p)
			if err != nil || id != "a" || epoch != l.Epoch {
				t.Fatalf("Leader(%q) = %q, %d, %v", p, id, epoch, err)
			}
		})
	}

	// The resumed election acts on the right key: its Resign deposes a,
	// whose term ends, and the sibling's key is untouched.
	if err := ResumeElection(s, bare, l.Key, l.Epoch).Resign(ctx); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, l.Done, 5*time.Second, "Done after the resumed election resigned")
	if ks := prefixKeys(t, cli, "/x/"); !slices.Equal(ks, []string{"/x/election-other/0"}) {
		t.Fatalf("keys = %v, want only the sibling's", ks)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
