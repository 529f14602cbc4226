package wan

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// rttStats measures n round trips of a small message on c.
func rttStats(t *testing.T, c net.Conn, n int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	for i := range out {
		msg := []byte{byte(i), 'p', 'i', 'n', 'g'}
		got, d := roundTrip(t, c, msg)
		if !bytes.Equal(got, msg) {
			t.Fatalf("round trip %d: got %q, want %q", i, got, msg)
		}
		out[i] = d
	}
	slices.Sort(out)
	return out
}

func median(s []time.Duration) time.Duration { return s[len(s)/2] }

// TestRTTIsTwiceDelay: the round trip through a path with one-way delay d
// to a TCP echo server never takes less than 2d. SetDelay changes it for
// the bytes sent after it. How much scheduling adds on top depends on the
// machine's load, so it is logged, not bounded; TestSetDelayExact checks
// the exact delivery time on a fake clock.
func TestRTTIsTwiceDelay(t *testing.T) {
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr()}, Deps{})
	c := dial(t, p.Addr())
	for _, delay := range []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond, 8 * time.Millisecond} {
		if err := p.SetDelay(delay, 0); err != nil {
			t.Fatal(err)
		}
		rtts := rttStats(t, c, 15)
		t.Logf("delay %v: RTT min %v median %v max %v", delay, rtts[0], median(rtts), rtts[len(rtts)-1])
		if rtts[0] < 2*delay {
			t.Errorf("delay %v: fastest RTT %v is below 2×delay", delay, rtts[0])
		}
	}
	if d, j := p.Delay(); d != 8*time.Millisecond || j != 0 {
		t.Errorf("Delay() = %v, %v; want 8ms, 0", d, j)
	}
}

// TestSetDelayExact: on a fake clock a chunk is delivered exactly delay
// after it was read, and a new delay applies to the next chunk, not to one
// already queued.
func TestSetDelayExact(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr(), Delay: 10 * time.Millisecond}, Deps{Clock: clk})
	c := dial(t, p.Addr())
	fwd := p.fwdM.bytes

	// step writes one byte and drives the fake clock until it is back,
	// checking nothing moves before each due time.
	step := func(b byte, want time.Duration) {
		t.Helper()
		start := clk.Now()
		before := value(fwd)
		if _, err := c.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
		blockUntil(t, clk, 1) // the forward writer waits for its due time
		clk.Advance(want - time.Millisecond)
		if got := value(fwd); got != before {
			t.Fatalf("byte %q delivered before its due time", b)
		}
		clk.Advance(time.Millisecond)
		eventually(t, "forward delivery", func() bool { return value(fwd) == before+1 })
		blockUntil(t, clk, 1) // the echo came back; the reverse writer waits
		clk.Advance(want)
		if got := readN(t, c, 1); got[0] != b {
			t.Fatalf("read %q, want %q", got, b)
		}
		if rtt := clk.Since(start); rtt != 2*want {
			t.Errorf("byte %q: fake RTT %v, want %v", b, rtt, 2*want)
		}
	}
	step('a', 10*time.Millisecond)
	if err := p.SetDelay(50*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	step('b', 50*time.Millisecond)

	// A chunk queued under the old delay keeps its time.
	if _, err := c.Write([]byte{'c'}); err != nil {
		t.Fatal(err)
	}
	blockUntil(t, clk, 1)
	if err := p.SetDelay(5*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	clk.Advance(49 * time.Millisecond)
	if value(fwd) != 2 {
		t.Fatal("queued chunk took the new, shorter delay")
	}
	clk.Advance(time.Millisecond)
	eventually(t, "queued chunk delivered at its old time", func() bool { return value(fwd) == 3 })
}

// TestJitterSpreadsRTT: jitter spreads round-trip times over
// 2×(delay ± jitter) around 2×delay. Only the sides that machine load
// cannot produce are checked: a spread at least the jitter, nothing faster
// than 2×(delay-jitter), a median not below 2×delay-slack. That the RTT is
// tight without jitter is TestSetDelayExact's, on a fake clock.
func TestJitterSpreadsRTT(t *testing.T) {
	const delay, jitter, slack = 10 * time.Millisecond, 8 * time.Millisecond, 6 * time.Millisecond
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr(), Delay: delay, Seed: 7}, Deps{})
	c := dial(t, p.Addr())
	steady := rttStats(t, c, 30)
	if err := p.SetDelay(delay, jitter); err != nil {
		t.Fatal(err)
	}
	jittered := rttStats(t, c, 30)
	// p10..p90 spread: robust to a scheduling outlier on a busy machine.
	spread := func(s []time.Duration) time.Duration { return s[len(s)*9/10] - s[len(s)/10] }
	t.Logf("no jitter: RTT %v..%v; jitter ±%v: RTT %v..%v median %v", steady[0], steady[len(steady)-1], jitter, jittered[0], jittered[len(jittered)-1], median(jittered))
	t.Logf("p10..p90 spread without jitter %v, with ±%v jitter %v", spread(steady), jitter, spread(jittered))
	// Two uniform ±8 ms samples per round trip: p10..p90 is about 17 ms.
	if s := spread(jittered); s < jitter {
		t.Errorf("RTT p10..p90 spread with jitter ±%v is only %v", jitter, s)
	}
	if jittered[0] < 2*(delay-jitter) {
		t.Errorf("fastest jittered RTT %v below 2×(delay-jitter) = %v", jittered[0], 2*(delay-jitter))
	}
	if m := median(jittered); m < 2*delay-slack {
		t.Errorf("median jittered RTT %v, want at least %v - %v", m, 2*delay, slack)
	}
}

