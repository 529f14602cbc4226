package scale

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional"
)

// procTestBound bounds each wait of these tests: far above what any of
// them takes, it only turns a hang into a failure.
const procTestBound = time.Minute

// TestProcFleetStopReaps starts two cell processes with cells pointed at a
// listener that never answers, controls them, stops them, and checks both
// were reaped.
func TestProcFleetStopReaps(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), procTestBound)
	defer cancel()
	cc := &childCommands{}
	f, err := startProcFleet(ctx, 2, cc.make, 500*time.Millisecond, 1, clockwork.NewRealClock())
	if err != nil {
		t.Fatal(err)
	}
	specs := []cellSpec{{"a", 0, 0, ln.Addr().String()}, {"a", 0, 1, ln.Addr().String()}, {"b", 1, 0, ln.Addr().String()}}
	ids, err := f.start(ctx, specs)
	if err != nil {
		f.stop()
		t.Fatal(err)
	}
	want := []string{"a-cell-0", "a-cell-1", "b-cell-0"}
	for i := range want {
		if ids[i] != want[i] {
			t.Errorf("ids %q, want %q", ids, want)
			break
		}
	}
	// Each cell's RTT probes go to the sink of the process that runs it
	// (cells dealt round-robin: a-cell-0 and b-cell-0 to the first), and
	// that sink answers a connect.
	sinkOf := func(ep string) string {
		addr, ok := f.probeSink(ep)
		if !ok || addr == "" {
			t.Fatalf("no probe sink for endpoint %s", ep)
		}
		return addr
	}
	a0, a1, b0 := sinkOf("127.1.0.1:8000"), sinkOf("127.1.0.2:8000"), sinkOf("127.2.0.1:8000")
	if a0 != b0 || a0 == a1 {
		t.Errorf("probe sinks %s, %s, %s: want the first and third equal (one process), the second apart", a0, a1, b0)
	}
	for _, addr := range []string{a0, a1} {
		conn, err := regionalProbeDial(addr)
		if err != nil {
			t.Errorf("probe of the sink at %s: %v", addr, err)
			continue
		}
		_ = conn.Close()
	}
	if _, ok := f.probeSink("127.9.9.9:8000"); ok {
		t.Error("a probe sink for an endpoint no cell has")
	}
	if up, err := f.up(ctx, ids); err != nil || up {
		t.Errorf("up %v, %v: want false (no controller answers), nil", up, err)
	}
	if _, err := f.kill(ctx, "a-cell-0"); err == nil || !strings.Contains(err.Error(), "not up") {
		t.Errorf("kill of a cell that is not up: %v, want an error saying so", err)
	}
	if _, err := f.kill(ctx, "nobody"); err == nil {
		t.Error("kill of an unknown cell: no error")
	}
	if _, err := f.stats(ctx); err != nil {
		t.Error(err)
	}
	if len(f.pids()) != 2 || f.minFDLimit() == 0 {
		t.Errorf("pids %v, fd limit %d", f.pids(), f.minFDLimit())
	}
	f.stop()
	checkReaped(t, cc)
	if len(cc.made()) != 2 {
		t.Errorf("%d cell processes made, want 2", len(cc.made()))
	}
}

// TestCellProcExitsOnStdinEOF: a child whose parent is gone (its stdin
// ends, nothing else said) stops its cells and exits cleanly on its own.
func TestCellProcExitsOnStdinEOF(t *testing.T) {
	cc := &childCommands{}
	p, err := startCellProc(context.Background(), cc.make, clockwork.NewRealClock())
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	_ = p.stdin.Close() // as when the parent dies: no request, no kill
	select {
	case <-p.exited:
	case <-time.After(procTestBound):
		t.Fatal("the cell process did not exit after its stdin ended")
	}
	if p.waitErr != nil {
		t.Errorf("exit: %v, want a clean exit; stderr %q", p.waitErr, p.stderr.String())
	}
}

