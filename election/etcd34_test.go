package election

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// externalEtcd is an etcd server process started from a binary on PATH
// (Debian's etcd-server 3.4 under make interop), serving clients over TLS
// with client certificates required.
type externalEtcd struct {
	endpoint string
	cmd      *exec.Cmd
	done     chan struct{}
	out      *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func loopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startExternalEtcd starts the etcd binary (ISOBAR_ETCD_BIN, else etcd on
// PATH) of major.minor want, or skips t loudly when there is none.
func startExternalEtcd(t *testing.T, want string, files TLSFiles) *externalEtcd {
	t.Helper()
	bin := os.Getenv("ISOBAR_ETCD_BIN")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("etcd"); err != nil {
			t.Skipf("INTEROP-SKIP: no etcd binary (Debian etcd-server %s; or set ISOBAR_ETCD_BIN)", want)
		}
	}
	v, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	if !strings.Contains(string(v), "etcd Version: "+want+".") {
		t.Skipf("INTEROP-SKIP: %s is not etcd %s: %s", bin, want, strings.SplitN(string(v), "\n", 2)[0])
	}
	t.Logf("external etcd: %s", strings.SplitN(string(v), "\n", 2)[0])
	client, peer := loopbackAddr(t), loopbackAddr(t)
	e := &externalEtcd{endpoint: "https://" + client, done: make(chan struct{}), out: &lockedBuffer{}}
	e.cmd = exec.Command(bin,
		"--name", "isobar-test", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", "https://"+client, "--advertise-client-urls", "https://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "isobar-test=http://"+peer, "--initial-cluster-state", "new",
		"--cert-file", files.CertFile, "--key-file", files.KeyFile, "--trusted-ca-file", files.CAFile, "--client-cert-auth",
		"--unsafe-no-fsync", "--logger", "zap", "--log-outputs", "stderr")
	e.cmd.Stdout, e.cmd.Stderr = e.out, e.out
	if err := e.cmd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	go func() { _ = e.cmd.Wait(); close(e.done) }()
	t.Cleanup(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(10 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.done
		}
		if t.Failed() {
			t.Logf("--- etcd output ---\n%s", e.out.String())
		}
	})
	return e
}

// TestExternalEtcd34: the election against a real etcd 3.4 server, not
// the embedded one the other tests use, with client TLS (certificates
// required) and auth on: one of two candidates leads, its fenced writes
// land while the other's campaign waits; the leader's process dies (its
// client closes: no resign, no revoke) and the standby leads within the
// lease TTL with a higher epoch; the dead leader's fenced write is then
// refused. A wrong password and a client without a certificate are
// refused. The failover time is logged.
func TestExternalEtcd34(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process")
	}
	dir := t.TempDir()
	files := writeTestPKI(t, dir)
	e := startExternalEtcd(t, "3.4", files)
	ctx := ctxT(t, 90*time.Second)

	var admin *clientv3.Client
	eventually(t, 30*time.Second, "etcd 3.4 answers over TLS", func() bool {
		cli, err := NewClient(ClientConfig{Endpoints: []string{e.endpoint}, TLS: files, DialTimeout: time.Second})
		if err != nil {
			return false
		}
		if _, err := cli.Get(ctx, "/probe"); err != nil {
			_ = cli.Close()
			return false
		}
		admin = cli
		return true
	})
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.UserAdd(ctx, "isobar", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "isobar", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enable auth on etcd 3.4: %v", err)
		}
	}
	_ = admin.Close()

	cfg := ClientConfig{Endpoints: []string{e.endpoint}, TLS: files, Username: "isobar", Password: "s3cret", DialTimeout: 5 * time.Second}
	client := func() *clientv3.Client {
		t.Helper()
		cli, err := NewClient(cfg)
		if err != nil {
			t.Fatalf("NewClient with auth and TLS: %v", err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	cliA, cliB := client(), client()
	const ttl = time.Second
	a := newCand(t, cliA, Config{Prefix: testPrefix, ID: "a", TTL: ttl}, prometheus.NewRegistry())
	b := newCand(t, cliB, Config{Prefix: testPrefix, ID: "b", TTL: ttl}, nil)

	la, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("a.Campaign on etcd 3.4: %v", err)
	}
	if err := FencedPut(ctx, cliA, la, "/t/plan", "a1"); err != nil {
		t.Fatalf("leader's FencedPut on etcd 3.4: %v", err)
	}
	bres := campaignAsync(t, ctx, b)
	eventually(t, 10*time.Second, "b waiting behind a", func() bool { return len(prefixKeys(t, cliB, testPrefix)) == 2 })
	if id, epoch, err := Leader(ctx, cliB, testPrefix); err != nil || id != "a" || epoch != la.Epoch {
		t.Fatalf("Leader = %q, %d, %v; want a, %d", id, epoch, err, la.Epoch)
	}
	select {
	case r := <-bres:
		t.Fatalf("b's Campaign returned while a leads: %+v", r)
	default:
	}

	killed := time.Now()
	if err := cliA.Close(); err != nil {
		t.Fatalf("close a's client: %v", err)
	}
	r := recv(t, bres, 30*time.Second, "b elected after a died")
	t.Logf("FIGURE etcd 3.4 (TLS, auth): standby leads %v after the leader's client died (TTL %v)", time.Since(killed), ttl)
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	if r.l.Epoch <= la.Epoch {
		t.Errorf("epochs %d then %d: want strictly increasing", la.Epoch, r.l.Epoch)
	}
	closedWithin(t, la.Done, 5*time.Second, "the dead leader's Done")
	if err := FencedPut(ctx, cliB, la, "/t/plan", "stale"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("FencedPut under the dead leader's term on etcd 3.4: %v, want ErrNotLeader", err)
	}
	if err := FencedPut(ctx, cliB, r.l, "/t/plan", "b1"); err != nil {
		t.Fatalf("new leader's FencedPut: %v", err)
	}
	if resp, err := cliB.Get(ctx, "/t/plan"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "b1" {
		t.Fatalf("plan after failover: %v %v, want b1", resp, err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("b.Resign: %v", err)
	}

	bad := cfg
	bad.Password = "wrong"
	if cli, err := NewClient(bad); err == nil {
		_ = cli.Close()
		t.Error("etcd 3.4 accepted a wrong password")
	}
	bad = cfg
	bad.TLS = TLSFiles{CAFile: files.CAFile}
	bad.DialTimeout = time.Second
	if cli, err := NewClient(bad); err == nil {
		_ = cli.Close()
		t.Error("etcd 3.4 accepted a client without a certificate")
	} else {
		t.Logf("no certificate: %v", err)
	}
}
