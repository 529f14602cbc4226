package regional

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// BenchmarkProbeDial measures one RTT probe's connect and close on
// loopback, with the prober's dialer (ProbeDial, no keepalive) beside
// net.DialTimeout's defaults (keepalive set on every connection). The
// listener's accepts run in the same process and are counted too.
func BenchmarkProbeDial(b *testing.B) {
	for _, c := range []struct {
		name string
		dial func(network, addr string, timeout time.Duration) (net.Conn, error)
	}{{"probe-dial", ProbeDial}, {"net-default", net.DialTimeout}} {
		b.Run(c.name, func(b *testing.B) {
			lc := net.ListenConfig{KeepAlive: -1}
			ln, err := lc.Listen(b.Context(), "tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					conn, err := ln.Accept()
					if errors.Is(err, net.ErrClosed) {
						return
					}
					if err == nil {
						// As bench.ServeProbeSink: wait for the probe's
						// close, then reset (no TIME_WAIT piles up).
						wg.Go(func() {
							_, _ = io.Copy(io.Discard, conn)
							_ = conn.(*net.TCPConn).SetLinger(0)
							_ = conn.Close()
						})
					}
				}
			})
			defer func() { _ = ln.Close(); wg.Wait() }()
			addr := ln.Addr().String()
			var n, failed float64
			for b.Loop() {
				n++
				conn, err := c.dial("tcp", addr, time.Second)
				if err != nil {
					failed++ // a failed probe, as in a round
					continue
				}
				_ = conn.Close()
			}
			b.ReportMetric(failed/n, "failed/op")
		})
	}
}
