package wan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
)

// maxDatagram is the largest UDP payload relayed.
const maxDatagram = 64 << 10

// UDPProxy is one emulated WAN path for UDP datagrams. Each client address
// that sends to Config.Listen gets a session: a socket connected to
// Config.Target from which the datagrams go out, and whose answers go back
// to the client from the listening socket, both ways through a delay line.
// A session closes after Config.SessionIdle without traffic. The methods
// mean what they mean on Proxy, except that a cut path drops datagrams
// instead of holding them.
type UDPProxy struct {
	cfg   Config
	clock clockwork.Clock
	log   *slog.Logger
	pm    *pathMetrics
	shape *shaper
	ln    *net.UDPConn
	fwdM  dirMetrics
	revM  dirMetrics

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	target   string
	sessions map[netip.AddrPort]*udpSession
	nextID   uint64
	started  bool
	stopped  bool
}

// udpSession is one client's flow. The listen loop queues its forward
// datagrams; the session owns three goroutines (forward writer, reverse
// reader, reverse writer) joined by close.
type udpSession struct {
	id       uint64
	client   netip.AddrPort
	up       *net.UDPConn
	fwd, rev *line
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	active   atomic.Int64 // clock time of the last datagram, unix ns
	closing  sync.Once
}

// NewUDP validates cfg and binds cfg.Listen (UDP); Start begins relaying.
func NewUDP(cfg Config, deps Deps) (*UDPProxy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	deps = deps.withDefaults()
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	pm := m.forPath(cfg.Path, protoUDP)
	la, err := net.ResolveUDPAddr("udp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("wan: path %s: resolve %s: %w", cfg.Path, cfg.Listen, err)
	}
	ln, err := net.ListenUDP("udp", la)
	if err != nil {
		return nil, fmt.Errorf("wan: path %s: listen udp %s: %w", cfg.Path, cfg.Listen, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &UDPProxy{
		cfg: cfg, clock: deps.Clock, pm: pm, ln: ln,
		log:   deps.Logger.With("path", cfg.Path, "proto", protoUDP),
		shape: newShaper(cfg.Delay, cfg.Jitter, pm),
		fwdM:  pm.dir(dirForward), revM: pm.dir(dirReverse),
		ctx: ctx, cancel: cancel,
		target: cfg.Target, sessions: map[netip.AddrPort]*udpSession{},
	}, nil
}

// Addr is the address the path receives on, host:port.
func (u *UDPProxy) Addr() string { return u.ln.LocalAddr().String() }

// Start begins relaying and the idle sweep. A second Start returns
// ErrStarted, a Start after Stop ErrStopped.
func (u *UDPProxy) Start() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.stopped:
		return ErrStopped
	case u.started:
		return ErrStarted
	}
	u.started = true
	u.wg.Add(2)
	go u.listen()
	// The sweep's ticker is set before Start returns, so that a fake
	// clock advanced after Start ticks it.
	go u.sweep(u.clock.NewTicker(u.cfg.SessionIdle / 2))
	return nil
}

// Stop closes the socket and every session and returns once every
// goroutine has exited. Idempotent; safe before Start.
func (u *UDPProxy) Stop() {
	u.mu.Lock()
	first := !u.stopped
	u.stopped = true
	sessions := u.takeSessions()
	u.mu.Unlock()
	if first {
		u.cancel()
		_ = u.ln.Close()
	}
	for _, s := range sessions {
		u.closeSession(s, dropReset)
	}
	u.wg.Wait()
}

// SetDelay: see Proxy.SetDelay.
func (u *UDPProxy) SetDelay(delay, jitter time.Duration) error {
	if err := u.shape.setDelay(delay, jitter); err != nil {
		return err
	}
	u.log.Info("wan path delay changed", "delay", delay, "jitter", jitter)
	return nil
}

// Delay returns the current one-way delay and jitter.
func (u *UDPProxy) Delay() (delay, jitter time.Duration) { return u.shape.get() }

