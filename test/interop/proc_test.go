package interop

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// isobarBin is the isobar binary TestMain built, or "" when the suite is
// off.
var isobarBin string

func TestMain(m *testing.M) {
	if os.Getenv("ISOBAR_INTEROP") != "1" {
		os.Exit(m.Run()) // every test skips
	}
	dir, err := os.MkdirTemp("", "isobar-interop-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	isobarBin = filepath.Join(dir, "isobar")
	build := exec.Command("go", "build", "-o", isobarBin, "github.com/isobar-mesh/isobar/cmd/isobar")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "interop: building isobar:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// suite skips t unless the interop suite is on.
func suite(t *testing.T) {
	t.Helper()
	if os.Getenv("ISOBAR_INTEROP") != "1" {
		t.Skip("interop judges run under make interop (ISOBAR_INTEROP=1)")
	}
}

// need returns the path of tool, or skips t loudly when it is absent.
func need(t *testing.T, tool, install string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("INTEROP-SKIP: %s not found (%s); .ci/run installs it", tool, install)
	}
	return p
}

// syncBuffer is an io.Writer safe for a child's stdout and stderr.
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

// proc is a child process owned by a test.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer // stderr (and stdout unless piped)
	done chan struct{}
}

// start runs name's command as a child of t, stopped in t.Cleanup; its
// output is logged when t fails. With stdout non-nil the child's stdout
// goes there instead of to the log buffer.
func start(t *testing.T, name string, env []string, stdout io.Writer, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if stdout != nil {
		p.cmd.Stdout = stdout
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, tail(p.out.String(), 6000))
		}
	})
	return p
}

// stop sends SIGTERM, then SIGKILL after 10 s, and waits for the exit.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// poll awaits cond with internal/eventually, failing t after within with
// the last state cond described.
func poll(t *testing.T, what string, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	eventually.NoError(t, within, what, func() error {
		if ok, last := cond(); !ok {
			return errors.New(last)
		}
		return nil
	})
}

func waitDial(t *testing.T, addr string) {
	t.Helper()
	poll(t, "dial "+addr, 30*time.Second, func() (bool, string) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return false, err.Error()
		}
		_ = c.Close()
		return true, ""
	})
}

// httpGet returns the body of url.
func httpGet(url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// lines calls f for each line r yields, until r ends.
func lines(r io.Reader, f func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f(strings.TrimSpace(sc.Text()))
	}
}