// TestCellProcStartFailure: a child that dies at start is an error that
// quotes its stderr, and every child started is reaped.
func TestCellProcStartFailure(t *testing.T) {
	good := &childCommands{}
	bad := &childCommands{env: []string{"ISOBAR_SCALE_TEST_CHILD_FAIL=1"}}
	n := 0
	mk := func() *exec.Cmd {
		n++
		if n == 2 {
			return bad.make()
		}
		return good.make()
	}
	_, err := startProcFleet(context.Background(), 3, mk, time.Second, 1, clockwork.NewRealClock())
	if err == nil || !strings.Contains(err.Error(), "told to fail") {
		t.Errorf("err %v, want one quoting the child's stderr", err)
	}
	checkReaped(t, good)
	checkReaped(t, bad)
	if len(good.made())+len(bad.made()) != 2 {
		t.Errorf("%d children made, want 2 (none after the failure)", len(good.made())+len(bad.made()))
	}
}

// TestRunCancelReapsChildren cancels a run while its children start: the
// run returns the cancellation and no child is left.
func TestRunCancelReapsChildren(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc := &childCommands{}
	mk := func() *exec.Cmd {
		if len(cc.made()) == 1 {
			cancel() // the first child runs, the second is being made
		}
		return cc.make()
	}
	cfg := smokeConfig()
	cfg.Cells, cfg.Regions, cfg.CellProcs = []int{4}, []int{1}, 2
	rep, err := Run(ctx, cfg, Deps{CellProcess: mk})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err %v, want context.Canceled", err)
	}
	if rep == nil || !rep.Interrupted {
		t.Errorf("report %+v, want one marked interrupted", rep)
	}
	checkReaped(t, cc)
}

// TestServeCellsBadInput: requests that fail get an error reply; a line
// that is not a request ends the process with an error; the cells stop.
func TestServeCellsBadInput(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeCells(context.Background(), inR, outW, nil); _ = outW.Close() }()
	dec := newReplyReader(outR)
	if r := dec(); r.Hello == nil || r.Hello.PID == 0 {
		t.Fatalf("first line %+v, want a hello", r)
	}
	for _, tc := range []struct{ req, want string }{
		{`{"id":1,"op":"stats"}`, "before start"},
		{`{"id":2,"op":"start","heartbeat_interval_ns":0}`, "heartbeat interval"},
		{`{"id":3,"op":"start","heartbeat_interval_ns":1000000,"cells":[{"region":"a","index":-1,"controller":"x:1"}]}`, "out of range"},
		{`{"id":4,"op":"fly"}`, "unknown op"},
		{`{"id":5,"op":"kill","cell":"nobody"}`, "no cell"},
	} {
		if _, err := io.WriteString(inW, tc.req+"\n"); err != nil {
			t.Fatal(err)
		}
		if r := dec(); !strings.Contains(r.Error, tc.want) {
			t.Errorf("%s: reply %+v, want an error naming %q", tc.req, r, tc.want)
		}
	}
	_, _ = io.WriteString(inW, "not json\n")
	if err := <-done; err == nil || !strings.Contains(err.Error(), "bad request") {
		t.Errorf("ServeCells: %v, want a bad-request error", err)
	}
	_ = inW.Close()
	_ = outR.Close()
}

// newReplyReader returns a function that decodes the next reply from r
// (a zero reply once r ends).
func newReplyReader(r io.Reader) func() childReply {
	dec := json.NewDecoder(r)
	return func() childReply {
		var rep childReply
		_ = dec.Decode(&rep)
		return rep
	}
}

// regionalProbeDial connects as the controllers' prober does.
func regionalProbeDial(addr string) (net.Conn, error) {
	return regional.ProbeDial("tcp", addr, procTestBound)
}

// TestVictimsPerRoundStayUnderHalf: a round of deaths never takes half of a
// region's cells, which would be a mass expiry the controller holds.
func TestVictimsPerRoundStayUnderHalf(t *testing.T) {
	for n := 1; n <= 200; n++ {
		v := victimsPerRound(n)
		if v < 1 || v > maxVictimsPerRound || (n >= 3 && 2*v >= n) {
			t.Fatalf("%d cells: %d victims a round", n, v)
		}
	}
}