// Partition cuts the path (on) or heals it. While cut, every datagram is
// dropped (counted with reason partition): those that arrive, and those
// already in a delay line when their time comes. Sessions stay open.
func (u *UDPProxy) Partition(on bool) {
	if u.shape.setPartition(on) {
		u.log.Info("wan path partition changed", "partitioned", on)
	}
}

// Partitioned reports whether the path is cut.
func (u *UDPProxy) Partitioned() bool {
	cut, _ := u.shape.gate()
	return cut
}

// SetTarget changes the far end for sessions opened after the call.
func (u *UDPProxy) SetTarget(target string) error {
	if err := validTarget(target); err != nil {
		return err
	}
	u.mu.Lock()
	u.target = target
	u.mu.Unlock()
	return nil
}

// Reset closes every session, dropping the datagrams their delay lines
// hold (reason reset); the next datagram from a client opens a new one,
// from a new source port. It returns once the sessions are closed.
func (u *UDPProxy) Reset() {
	u.mu.Lock()
	sessions := u.takeSessions()
	u.mu.Unlock()
	u.pm.resets.Inc()
	for _, s := range sessions {
		u.closeSession(s, dropReset)
	}
	u.log.Info("wan path reset", "sessions", len(sessions))
}

// OpenConns is the number of open sessions.
func (u *UDPProxy) OpenConns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.sessions)
}

// takeSessions empties the session table; u.mu must be held.
func (u *UDPProxy) takeSessions() []*udpSession {
	out := make([]*udpSession, 0, len(u.sessions))
	for k, s := range u.sessions {
		out = append(out, s)
		delete(u.sessions, k)
	}
	return out
}

// listen reads datagrams from clients and queues each on its session's
// forward line; a full line or a cut path drops the datagram.
func (u *UDPProxy) listen() {
	defer u.wg.Done()
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := u.ln.ReadFromUDPAddrPort(buf)
		if err != nil {
			if u.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			u.log.Debug("wan path read failed", "err", err)
			continue
		}
		if cut, _ := u.shape.gate(); cut {
			u.fwdM.dropped(dropPartition).Inc()
			continue
		}
		u.forward(from, buf[:n])
	}
}

// forward queues a client's datagram on its session's forward line. The
// table lock is held while queueing, so a session taken out of the table
// (Reset, Stop, idle sweep) gets nothing more queued before it discards
// its line.
func (u *UDPProxy) forward(from netip.AddrPort, b []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.session(from)
	if s == nil {
		return
	}
	now := u.clock.Now()
	s.active.Store(now.UnixNano())
	it := item{data: append([]byte(nil), b...), due: s.fwd.stamp(u.shape, now)}
	s.fwd.hold(len(b))
	select {
	case s.fwd.ch <- it:
	default:
		s.fwd.release(len(b))
		u.fwdM.dropped(dropQueueFull).Inc()
	}
}

// session returns the client's session, opening it if needed; nil when
// the proxy is stopping or the target cannot be dialled. u.mu must be held.
func (u *UDPProxy) session(client netip.AddrPort) *udpSession {
	if s, ok := u.sessions[client]; ok {
		return s
	}
	if u.stopped {
		return nil
	}
	ra, err := net.ResolveUDPAddr("udp", u.target)
	var up *net.UDPConn
	if err == nil {
		up, err = net.DialUDP("udp", nil, ra)
	}
	if err != nil {
		u.pm.dialFailed.Inc()
		u.log.Warn("wan path cannot dial target", "target", u.target, "err", err)
		return nil
	}
	ctx, cancel := context.WithCancel(u.ctx)
	s := &udpSession{
		id: u.nextID, client: client, up: up, cancel: cancel,
		fwd: newLine(u.cfg.Seed, 2*u.nextID, u.cfg.QueueLen, u.fwdM),
		rev: newLine(u.cfg.Seed, 2*u.nextID+1, u.cfg.QueueLen, u.revM),
	}
	s.active.Store(u.clock.Now().UnixNano())
	u.nextID++
	u.sessions[client] = s
	u.pm.conns.Inc()
	u.pm.open.Inc()
	u.wg.Add(1) // released by closeSession
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		u.deliver(ctx, s.fwd, func(b []byte) error { _, err := s.up.Write(b); return err })
	}()
	go func() { defer s.wg.Done(); u.readReverse(ctx, s) }()
	go func() {
		defer s.wg.Done()
		u.deliver(ctx, s.rev, func(b []byte) error { _, err := u.ln.WriteToUDPAddrPort(b, s.client); return err })
	}()
	u.log.Debug("wan session open", "session", s.id, "client", client.String(), "target", u.target)
	return s
}

