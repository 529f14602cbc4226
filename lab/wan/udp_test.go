package wan

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// udpEcho is a UDP echo server on loopback.
type udpEcho struct {
	conn *net.UDPConn
	wg   sync.WaitGroup
}

func startUDPEcho(t *testing.T) *udpEcho {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	e := &udpEcho{conn: conn}
	e.wg.Go(func() {
		buf := make([]byte, maxDatagram)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			_, _ = conn.WriteToUDPAddrPort(buf[:n], from)
		}
	})
	t.Cleanup(func() {
		_ = conn.Close()
		e.wg.Wait()
	})
	return e
}

func (e *udpEcho) addr() string { return e.conn.LocalAddr().String() }

func newUDPProxy(t *testing.T, cfg Config, deps Deps) *UDPProxy {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = "a-b"
	}
	if deps.Logger == nil {
		deps.Logger = testLogger(t)
	}
	u, err := NewUDP(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Stop)
	return u
}

func dialUDP(t *testing.T, addr string) *net.UDPConn {
	t.Helper()
	ra, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUDP("udp", nil, ra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// udpRoundTrip sends msg and waits for its echo; datagrams are not
// retried, so a lost one fails the test.
func udpRoundTrip(t *testing.T, c *net.UDPConn, msg []byte) time.Duration {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, maxDatagram)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no echo of %q: %v", msg, err)
	}
	if !bytes.Equal(buf[:n], msg) {
		t.Fatalf("echo %q, want %q", buf[:n], msg)
	}
	return time.Since(start)
}

// TestUDPRTTIsTwiceDelay mirrors the TCP test for datagrams: never faster
// than 2×delay; what load adds on top is logged, not bounded.
func TestUDPRTTIsTwiceDelay(t *testing.T) {
	e := startUDPEcho(t)
	u := newUDPProxy(t, Config{Target: e.addr()}, Deps{})
	c := dialUDP(t, u.Addr())
	for _, delay := range []time.Duration{0, 15 * time.Millisecond} {
		if err := u.SetDelay(delay, 0); err != nil {
			t.Fatal(err)
		}
		rtts := make([]time.Duration, 11)
		for i := range rtts {
			rtts[i] = udpRoundTrip(t, c, []byte{byte(i), 'u'})
		}
		slices.Sort(rtts)
		t.Logf("delay %v: UDP RTT min %v median %v", delay, rtts[0], median(rtts))
		if rtts[0] < 2*delay {
			t.Errorf("delay %v: fastest UDP RTT %v is below 2×delay", delay, rtts[0])
		}
	}
	// The echo can reach the client before the proxy counts it.
	eventually(t, "22 datagrams each way, 44 bytes", func() bool {
		return value(u.fwdM.packets) == 22 && value(u.revM.packets) == 22 && value(u.revM.bytes) == 44
	})
	if u.OpenConns() != 1 || value(u.pm.conns) != 1 {
		t.Errorf("%d sessions open, %v opened; want one client, one session", u.OpenConns(), value(u.pm.conns))
	}
}