// TestJitterNeverReorders sends a numbered stream through a path whose
// jitter exceeds its delay (samples 0..4 ms), read in 4-byte chunks so
// that every number gets its own delay sample, in both directions, and
// checks every number arrives once, in order.
func TestJitterNeverReorders(t *testing.T) {
	const n = 4000
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr(), Delay: time.Millisecond, Jitter: 3 * time.Millisecond, Seed: 42, ChunkSize: 4}, Deps{})
	c := dial(t, p.Addr())
	_ = c.SetDeadline(time.Now().Add(waitLimit))
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() {
		var b [4]byte
		for i := range uint32(n) {
			binary.BigEndian.PutUint32(b[:], i)
			if _, err := c.Write(b[:]); err != nil {
				werr = err
				return
			}
		}
		werr = c.CloseWrite()
	})
	got, err := io.ReadAll(c)
	wg.Wait()
	if werr != nil {
		t.Fatalf("write: %v", werr)
	}
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if len(got) != 4*n {
		t.Fatalf("read %d bytes back, want %d", len(got), 4*n)
	}
	for i := range uint32(n) {
		if v := binary.BigEndian.Uint32(got[4*i:]); v != i {
			t.Fatalf("number %d arrived at position %d: stream reordered", v, i)
		}
	}
	t.Logf("%d numbers in order, %v bytes forward", n, value(p.fwdM.bytes))
}

// TestPartitionHoldsAndHeals: while cut, bytes of an open connection are
// held and a new connection's dial waits; on heal both deliver.
func TestPartitionHoldsAndHeals(t *testing.T) {
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr()}, Deps{})
	old := dial(t, p.Addr())
	if got, _ := roundTrip(t, old, []byte("hi")); string(got) != "hi" {
		t.Fatalf("got %q", got)
	}
	p.Partition(true)
	p.Partition(true) // no-op
	if !p.Partitioned() || value(p.pm.partitioned) != 1 {
		t.Fatal("path not reported cut")
	}
	if _, err := old.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	fresh := dial(t, p.Addr())
	if _, err := fresh.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "7 bytes held", func() bool { return value(p.fwdM.buffered) == 7 })
	if got := value(p.fwdM.bytes); got != 2 {
		t.Fatalf("%v bytes forwarded during the partition; want only the 2 from before", got)
	}
	if got := srv.accepted.Load(); got != 1 {
		t.Fatalf("target accepted %d connections during the partition; want 1", got)
	}
	p.Partition(false)
	if got := readN(t, old, 4); string(got) != "held" {
		t.Errorf("old connection after heal: %q", got)
	}
	if got := readN(t, fresh, 3); string(got) != "new" {
		t.Errorf("new connection after heal: %q", got)
	}
	if got := srv.accepted.Load(); got != 2 {
		t.Errorf("target accepted %d connections after heal; want 2", got)
	}
	if value(p.pm.partitioned) != 0 {
		t.Error("partition gauge not back to 0")
	}
	// A chunk is released once its write returned, maybe after the echo.
	eventually(t, "held bytes released", func() bool { return value(p.fwdM.buffered) == 0 })
}

