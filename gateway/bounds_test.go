package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// rawRequest is the head of a completion request with a body of n bytes
// that the caller sends (or not) itself.
func rawRequest(n int) string {
	return fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nx-isobar-model: %s\r\nContent-Length: %d\r\n\r\n", model, n)
}

// readStatus reads one HTTP response head from c, 0 when none came.
func readStatus(c net.Conn) int {
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// A slowloris (300 connections, each sending its body one byte at a time)
// is cut at the read timeout, each connection answered 408 and closed,
// and the gateway serves other clients meanwhile.
func TestSlowlorisIsCutAndOthersServed(t *testing.T) {
	a := engine(t, model, 4096, nil, 0)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096)))
	const (
		conns       = 300
		readTimeout = 2 * time.Second
		bodyBytes   = 1000 // at one byte per tick: minutes, far beyond the timeout
		tick        = 200 * time.Millisecond
	)
	g := startGateway(t, ctrl, Config{ReadTimeout: readTimeout}, Deps{})
	d := net.Dialer{}
	var (
		wg     sync.WaitGroup
		open   atomic.Int64
		mu     sync.Mutex
		status = map[int]int{}
	)
	begin := time.Now()
	for range conns {
		c, err := d.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, rawRequest(bodyBytes)); err != nil {
			t.Fatal(err)
		}
		open.Add(1)
		done := make(chan struct{})
		wg.Go(func() { // the attack: one byte per tick, bounded by the body
			tk := time.NewTicker(tick)
			defer tk.Stop()
			for range bodyBytes - 1 {
				select {
				case <-done:
					return
				case <-tk.C:
				}
				if _, err := c.Write([]byte("a")); err != nil {
					return
				}
			}
		})
		wg.Go(func() {
			defer close(done)
			st := readStatus(c)
			_, _ = io.Copy(io.Discard, c) // until the gateway closes it
			open.Add(-1)
			mu.Lock()
			status[st]++
			mu.Unlock()
		})
	}
	// Meanwhile, with the slow connections held, other clients are served.
	eventually.True(t, testTimeout, "the slow requests in flight", func() bool {
		return g.metric(t, "isobar_gateway_inflight_requests", nil) >= 1
	})
	served := 0
	for range 5 {
		if r := g.completion(t, model, 10, nil); r.status == http.StatusOK {
			served++
		}
	}
	stillOpen := open.Load()
	if served != 5 {
		t.Errorf("%d of 5 normal requests served during the slowloris, want all", served)
	}
	eventually.True(t, testTimeout, "every slow connection cut", func() bool { return open.Load() == 0 })
	elapsed := time.Since(begin)
	wg.Wait()
	t.Logf("slowloris %d conns, read timeout %v: all closed %.1fs after the first opened; 5/5 normal requests served with %d slow conns still open",
		conns, readTimeout, elapsed.Seconds(), stillOpen)
	if status[http.StatusRequestTimeout] != conns {
		t.Errorf("slow connections answered %v, want %d × 408", status, conns)
	}
	if n := g.metric(t, "isobar_gateway_bad_requests_total", map[string]string{"reason": "timeout"}); n != conns {
		t.Errorf("timeout count %v, want %d", n, conns)
	}
	eventually.True(t, testTimeout, "no request in flight", func() bool { return g.metric(t, "isobar_gateway_inflight_requests", nil) == 0 })
}

