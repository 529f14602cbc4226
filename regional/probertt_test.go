package regional

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestProbeTakesTheKernelsRTT: a connect whose goroutine resumed late (the
// fake clock moves 300 ms inside the dial, as a busy controller's
// scheduling delay would) is sampled at the handshake's round trip as
// the kernel measured it, not at the connect's wall time; a connection
// that is not TCP is timed by the clock.
func TestProbeTakesTheKernelsRTT(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the kernel's TCP_INFO round trip is read on Linux only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	const late = 300 * time.Millisecond
	for _, tcp := range []bool{true, false} {
		m, cells := probeTestCells(t, 1)
		view := newView(time.Time{}, 1, cells, nil)
		clock := clockwork.NewFakeClock()
		var got []probeResult
		p := &prober{interval: time.Second, timeout: 5 * time.Second, view: func() *View { return view },
			clock: clock, log: slog.New(slog.DiscardHandler), metrics: m, est: map[string]*probeEstimate{},
			dial: func(network, _ string, timeout time.Duration) (net.Conn, error) {
				clock.Advance(late)
				if !tcp {
					a, b := net.Pipe()
					_ = b.Close()
					return a, nil
				}
				return ProbeDial(network, ln.Addr().String(), timeout)
			},
			submit: func(_ context.Context, r []probeResult) error { got = r; return nil },
		}
		p.round(context.Background())
		if len(got) != 1 || !got[0].ok {
			t.Fatalf("tcp %v: probe results %+v, want one that succeeded", tcp, got)
		}
		switch rtt := got[0].rtt; {
		case !tcp && rtt != late:
			t.Errorf("a pipe's probe sampled %v, want the clock's %v", rtt, late)
		case tcp && (rtt <= 0 || rtt >= late):
			t.Errorf("a loopback TCP probe sampled %v, want the kernel's handshake round trip (> 0, not the %v the clock moved)", rtt, late)
		}
	}
}

// TestKernelRTT: a loopback TCP connection has the kernel's sample; a
// connection that is not TCP has none.
func TestKernelRTT(t *testing.T) {
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	if rtt, ok := kernelRTT(a); ok {
		t.Errorf("a pipe has a kernel round trip %v", rtt)
	}
	if runtime.GOOS != "linux" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	c, err := ProbeDial("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if rtt, ok := kernelRTT(c); !ok || rtt <= 0 {
		t.Errorf("loopback TCP: kernel round trip %v (ok %v), want a positive sample", rtt, ok)
	}
}
