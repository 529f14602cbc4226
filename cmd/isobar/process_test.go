package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/internal/eventually"
)

// The test binary doubles as the isobar CLI: with ISOBAR_TEST_AS_CLI=1 it
// runs the command line it was given, so process tests need no separate
// build.
func TestMain(m *testing.M) {
	if os.Getenv("ISOBAR_TEST_AS_CLI") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	// memberlist's probe goroutine (the lab's gossip) outlives Shutdown
	// until its probe's ack deadline passes: a bounded straggler of the
	// library, not a leak of ours.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// proc is a child isobar process.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startCLI(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(exe, args...)
	p.cmd.Env = append(os.Environ(), "ISOBAR_TEST_AS_CLI=1")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.out.String())
		}
	})
	return p
}

// freeAddr returns a loopback address that was free a moment ago.
// handedOut holds every address freeAddr returned in this test binary:
// the kernel may hand a just-closed port out again (TestPickerProcess once
// got the controller's port for the picker), so freeAddr never returns
// one twice.
var handedOut sync.Map

func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		if _, dup := handedOut.LoadOrStore(addr, true); !dup {
			return addr
		}
	}
	t.Fatal("no loopback port not handed out before in 100 tries")
	return ""
}

func waitDial(t *testing.T, addr string) {
	t.Helper()
	eventually.NoError(t, 20*time.Second, addr+" accepting connections", func() error {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
}

// TestProcessesSIGKILL runs the real binaries — regional controller, two
// simulated engines with their exporter, two cellagents — and SIGKILLs one
// engine process: its endpoint must leave the xDS client's assignment (the
// time is logged). Then SIGTERM of an agent takes its cell out cleanly
// (Terminated, not Failed).
func TestProcessesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctrl, ctrlHTTP := freeAddr(t), freeAddr(t)
	startCLI(t, "regional", "regional", "--region", "r1", "--listen", ctrl, "--metrics-listen", ctrlHTTP, "--insecure")
	waitDial(t, ctrl)

	var engines, agents []*proc
	for i := range 2 {
		api, dcgm := freeAddr(t), freeAddr(t)
		engines = append(engines, startCLI(t, fmt.Sprintf("engine-%d", i), "sim", "engine",
			"--listen", api, "--dcgm-listen", dcgm, "--gpu-index", "0", "--time-scale", "0.2"))
		waitDial(t, api)
		waitDial(t, dcgm)
		agents = append(agents, startCLI(t, fmt.Sprintf("agent-%d", i), "cellagent",
			"--cell-id", fmt.Sprintf("cell-%d", i), "--region", "r1", "--controller", ctrl,
			"--vllm-url", "http://"+api+"/metrics", "--dcgm-url", "http://"+dcgm+"/metrics", "--insecure"))
	}

	w := startWatcher(t, ctrl, "process-test")
	wait := func(what string, cond func(map[string]uint32) bool) xdsclient.Assignment {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		a, err := w.WaitFor(ctx, func(a xdsclient.Assignment) bool { return cond(a.Weights()) })
		if err != nil {
			t.Fatalf("%s: %v (last %v)", what, err, a.Weights())
		}
		return a
	}
	wait("both cells assigned", func(ws map[string]uint32) bool { return len(ws) == 2 })

	killed := time.Now()
	if err := engines[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a := wait("killed engine removed", func(ws map[string]uint32) bool {
		_, ok := ws["cell-0"]
		return !ok
	})
	// The time is a figure for the drills and the bench, not a bound here.
	t.Logf("SIGKILL of the engine process → endpoint removed at the xDS client after %v", a.At.Sub(killed))

	if err := agents[1].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-agents[1].done:
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not exit on SIGTERM")
	}
	wait("terminated cell removed", func(ws map[string]uint32) bool { return len(ws) == 0 })
	if code := agents[1].cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("agent exit status %d after SIGTERM, want 0", code)
	}
	if out := agents[1].out.String(); !strings.Contains(out, "TERMINATED") {
		t.Errorf("agent did not report TERMINATED on shutdown:\n%s", out)
	}
}

// TestGlobalPairSIGKILL runs two `isobar global` processes against an
// embedded etcd and SIGKILLs the leader: the other process leads, with a
// higher fencing epoch (the takeover time is logged; lease TTL 1 s).
func TestGlobalPairSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	e, err := election.StartEmbedded(context.Background(), election.EmbeddedConfig{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ep := strings.Join(e.Endpoints(), ",")
	procs := map[string]*proc{}
	for _, name := range []string{"g1", "g2"} {
		procs[name] = startCLI(t, name, "global", "--name", name, "--listen", freeAddr(t), "--metrics-listen", "-",
			"--etcd-endpoints", ep, "--lease-ttl", "1s", "--cycle-interval", "200ms", "--insecure")
	}
	leader := func(within time.Duration, not int64) (string, int64) {
		t.Helper()
		var id string
		var epoch int64
		eventually.NoError(t, within, "a new leader", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var err error
			if id, epoch, err = election.Leader(ctx, cli, "/isobar/global/election/"); err == nil && epoch <= not {
				err = fmt.Errorf("leader %q still on epoch %d", id, epoch)
			}
			return err
		})
		return id, epoch
	}
	id, epoch := leader(10*time.Second, 0)
	name := id[:strings.IndexByte(id, '@')]
	killed := time.Now()
	if err := procs[name].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	id2, epoch2 := leader(30*time.Second, epoch)
	t.Logf("SIGKILL of leader %s → %s leads (epoch %d → %d) after %v", name, id2, epoch, epoch2, time.Since(killed))
	if strings.HasPrefix(id2, name+"@") {
		t.Errorf("new leader %s, want the other member", id2)
	}
}

// startWatcher subscribes an independent xDS client (the gateway's ADS
// watcher) to the controller at ctrl as node; it stops with the test.
func startWatcher(t *testing.T, ctrl, node string) *xdsclient.Watcher {
	t.Helper()
	w, err := xdsclient.NewWatcher(xdsclient.WatchConfig{Server: ctrl, NodeID: node},
		xdsclient.WatchDeps{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}
