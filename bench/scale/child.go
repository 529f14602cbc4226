package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/bench"
)

// The control protocol between `isobar bench scale` and its cell
// processes: JSON values, one per line, requests on the child's stdin and
// replies on its stdout. The child speaks first (a hello with its pid and
// descriptor limit), then answers each request, in order, with a reply of
// the same id. The child ends when its stdin ends: the parent closed it, or
// died.

// childRequest is one request to a cell process.
type childRequest struct {
	ID int    `json:"id"`
	Op string `json:"op"` // start, kill, silence, revive, up, stats
	// start: the cells, their heartbeat interval and seed.
	Cells               []cellSpec `json:"cells,omitempty"`
	HeartbeatIntervalNs int64      `json:"heartbeat_interval_ns,omitempty"`
	Seed                uint64     `json:"seed,omitempty"`
	// kill, silence, revive: the cell; up: the cells.
	Cell string   `json:"cell,omitempty"`
	IDs  []string `json:"ids,omitempty"`
}

// childReply answers a request (or, with ID 0, is the hello).
type childReply struct {
	ID    int         `json:"id"`
	Error string      `json:"error,omitempty"`
	Hello *childHello `json:"hello,omitempty"`
	IDs   []string    `json:"ids,omitempty"` // start
	// Endpoints are the started cells' endpoints, in the order of IDs
	// (start): the parent sends their RTT probes to the process's sink.
	Endpoints []string `json:"endpoints,omitempty"`
	Up        bool     `json:"up,omitempty"` // up
	// KilledAtUnixNs is when the killed cell closed its sockets, by the
	// child's wall clock (kill).
	KilledAtUnixNs int64       `json:"killed_at_unix_ns,omitempty"`
	Stats          *childStats `json:"stats,omitempty"`
}

// childHello is a cell process's first line.
type childHello struct {
	PID int `json:"pid"`
	// FDLimit is its RLIMIT_NOFILE soft limit, raised to the hard limit (0:
	// unknown).
	FDLimit uint64 `json:"fd_limit"`
	// ProbeSink is the address of the process's RTT-probe sink: the
	// controllers' probes of its cells connect there, so the accepts, the
	// cells' side of a probe, are the process's CPU, not the
	// controllers'.
	ProbeSink string `json:"probe_sink"`
}

// childStats are a cell process's totals.
type childStats struct {
	Heartbeats     uint64 `json:"heartbeats"`
	HeartbeatBytes uint64 `json:"heartbeat_bytes"`
	StreamErrors   uint64 `json:"stream_errors"`
	LastError      string `json:"last_error,omitempty"`
	CPUNs          int64  `json:"cpu_ns"`
	RSSBytes       uint64 `json:"rss_bytes"`
	Goroutines     int    `json:"goroutines"`
}

// Ops of the control protocol.
const (
	opStart   = "start"
	opKill    = "kill"
	opSilence = "silence"
	opRevive  = "revive"
	opUp      = "up"
	opStats   = "stats"
)

// ServeCells is a cell process (the hidden `isobar bench scale cells`): it
// raises its descriptor limit to the hard limit, says hello on out, then
// runs the synthetic cells and answers the requests it reads from in until
// in ends (its parent closed it or died) or ctx ends. It stops every cell
// (each sends a Terminated heartbeat, bounded) before it returns. Requests
// that cannot be decoded end it with an error; requests that fail get an
// error reply. On ctx's end it returns without waiting for in: the reader
// blocked on in ends with the process.
func ServeCells(ctx context.Context, in io.Reader, out io.Writer, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	enc := json.NewEncoder(out)
	fdLimit := raiseFDLimit()
	sink, err := listenProbeSink(ctx)
	if err != nil {
		return fmt.Errorf("scale: cell process: %w", err)
	}
	defer sink.stop()
	if err := enc.Encode(childReply{Hello: &childHello{PID: os.Getpid(), FDLimit: fdLimit, ProbeSink: sink.addr()}}); err != nil {
		return fmt.Errorf("scale: cell process: hello: %w", err)
	}
	reqs := make(chan childRequest)
	readErr := make(chan error, 1)
	go func() { readErr <- readRequests(ctx, in, reqs) }()
	var f *localFleet
	defer func() {
		if f != nil {
			f.stop()
		}
	}()
	for {
		var req childRequest
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			return err
		case req = <-reqs:
		}
		rep := childReply{ID: req.ID}
		if req.Op == opStart && f == nil {
			f = newLocalFleet(time.Duration(req.HeartbeatIntervalNs), req.Seed, clockwork.NewRealClock(), log)
		}
		if err := serveOne(ctx, f, req, &rep); err != nil {
			rep.Error = err.Error()
		}
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("scale: cell process: reply: %w", err)
		}
	}
}

// readRequests decodes in onto reqs until in ends (nil) or holds what is
// not a request (an error).
func readRequests(ctx context.Context, in io.Reader, reqs chan<- childRequest) error {
	dec := json.NewDecoder(in)
	for {
		var req childRequest
		if err := dec.Decode(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("scale: cell process: bad request: %w", err)
		}
		select {
		case reqs <- req:
		case <-ctx.Done():
			return nil
		}
	}
}

// serveOne answers one request on f (nil before the first start).
func serveOne(ctx context.Context, f *localFleet, req childRequest, rep *childReply) error {
	if f == nil {
		return fmt.Errorf("op %q before start", req.Op)
	}
	switch req.Op {
	case opStart:
		if req.HeartbeatIntervalNs <= 0 {
			return fmt.Errorf("start: heartbeat interval %d ns: must be > 0", req.HeartbeatIntervalNs)
		}
		ids, eps, err := f.startCells(ctx, req.Cells)
		rep.IDs, rep.Endpoints = ids, eps
		return err
	case opKill:
		at, err := f.kill(ctx, req.Cell)
		if err == nil {
			rep.KilledAtUnixNs = at.UnixNano()
		}
		return err
	case opSilence:
		return f.silence(ctx, req.Cell)
	case opRevive:
		return f.revive(ctx, req.Cell)
	case opUp:
		up, err := f.up(ctx, req.IDs)
		rep.Up = up
		return err
	case opStats:
		st, _ := f.stats(ctx)
		cpu, _ := cpuTime()
		rep.Stats = &childStats{Heartbeats: st.heartbeats, HeartbeatBytes: st.bytes, StreamErrors: st.streamErrors,
			LastError: st.lastError, CPUNs: int64(cpu), RSSBytes: rssBytes(), Goroutines: runtime.NumGoroutine()}
		return nil
	default:
		return fmt.Errorf("unknown op %q", req.Op)
	}
}

// probeSink is a listener that answers RTT probes (bench.ServeProbeSink)
// until stop.
type probeSink struct {
	ln net.Listener
	wg sync.WaitGroup
}

// listenProbeSink listens on a loopback port and serves probes there. Its
// accepted connections get no TCP keepalive: they are reset at once.
func listenProbeSink(ctx context.Context) (*probeSink, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("probe sink: %w", err)
	}
	s := &probeSink{ln: ln}
	s.wg.Go(func() { bench.ServeProbeSink(ln) })
	return s, nil
}

func (s *probeSink) addr() string { return s.ln.Addr().String() }

// stop closes the listener and returns when its server has ended.
func (s *probeSink) stop() {
	_ = s.ln.Close()
	s.wg.Wait()
}