// TestPartitionHoldsPastDueTime: on a fake clock, a chunk whose due time
// passes during a cut goes out at the heal, not before.
func TestPartitionHoldsPastDueTime(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr(), Delay: 10 * time.Millisecond}, Deps{Clock: clk})
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	blockUntil(t, clk, 1)
	clk.Advance(5 * time.Millisecond)
	p.Partition(true)
	clk.Advance(time.Second)
	if value(p.fwdM.bytes) != 0 || value(p.fwdM.buffered) != 1 {
		t.Fatal("byte delivered through a cut path")
	}
	p.Partition(false)
	eventually(t, "held byte delivered at heal", func() bool { return value(p.fwdM.bytes) == 1 })
}

// TestResetClosesConnections: Reset drops every open connection with a
// reset, and the path keeps accepting.
func TestResetClosesConnections(t *testing.T) {
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr()}, Deps{})
	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	roundTrip(t, a, []byte("a"))
	roundTrip(t, b, []byte("b"))
	p.Reset()
	if n := p.OpenConns(); n != 0 {
		t.Fatalf("%d connections open after Reset", n)
	}
	for _, c := range []net.Conn{a, b} {
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		_, err := c.Read(make([]byte, 1))
		if !isClosed(err) {
			t.Errorf("read after Reset: %v, want a reset or EOF", err)
		}
	}
	if value(p.pm.resets) != 1 {
		t.Error("reset not counted")
	}
	c := dial(t, p.Addr())
	if got, _ := roundTrip(t, c, []byte("again")); string(got) != "again" {
		t.Errorf("after Reset: %q", got)
	}
}

// TestHalfClose: a client's EOF reaches the target after the delay and
// the target's answer and EOF come back.
func TestHalfClose(t *testing.T) {
	srv := startEcho(t)
	p := newProxy(t, Config{Target: srv.addr(), Delay: 2 * time.Millisecond, ChunkSize: 1000}, Deps{})
	c := dial(t, p.Addr())
	_ = c.SetDeadline(time.Now().Add(waitLimit))
	msg := bytes.Repeat([]byte("0123456789"), 20000)
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() {
		if _, werr = c.Write(msg); werr == nil {
			werr = c.CloseWrite()
		}
	})
	got, err := io.ReadAll(c)
	wg.Wait()
	if werr != nil || err != nil {
		t.Fatalf("write %v, read %v", werr, err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %d bytes back, want %d equal ones", len(got), len(msg))
	}
	eventually(t, "connection closed", func() bool { return p.OpenConns() == 0 })
}

// TestDialFailure: when the target is down the client's connection is
// closed and the failure counted.
func TestDialFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	p := newProxy(t, Config{Target: dead}, Deps{})
	c := dial(t, p.Addr())
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := c.Read(make([]byte, 1)); !isClosed(err) {
		t.Fatalf("read: %v, want the connection closed", err)
	}
	eventually(t, "dial failure counted", func() bool { return value(p.pm.dialFailed) == 1 })

	// SetTarget points later connections at a live target.
	srv := startEcho(t)
	if err := p.SetTarget("nonsense"); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("SetTarget(nonsense) = %v", err)
	}
	if err := p.SetTarget(srv.addr()); err != nil {
		t.Fatal(err)
	}
	c2 := dial(t, p.Addr())
	if got, _ := roundTrip(t, c2, []byte("up")); string(got) != "up" {
		t.Errorf("after SetTarget: %q", got)
	}
}

