package wan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/internal/backoff"
)

// Proxy is one emulated WAN path for TCP: it accepts on Config.Listen,
// dials Config.Target once per accepted connection and relays both
// directions through a delay line each. See the package doc for the
// semantics of delay, jitter, Partition and Reset.
type Proxy struct {
	cfg   Config
	clock clockwork.Clock
	log   *slog.Logger
	pm    *pathMetrics
	shape *shaper
	ln    net.Listener
	fwdM  dirMetrics
	revM  dirMetrics

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	target  string
	conns   map[uint64]*tcpConn
	nextID  uint64
	started bool
	stopped bool
}

// tcpConn is one accepted connection, owned by its serve goroutine.
type tcpConn struct {
	id     uint64
	client net.Conn
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	up    net.Conn
	reset bool // close with RST (Reset)
}

// New validates cfg and listens on cfg.Listen; Start begins accepting. The
// listener is held from New on, so Addr can be given to the path's users
// before Start. Stop releases it, started or not.
func New(cfg Config, deps Deps) (*Proxy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	deps = deps.withDefaults()
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	pm := m.forPath(cfg.Path, protoTCP)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("wan: path %s: listen %s: %w", cfg.Path, cfg.Listen, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Proxy{
		cfg: cfg, clock: deps.Clock, pm: pm, ln: ln,
		log:   deps.Logger.With("path", cfg.Path, "proto", protoTCP),
		shape: newShaper(cfg.Delay, cfg.Jitter, pm),
		fwdM:  pm.dir(dirForward), revM: pm.dir(dirReverse),
		ctx: ctx, cancel: cancel,
		target: cfg.Target, conns: map[uint64]*tcpConn{},
	}, nil
}

// Addr is the address the path accepts on, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Start begins accepting connections. A second Start returns ErrStarted,
// a Start after Stop ErrStopped.
func (p *Proxy) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopped:
		return ErrStopped
	case p.started:
		return ErrStarted
	}
	p.started = true
	p.wg.Add(1)
	go p.accept()
	return nil
}

// Stop closes the listener and every connection and returns once every
// goroutine of the proxy has exited. Bytes still in a delay line are
// dropped. Idempotent; safe before Start.
func (p *Proxy) Stop() {
	p.mu.Lock()
	first := !p.stopped
	p.stopped = true
	p.mu.Unlock()
	if first {
		p.cancel()
		_ = p.ln.Close()
	}
	p.wg.Wait()
}

// SetDelay changes the one-way delay and jitter of both directions for
// bytes read after the call; bytes already in a delay line keep their
// times. It refuses (ErrInvalidConfig) values outside 0..MaxDelay.
func (p *Proxy) SetDelay(delay, jitter time.Duration) error {
	if err := p.shape.setDelay(delay, jitter); err != nil {
		return err
	}
	p.log.Info("wan path delay changed", "delay", delay, "jitter", jitter)
	return nil
}

// Delay returns the current one-way delay and jitter.
func (p *Proxy) Delay() (delay, jitter time.Duration) { return p.shape.get() }

// Partition cuts the path (on) or heals it. While cut, bytes of open
// connections are held in the delay lines (until full, then the senders
// block) and delivered on heal, no earlier than their due time; new
// connections are accepted but the dial of the target waits for the heal,
// so nothing reaches the far end. Connections stay open either way; an
// endpoint's own timeouts decide whether it gives up.
func (p *Proxy) Partition(on bool) {
	if p.shape.setPartition(on) {
		p.log.Info("wan path partition changed", "partitioned", on)
	}
}

// Partitioned reports whether the path is cut.
func (p *Proxy) Partitioned() bool {
	cut, _ := p.shape.gate()
	return cut
}

// SetTarget changes the far end for connections accepted after the call
// (the target restarted elsewhere); open connections keep theirs.
func (p *Proxy) SetTarget(target string) error {
	if err := validTarget(target); err != nil {
		return err
	}
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	return nil
}

// Reset closes every open connection at once, both sides, with a TCP RST
// (a path flap seen by a middlebox), dropping what their delay lines hold.
// It returns once those connections are closed. New connections are
// accepted as before.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := make([]*tcpConn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.pm.resets.Inc()
	for _, c := range conns {
		c.mu.Lock()
		c.reset = true
		c.mu.Unlock()
		c.cancel()
	}
	for _, c := range conns {
		<-c.done
	}
	p.log.Info("wan path reset", "connections", len(conns))
}

// OpenConns is the number of connections open through the path.
func (p *Proxy) OpenConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	// A transient failure (out of file descriptors) backs off as net/http
	// does: 5 ms doubling up to 1 s, no jitter.
	bo := backoff.New(backoff.Policy{Min: 5 * time.Millisecond, Max: time.Second, Jitter: backoff.None})
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			wait := bo.Next()
			p.log.Warn("wan path accept failed", "err", err, "retry_in", wait)
			select {
			case <-p.clock.After(wait):
				continue
			case <-p.ctx.Done():
				return
			}
		}
		bo.Reset()
		p.track(nc)
	}
}