// readReverse queues the target's answers on the session's reverse line.
func (u *UDPProxy) readReverse(ctx context.Context, s *udpSession) {
	buf := make([]byte, maxDatagram)
	for {
		n, err := s.up.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// ICMP port unreachable from a target that is down: keep
			// the session, the target may come back.
			continue
		}
		now := u.clock.Now()
		s.active.Store(now.UnixNano())
		if cut, _ := u.shape.gate(); cut {
			u.revM.dropped(dropPartition).Inc()
			continue
		}
		it := item{data: append([]byte(nil), buf[:n]...), due: s.rev.stamp(u.shape, now)}
		s.rev.hold(n)
		select {
		case s.rev.ch <- it:
		default:
			s.rev.release(n)
			u.revM.dropped(dropQueueFull).Inc()
		}
	}
}

// deliver sends the line's datagrams at their due times, dropping those
// whose time comes while the path is cut.
func (u *UDPProxy) deliver(ctx context.Context, l *line, send func([]byte) error) {
	for {
		var it item
		select {
		case it = <-l.ch:
		case <-ctx.Done():
			return
		}
		if err := u.shape.waitDue(ctx, u.clock, it.due, false); err != nil {
			l.release(len(it.data))
			l.m.dropped(dropReset).Inc()
			return
		}
		l.release(len(it.data))
		if cut, _ := u.shape.gate(); cut {
			l.m.dropped(dropPartition).Inc()
			continue
		}
		if err := send(it.data); err != nil {
			l.m.dropped(dropError).Inc()
			continue
		}
		l.m.bytes.Add(float64(len(it.data)))
		l.m.packets.Inc()
	}
}

// closeSession stops a session already taken out of the table and joins
// its goroutines; queued datagrams are dropped with reason.
func (u *UDPProxy) closeSession(s *udpSession, reason string) {
	s.closing.Do(func() {
		s.cancel()
		_ = s.up.Close()
		s.wg.Wait()
		if n := s.fwd.discard(); n > 0 {
			s.fwd.m.dropped(reason).Add(float64(n))
		}
		if n := s.rev.discard(); n > 0 {
			s.rev.m.dropped(reason).Add(float64(n))
		}
		u.pm.open.Dec()
		u.wg.Done()
		u.log.Debug("wan session closed", "session", s.id, "reason", reason)
	})
}

// sweep closes sessions idle for Config.SessionIdle, checking at every
// tick of t (half of it).
func (u *UDPProxy) sweep(t clockwork.Ticker) {
	defer u.wg.Done()
	defer t.Stop()
	for {
		select {
		case <-t.Chan():
		case <-u.ctx.Done():
			return
		}
		now := u.clock.Now().UnixNano()
		var idle []*udpSession
		u.mu.Lock()
		for k, s := range u.sessions {
			if now-s.active.Load() >= int64(u.cfg.SessionIdle) {
				idle = append(idle, s)
				delete(u.sessions, k)
			}
		}
		u.mu.Unlock()
		for _, s := range idle {
			u.closeSession(s, dropIdle)
		}
	}
}