// TestStopClosesEverything: Stop closes open connections (also one whose
// dial waits for a heal) and the listener, and joins every goroutine
// (goleak checks at exit).
func TestStopClosesEverything(t *testing.T) {
	srv := startEcho(t)
	p, err := New(Config{Path: "a-b", Target: srv.addr(), Delay: time.Millisecond}, Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); !errors.Is(p.Start(), ErrStarted) || err != nil {
		t.Fatalf("Start: %v; second Start must return ErrStarted", err)
	}
	open := dial(t, p.Addr())
	roundTrip(t, open, []byte("x"))
	if _, err := open.Write([]byte("in flight")); err != nil {
		t.Fatal(err)
	}
	p.Partition(true)
	waiting := dial(t, p.Addr())
	eventually(t, "two connections", func() bool { return p.OpenConns() == 2 })
	p.Stop()
	p.Stop() // idempotent
	for _, c := range []net.Conn{open, waiting} {
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		if _, err := io.ReadAll(c); err != nil && !isClosed(err) {
			t.Errorf("read after Stop: %v", err)
		}
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), waitLimit); err == nil {
		_ = c.Close()
		t.Error("listener still accepts after Stop")
	}
	if !errors.Is(p.Start(), ErrStopped) {
		t.Error("Start after Stop must return ErrStopped")
	}
	if value(p.pm.open) != 0 || value(p.fwdM.buffered) != 0 || value(p.revM.buffered) != 0 {
		t.Error("gauges not back to 0 after Stop")
	}
}

// TestStopBeforeStart releases the listener.
func TestStopBeforeStart(t *testing.T) {
	p, err := New(Config{Path: "a-b", Target: "127.0.0.1:9"}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	addr := p.Addr()
	p.Stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("port still held after Stop: %v", err)
	}
	_ = ln.Close()
}

// TestSharedRegistry: several paths register into one registry and keep
// their series apart.
func TestSharedRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	srv := startEcho(t)
	ab := newProxy(t, Config{Path: "a-b", Target: srv.addr()}, Deps{Registerer: reg})
	ac := newProxy(t, Config{Path: "a-c", Target: srv.addr()}, Deps{Registerer: reg})
	roundTrip(t, dial(t, ab.Addr()), []byte("12345"))
	roundTrip(t, dial(t, ac.Addr()), []byte("1"))
	eventually(t, "a-b: 5 bytes each way, a-c: 1", func() bool {
		return value(ab.fwdM.bytes) == 5 && value(ab.revM.bytes) == 5 && value(ac.fwdM.bytes) == 1 && value(ac.revM.bytes) == 1
	})
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

// TestResetPropagates: a client's RST reaches the target as a reset, after
// the bytes sent before it.
func TestResetPropagates(t *testing.T) {
	got := make(chan error, 1)
	srv := startServer(t, func(c net.Conn) {
		b, err := io.ReadAll(c)
		if err == nil {
			err = errors.New("clean EOF")
		}
		got <- fmt.Errorf("%d bytes, then %w", len(b), err)
	})
	p := newProxy(t, Config{Target: srv.addr(), Delay: 2 * time.Millisecond}, Deps{})
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bytes delivered", func() bool { return value(p.fwdM.bytes) == 10 })
	_ = c.SetLinger(0)
	_ = c.Close()
	select {
	case err := <-got:
		if !strings.HasPrefix(err.Error(), "10 bytes") || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("target saw %v; want the 10 bytes, then a connection reset", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("target never saw the end of the connection")
	}
}

// TestBackPressure: while cut, a path holds at most QueueLen chunks (plus
// one being queued and one waiting to be written) per direction and the
// sender blocks; on heal every byte arrives, in order.
func TestBackPressure(t *testing.T) {
	const total = 256 << 10
	sum := make(chan []byte, 1)
	srv := startServer(t, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		sum <- b
	})
	p := newProxy(t, Config{Target: srv.addr(), ChunkSize: 10, QueueLen: 2}, Deps{})
	p.Partition(true)
	c := dial(t, p.Addr())
	msg := make([]byte, total)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() {
		if _, werr = c.Write(msg); werr == nil {
			werr = c.CloseWrite()
		}
	})
	defer wg.Wait()
	// The dial waits for the heal, so no writer pops a chunk: 2 queued
	// plus 1 blocked in the reader.
	eventually(t, "line full", func() bool { return value(p.fwdM.buffered) == 30 })
	p.Partition(false)
	select {
	case b := <-sum:
		if !bytes.Equal(b, msg) {
			t.Fatalf("target got %d bytes, not the %d sent in order", len(b), total)
		}
	case <-time.After(waitLimit):
		t.Fatal("transfer did not finish after heal")
	}
	wg.Wait()
	if werr != nil {
		t.Fatal(werr)
	}
}
