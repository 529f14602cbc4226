package election

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	poll "github.com/isobar-mesh/isobar/internal/eventually"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger logs through t.Log until the test ends, then drops lines (etcd
// and grpc goroutines may log while shutting down after the test).
func testLogger(t *testing.T) *slog.Logger {
	h := &tHandler{t: t, mu: new(sync.Mutex), done: new(atomic.Bool)}
	t.Cleanup(func() { h.done.Store(true) })
	return slog.New(h)
}

type tHandler struct {
	t     *testing.T
	mu    *sync.Mutex
	done  *atomic.Bool
	attrs []slog.Attr
}

func (h *tHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *tHandler) Handle(_ context.Context, r slog.Record) error {
	if h.done.Load() {
		return nil
	}
	line := r.Level.String() + " " + r.Message
	for _, a := range h.attrs {
		line += " " + a.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done.Load() {
		h.t.Log(line)
	}
	return nil
}

func (h *tHandler) WithAttrs(as []slog.Attr) slog.Handler {
	cp := *h
	cp.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &cp
}

func (h *tHandler) WithGroup(string) slog.Handler { return h }

// startEtcd starts an embedded member on free loopback ports in a temp dir
// and stops it when the test ends.
func startEtcd(t *testing.T) *Embedded {
	t.Helper()
	return startEtcdWith(t, EmbeddedConfig{Dir: t.TempDir()})
}

func startEtcdWith(t *testing.T, cfg EmbeddedConfig) *Embedded {
	t.Helper()
	cfg.UnsafeNoFsync = true
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Cleanup(e.Stop)
	return e
}

func newClient(t *testing.T, e *Embedded) *clientv3.Client {
	t.Helper()
	cli, err := e.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func newCand(t *testing.T, cli *clientv3.Client, cfg Config, reg prometheus.Registerer) *Candidate {
	t.Helper()
	if cfg.TTL == 0 {
		cfg.TTL = time.Second
	}
	c, err := NewCandidate(cli, cfg, Deps{Logger: testLogger(t).With("who", cfg.ID), Registerer: reg})
	if err != nil {
		t.Fatalf("NewCandidate: %v", err)
	}
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or timeout passes (an upper bound,
// not a synchronisation delay), through the module's one poll helper.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.True(t, timeout, what, cond)
}

// recv waits for a value on ch, failing the test after timeout.
func recv[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	tm := clockwork.NewRealClock().NewTimer(timeout)
	defer tm.Stop()
	select {
	case v := <-ch:
		return v
	case <-tm.Chan():
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
		panic("unreachable")
	}
}

func closedWithin(t *testing.T, ch <-chan struct{}, timeout time.Duration, what string) {
	t.Helper()
	recv(t, ch, timeout, what)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// prefixKeys lists the keys under prefix.
func prefixKeys(t *testing.T, cli *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := cli.Get(ctxT(t, 5*time.Second), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("get %s: %v", prefix, err)
	}
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

type campaignResult struct {
	l   *Leadership
	err error
}

// campaignAsync campaigns in a goroutine joined at test end.
func campaignAsync(t *testing.T, ctx context.Context, c *Candidate) <-chan campaignResult {
	t.Helper()
	out := make(chan campaignResult, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		l, err := c.Campaign(ctx)
		out <- campaignResult{l, err}
	})
	t.Cleanup(wg.Wait)
	return out
}