// track registers an accepted connection and starts its serve goroutine.
func (p *Proxy) track(nc net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		_ = nc.Close()
		return
	}
	ctx, cancel := context.WithCancel(p.ctx)
	c := &tcpConn{id: p.nextID, client: nc, cancel: cancel, done: make(chan struct{})}
	p.nextID++
	p.conns[c.id] = c
	p.pm.conns.Inc()
	p.pm.open.Inc()
	target := p.target
	p.wg.Add(1)
	go p.serve(ctx, c, target)
}

// serve relays one connection until both directions have ended, one of
// them failed, or the connection was reset or the proxy stopped. It owns
// the connection's four pipe goroutines and joins them.
func (p *Proxy) serve(ctx context.Context, c *tcpConn, target string) {
	defer p.wg.Done()
	log := p.log.With("conn", c.id)
	fwd := newLine(p.cfg.Seed, 2*c.id, p.cfg.QueueLen, p.fwdM)
	rev := newLine(p.cfg.Seed, 2*c.id+1, p.cfg.QueueLen, p.revM)
	var pipes sync.WaitGroup
	defer func() {
		c.mu.Lock()
		up, rst := c.up, c.reset
		c.mu.Unlock()
		for _, nc := range []net.Conn{c.client, up} {
			if nc == nil {
				continue
			}
			if tc, ok := nc.(*net.TCPConn); ok && rst {
				_ = tc.SetLinger(0)
			}
			_ = nc.Close()
		}
		c.cancel()
		pipes.Wait()
		fwd.discard()
		rev.discard()
		p.mu.Lock()
		delete(p.conns, c.id)
		p.mu.Unlock()
		p.pm.open.Dec()
		close(c.done)
		log.Debug("wan connection closed", "reset", rst)
	}()
	// The client's bytes are read (and held) from the start, also while
	// the dial waits for a partition to heal.
	pipes.Go(func() { p.read(ctx, c.client, fwd) })
	if err := p.shape.waitOpen(ctx); err != nil {
		return
	}
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	up, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		if ctx.Err() == nil {
			p.pm.dialFailed.Inc()
			log.Warn("wan path cannot dial target", "target", target, "err", err)
		}
		return
	}
	c.mu.Lock()
	c.up = up
	c.mu.Unlock()
	log.Debug("wan connection open", "client", c.client.RemoteAddr().String(), "target", target)
	fwdDone := make(chan error, 1)
	revDone := make(chan error, 1)
	pipes.Go(func() { fwdDone <- p.write(ctx, fwd, up) })
	pipes.Go(func() { p.read(ctx, up, rev) })
	pipes.Go(func() { revDone <- p.write(ctx, rev, c.client) })
	for range 2 {
		var err error
		select {
		case err = <-fwdDone:
		case err = <-revDone:
		case <-ctx.Done():
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				// One side reset or broke: the other sees a reset too.
				c.mu.Lock()
				c.reset = true
				c.mu.Unlock()
				log.Debug("wan connection aborted", "err", err)
			}
			return
		}
	}
}

// read stamps each chunk read from src and queues it; at the end of src
// it queues the end marker, carrying the error unless it was EOF.
func (p *Proxy) read(ctx context.Context, src net.Conn, l *line) {
	buf := make([]byte, p.cfg.ChunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			it := item{data: append([]byte(nil), buf[:n]...), due: l.stamp(p.shape, p.clock.Now())}
			l.hold(n)
			select {
			case l.ch <- it:
			case <-ctx.Done():
				l.release(n)
				return
			}
		}
		if err != nil {
			it := item{end: true, due: l.stamp(p.shape, p.clock.Now())}
			if !errors.Is(err, io.EOF) {
				it.err = err
			}
			select {
			case l.ch <- it:
			case <-ctx.Done():
			}
			return
		}
	}
}

// write delivers the line's items to dst at their due times, held while
// the path is cut. At the end marker it half-closes dst (EOF) and returns
// nil, or returns the reader's error, which aborts the connection.
func (p *Proxy) write(ctx context.Context, l *line, dst net.Conn) error {
	for {
		var it item
		select {
		case it = <-l.ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := p.shape.waitDue(ctx, p.clock, it.due, true); err != nil {
			l.release(len(it.data))
			return err
		}
		if it.end {
			if it.err != nil {
				return it.err
			}
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				return cw.CloseWrite()
			}
			return nil
		}
		n, err := dst.Write(it.data)
		l.release(len(it.data))
		l.m.bytes.Add(float64(n))
		if err != nil {
			return err
		}
	}
}