// TestUDPPartitionDrops: datagrams are dropped while the path is cut, and
// flow again once healed.
func TestUDPPartitionDrops(t *testing.T) {
	e := startUDPEcho(t)
	u := newUDPProxy(t, Config{Target: e.addr()}, Deps{})
	c := dialUDP(t, u.Addr())
	udpRoundTrip(t, c, []byte("before"))
	// The echo can reach the client before the proxy counts the datagram.
	eventually(t, "the first datagram counted", func() bool { return value(u.fwdM.packets) == 1 })
	u.Partition(true)
	if !u.Partitioned() {
		t.Fatal("not cut")
	}
	for range 3 {
		if _, err := c.Write([]byte("lost")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "3 datagrams dropped", func() bool { return value(u.fwdM.dropped(dropPartition)) == 3 })
	if got := value(u.fwdM.packets); got != 1 {
		t.Fatalf("%v datagrams delivered; only the one before the cut may be", got)
	}
	u.Partition(false)
	// The dropped ones never arrive: the next datagram read is the new one.
	udpRoundTrip(t, c, []byte("after"))
}

// TestUDPPartitionDropsQueued: on a fake clock, a datagram whose time comes
// during a cut is dropped, not held.
func TestUDPPartitionDropsQueued(t *testing.T) {
	clk := clockwork.NewFakeClock()
	e := startUDPEcho(t)
	u := newUDPProxy(t, Config{Target: e.addr(), Delay: 10 * time.Millisecond}, Deps{Clock: clk})
	c := dialUDP(t, u.Addr())
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	blockUntil(t, clk, 2) // idle sweep ticker + forward writer
	u.Partition(true)
	clk.Advance(10 * time.Millisecond)
	eventually(t, "queued datagram dropped", func() bool { return value(u.fwdM.dropped(dropPartition)) == 1 })
	u.Partition(false)
	if value(u.fwdM.packets) != 0 || value(u.fwdM.buffered) != 0 {
		t.Error("dropped datagram was delivered or is still held")
	}
}

// TestUDPSessionIdle: a session without traffic for SessionIdle closes; the
// client's next datagram opens a new one.
func TestUDPSessionIdle(t *testing.T) {
	clk := clockwork.NewFakeClock()
	e := startUDPEcho(t)
	u := newUDPProxy(t, Config{Target: e.addr(), SessionIdle: time.Minute}, Deps{Clock: clk})
	c := dialUDP(t, u.Addr())
	udpRoundTrip(t, c, []byte("a"))
	clk.Advance(30 * time.Second) // first sweep: idle 30 s, kept
	clk.Advance(30 * time.Second) // second sweep: idle 60 s, closed
	eventually(t, "idle session closed", func() bool { return u.OpenConns() == 0 })
	udpRoundTrip(t, c, []byte("b"))
	if got := value(u.pm.conns); got != 2 {
		t.Errorf("%v sessions opened, want 2", got)
	}
}

// TestUDPResetAndStop: Reset closes sessions, Stop closes everything and
// refuses a restart.
func TestUDPResetAndStop(t *testing.T) {
	e := startUDPEcho(t)
	u, err := NewUDP(Config{Path: "a-b", Target: e.addr()}, Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Start(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(u.Start(), ErrStarted) {
		t.Error("second Start must return ErrStarted")
	}
	a, b := dialUDP(t, u.Addr()), dialUDP(t, u.Addr())
	udpRoundTrip(t, a, []byte("a"))
	udpRoundTrip(t, b, []byte("b"))
	if u.OpenConns() != 2 {
		t.Fatalf("%d sessions, want 2", u.OpenConns())
	}
	u.Reset()
	if u.OpenConns() != 0 || value(u.pm.resets) != 1 {
		t.Fatal("Reset left sessions open or was not counted")
	}
	udpRoundTrip(t, a, []byte("a2"))
	u.Stop()
	u.Stop()
	if !errors.Is(u.Start(), ErrStopped) {
		t.Error("Start after Stop must return ErrStopped")
	}
	if value(u.pm.open) != 0 {
		t.Error("open sessions gauge not 0 after Stop")
	}
}

// TestUDPSharesPortWithTCP: a path's TCP and UDP proxies listen on one
// port, as memberlist needs.
func TestUDPSharesPortWithTCP(t *testing.T) {
	srv := startEcho(t)
	e := startUDPEcho(t)
	p := newProxy(t, Config{Target: srv.addr()}, Deps{})
	u := newUDPProxy(t, Config{Listen: p.Addr(), Target: e.addr()}, Deps{})
	if u.Addr() != p.Addr() {
		t.Fatalf("UDP on %s, TCP on %s", u.Addr(), p.Addr())
	}
	roundTrip(t, dial(t, p.Addr()), []byte("tcp"))
	udpRoundTrip(t, dialUDP(t, u.Addr()), []byte("udp"))
}

// TestUDPQueueFullDrops: a full delay line drops datagrams instead of
// blocking the path.
func TestUDPQueueFullDrops(t *testing.T) {
	clk := clockwork.NewFakeClock()
	e := startUDPEcho(t)
	u := newUDPProxy(t, Config{Target: e.addr(), Delay: 10 * time.Millisecond, QueueLen: 1}, Deps{Clock: clk})
	c := dialUDP(t, u.Addr())
	send := func(s string) {
		t.Helper()
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	send("1")
	blockUntil(t, clk, 2) // idle sweep + the forward writer holding "1"
	send("2")             // queued
	send("3")             // line full: dropped
	eventually(t, "one drop", func() bool { return value(u.fwdM.dropped(dropQueueFull)) == 1 })
	if got := value(u.fwdM.buffered); got != 2 {
		t.Fatalf("%v bytes held, want 2", got)
	}
	clk.Advance(10 * time.Millisecond)
	eventually(t, "two delivered", func() bool { return value(u.fwdM.packets) == 2 })
}

// TestPath drives a TCP and a UDP proxy on one port together.
func TestPath(t *testing.T) {
	srv := startEcho(t)
	e := startUDPEcho(t)
	// One far end for both protocols, like a memberlist node: here two
	// servers, so the TCP target is changed after construction.
	p, err := NewPath(Config{Path: "a-b", Target: e.addr()}, Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.TCP.SetTarget(srv.addr()); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if p.UDP.Addr() != p.Addr() {
		t.Fatalf("UDP on %s, TCP on %s", p.UDP.Addr(), p.Addr())
	}
	if err := p.SetDelay(-1, 0); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("SetDelay(-1) = %v", err)
	}
	if err := p.SetDelay(10*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := p.UDP.Delay(); d != 10*time.Millisecond {
		t.Errorf("UDP delay %v after Path.SetDelay", d)
	}
	tc := dial(t, p.Addr())
	if _, rtt := roundTrip(t, tc, []byte("tcp")); rtt < 20*time.Millisecond {
		t.Errorf("TCP RTT %v below 2×delay", rtt)
	}
	uc := dialUDP(t, p.Addr())
	if rtt := udpRoundTrip(t, uc, []byte("udp")); rtt < 20*time.Millisecond {
		t.Errorf("UDP RTT %v below 2×delay", rtt)
	}
	p.Partition(true)
	if !p.Partitioned() || !p.UDP.Partitioned() {
		t.Error("Partition did not cut both")
	}
	p.Partition(false)
	p.Reset()
	if p.TCP.OpenConns() != 0 || p.UDP.OpenConns() != 0 {
		t.Error("Reset left connections open")
	}
	p.Stop()
	p.Stop()
}