// streamingUpstream answers every request with an endless SSE stream
// (bounded: 256 MiB or the request's end).
func streamingUpstream(t *testing.T) string {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	chunk := []byte("data: " + strings.Repeat("x", 32<<10) + "\n\n")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range (256 << 20) / len(chunk) {
			if r.Context().Err() != nil {
				return
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
			_ = rc.Flush()
		}
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// smallBufListener shrinks each accepted connection's send buffer, so that
// a client that does not read stalls the gateway's writes at once.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// A client that stops reading a streamed answer is cut at the route's
// timeout: the handler returns, and its request and upstream slots are
// freed.
func TestStalledReaderIsCutAtRouteTimeout(t *testing.T) {
	up := streamingUpstream(t)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{RouteTimeout: 2 * time.Second}, oneModel(model, endpointOf(t, "s", up, 1, 4096)))
	g := startGatewayOn(t, ctrl, Config{}, Deps{}, smallBufListener{listen(t, "127.0.0.1:0")})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := fmt.Sprintf(`{"model":%q,"prompt":"hi","stream":true}`, model)
	if _, err := io.WriteString(c, rawRequest(len(body))+body); err != nil {
		t.Fatal(err)
	}
	// The stream started; the client reads nothing.
	eventually.True(t, testTimeout, "the stream in flight", func() bool {
		return g.metric(t, "isobar_gateway_upstream_inflight_requests", map[string]string{"endpoint": "s"}) == 1
	})
	started := time.Now()
	eventually.True(t, testTimeout, "the stalled stream cut", func() bool {
		return g.metric(t, "isobar_gateway_inflight_requests", nil) == 0 &&
			g.metric(t, "isobar_gateway_upstream_inflight_requests", map[string]string{"endpoint": "s"}) == 0
	})
	t.Logf("stalled reader (route timeout 2s): request and upstream slots freed %.1fs after the stream started", time.Since(started).Seconds())
}

// blockingUpstream holds every request until release is closed (or the
// request ends), then answers a small completion.
func blockingUpstream(t *testing.T) (addr string, arrived *atomic.Int64, release chan struct{}) {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	release = make(chan struct{})
	arrived = new(atomic.Int64)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x"}]}`)
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String(), arrived, release
}

// Past MaxInflightRequests the gateway answers 503 at once, before reading
// the body, and counts it; the requests it holds are unaffected.
func TestInflightCapAnswers503(t *testing.T) {
	up, arrived, release := blockingUpstream(t)
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, endpointOf(t, "b", up, 1, 4096)))
	g := startGateway(t, ctrl, Config{MaxInflightRequests: 2}, Deps{})
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i := range statuses {
		wg.Go(func() { statuses[i] = g.completion(t, model, 10, nil).status })
	}
	eventually.True(t, testTimeout, "two requests held upstream", func() bool { return arrived.Load() == 2 })

	// A third, whose body never comes: refused without waiting for it.
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, rawRequest(100)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl) // a test bound only: the answer comes at once
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("third request: no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("third request: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := g.metric(t, "isobar_gateway_overload_refused_total", nil); n != 1 {
		t.Errorf("overload refusals %v, want 1", n)
	}
	close(release)
	wg.Wait()
	if statuses[0] != http.StatusOK || statuses[1] != http.StatusOK {
		t.Errorf("held requests: %v, want both served", statuses)
	}
	// With room again, a request is served.
	if r := g.completion(t, model, 10, nil); r.status != http.StatusOK {
		t.Errorf("after the burst: %d", r.status)
	}
}

// A request whose headers name its model and length is routed, and shed
// by the plan, before its body is read: a client cannot make the gateway
// wait for (or hold) the body of a request the plan refuses.
func TestShedBeforeBody(t *testing.T) {
	a := engine(t, model, 4096, nil, 0)
	st := oneModel(model, endpointOf(t, "a", a.Addr(), 1, 4096))
	st.Models[0].Shed = 1
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	g := startGateway(t, ctrl, Config{}, Deps{})
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, rawRequest(1<<20)); err != nil { // the body never comes
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(testTimeout)) // a test bound only
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer before the body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get(xdscontract.ShedHeader) != "plan" {
		t.Errorf("answer %d (%s %q), want the plan's 429", resp.StatusCode, xdscontract.ShedHeader, resp.Header.Get(xdscontract.ShedHeader))
	}
	if n := g.metric(t, "isobar_gateway_shed_total", map[string]string{"reason": "fault"}); n != 1 {
		t.Errorf("shed count %v, want 1", n)
	}
}
