package scale

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// The test binary doubles as a cell process: with ISOBAR_SCALE_TEST_CHILD=1
// it runs ServeCells on its stdin and stdout, as `isobar bench scale-cells`
// does. ISOBAR_SCALE_TEST_CHILD_NOFILE=N first lowers its descriptor limit
// to N (a machine with fewer descriptors); ISOBAR_SCALE_TEST_CHILD_FAIL=1
// makes it fail at once (a child that cannot start).
func TestMain(m *testing.M) {
	if os.Getenv("ISOBAR_SCALE_TEST_CHILD") == "1" {
		os.Exit(testChildMain())
	}
	goleak.VerifyTestMain(m)
}

func testChildMain() int {
	if os.Getenv("ISOBAR_SCALE_TEST_CHILD_FAIL") == "1" {
		fmt.Fprintln(os.Stderr, "test cell process: told to fail")
		return 3
	}
	if s := os.Getenv("ISOBAR_SCALE_TEST_CHILD_NOFILE"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if err := ServeCells(context.Background(), os.Stdin, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childCommands makes test cell processes (extra environment appended)
// and remembers every command it made.
type childCommands struct {
	env []string

	mu   sync.Mutex
	cmds []*exec.Cmd
}

func (c *childCommands) make() *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), "ISOBAR_SCALE_TEST_CHILD=1"), c.env...)
	c.mu.Lock()
	c.cmds = append(c.cmds, cmd)
	c.mu.Unlock()
	return cmd
}

// made is every command made so far.
func (c *childCommands) made() []*exec.Cmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*exec.Cmd(nil), c.cmds...)
}

// checkReaped fails t unless every child made was waited for (reaped) and
// no longer exists.
func checkReaped(t *testing.T, c *childCommands) {
	t.Helper()
	for _, cmd := range c.made() {
		if cmd.Process == nil {
			continue // never started
		}
		if cmd.ProcessState == nil {
			t.Errorf("cell process %d was not reaped", cmd.Process.Pid)
			continue
		}
		if err := syscall.Kill(cmd.Process.Pid, 0); err == nil {
			t.Errorf("cell process %d still exists", cmd.Process.Pid)
		}
	}
}
