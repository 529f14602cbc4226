package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Bounds of the cell processes.
const (
	// maxCellsPerProc is the most cells one child holds when the number of
	// children is chosen (Config.CellProcs 0): 10,000 cells take 3.
	maxCellsPerProc = 4000
	// maxCellProcs bounds the children of one point.
	maxCellProcs = 64
	// childFDReserve are a child's descriptors besides its cells' sockets
	// (stdio, the runtime's poller, a redial in flight).
	childFDReserve = 64
	// callTimeout bounds one control request (starting 4,000 cells is the
	// longest); stopTimeout a child's clean exit after its stdin closes
	// (each cell's Terminated heartbeat waits at most 2 s), after which it
	// is killed.
	callTimeout = 30 * time.Second
	stopTimeout = 10 * time.Second
	// stderrTail is how much of a child's stderr an error quotes.
	stderrTail = 2048
)

// cellProc is one cell process from the parent's side. Its reader
// goroutine owns the child's stdout and reaps it (Wait) when stdout ends;
// exited is closed then. Calls are serialised by mu.
type cellProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	clock   clockwork.Clock
	stderr  *tailWriter
	replies chan childReply
	quit    chan struct{} // closed by stop: the reader stops delivering
	exited  chan struct{} // closed once the child is reaped
	waitErr error         // Wait's result, read after exited
	hello   childHello

	mu       sync.Mutex
	next     int
	stopOnce sync.Once
}

// startCellProc starts the child newCmd makes and reads its hello. On
// error the child, if started, has been reaped.
func startCellProc(ctx context.Context, newCmd func() *exec.Cmd, clock clockwork.Clock) (*cellProc, error) {
	cmd := newCmd()
	p := &cellProc{cmd: cmd, clock: clock, stderr: &tailWriter{max: stderrTail},
		replies: make(chan childReply), quit: make(chan struct{}), exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("scale: cell process: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("scale: cell process: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("scale: cell process: %w", err)
	}
	go p.read(stdout)
	rep, err := p.await(ctx, 0)
	if err == nil && rep.Hello == nil {
		err = fmt.Errorf("scale: cell process %d: first line is not a hello", cmd.Process.Pid)
	}
	if err != nil {
		p.stop()
		return nil, err
	}
	p.hello = *rep.Hello
	return p, nil
}

// read delivers the child's replies until its stdout ends, then reaps it.
// After a line that is not a reply it discards the rest, so the child
// never blocks on a full pipe.
func (p *cellProc) read(stdout io.Reader) {
	dec := json.NewDecoder(stdout)
	for {
		var r childReply
		if err := dec.Decode(&r); err != nil {
			break
		}
		select {
		case p.replies <- r:
		case <-p.quit:
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	p.waitErr = p.cmd.Wait()
	close(p.exited)
}

// await returns the reply with id, bounded by ctx, callTimeout and the
// child's exit.
func (p *cellProc) await(ctx context.Context, id int) (childReply, error) {
	t := p.clock.NewTimer(callTimeout)
	defer t.Stop()
	for {
		select {
		case r := <-p.replies:
			if r.ID == id {
				return r, nil
			}
		case <-p.exited:
			return childReply{}, fmt.Errorf("scale: cell process %d exited (%v); its stderr ends: %q",
				p.cmd.Process.Pid, p.waitErr, p.stderr.String())
		case <-ctx.Done():
			return childReply{}, ctx.Err()
		case <-t.Chan():
			return childReply{}, fmt.Errorf("scale: cell process %d: no answer within %v", p.cmd.Process.Pid, callTimeout)
		}
	}
}

// call sends req and returns its reply; an error reply is an error.
func (p *cellProc) call(ctx context.Context, req childRequest) (childReply, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	req.ID = p.next
	b, err := json.Marshal(req)
	if err != nil {
		return childReply{}, fmt.Errorf("scale: cell process: %w", err)
	}
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		return childReply{}, fmt.Errorf("scale: cell process %d: %s: %w", p.cmd.Process.Pid, req.Op, err)
	}
	rep, err := p.await(ctx, req.ID)
	if err == nil && rep.Error != "" {
		err = fmt.Errorf("scale: cell process %d: %s: %s", p.cmd.Process.Pid, req.Op, rep.Error)
	}
	return rep, err
}

// stop closes the child's stdin (it stops its cells and exits) and
// returns once it is reaped; a child still running after stopTimeout is
// killed.
func (p *cellProc) stop() {
	p.stopOnce.Do(func() {
		close(p.quit)
		_ = p.stdin.Close()
		t := p.clock.NewTimer(stopTimeout)
		defer t.Stop()
		select {
		case <-p.exited:
			return
		case <-t.Chan():
		}
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
}

// tailWriter keeps the last max bytes written (a child's stderr).
type tailWriter struct {
	max int
	mu  sync.Mutex
	b   []byte
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, b...)
	if len(w.b) > w.max {
		w.b = append(w.b[:0], w.b[len(w.b)-w.max:]...)
	}
	return len(b), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
