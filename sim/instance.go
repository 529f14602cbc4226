package sim

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// instance is one incarnation of an engine process: its listener and HTTP
// server, scheduler goroutine and vLLM metrics. A kill or stop ends it; a
// restart builds a new one.
type instance struct {
	e      *Engine
	ctx    context.Context
	cancel context.CancelFunc
	ln     net.Listener
	srv    *http.Server
	mux    *http.ServeMux
	sched  *scheduler
	vm     *vllmMetrics
	track  tracker
	wg     sync.WaitGroup // serve and scheduler goroutines

	hangWaiting atomic.Int64 // requests held at the hang gate
}

func newInstance(e *Engine, ln net.Listener) (*instance, error) {
	vm, err := newVLLMMetrics(e.cfg.Model, e.cfg.MaxModelLen)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{e: e, ctx: ctx, cancel: cancel, ln: ln}
	in.vm = vm
	in.sched = newScheduler(e, in.vm)
	in.mux = http.NewServeMux()
	in.mux.HandleFunc("POST /v1/completions", in.handleGenerate(false))
	in.mux.HandleFunc("POST /v1/chat/completions", in.handleGenerate(true))
	in.mux.HandleFunc("GET /v1/models", in.handleModels)
	in.mux.HandleFunc("GET /health", in.handleHealth)
	in.mux.HandleFunc("GET /metrics", in.vm.serveMetrics)
	in.srv = &http.Server{
		Handler:           in,
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelDebug),
	}
	return in, nil
}

func (in *instance) start() {
	in.wg.Add(2)
	go func() {
		defer in.wg.Done()
		if err := in.srv.Serve(in.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			in.e.log.Error("engine serve failed", "err", err)
		}
	}()
	go func() {
		defer in.wg.Done()
		in.sched.run(in.ctx)
	}()
}

// kill closes the listener and every connection at once, cancels all work
// and waits for every goroutine of the incarnation.
func (in *instance) kill() {
	_ = in.srv.Close()
	in.cancel()
	in.track.closeAndWait()
	in.wg.Wait()
}

// shutdown stops accepting and lets in-flight requests finish (the
// scheduler keeps stepping) until ctx is done, then kills what is left.
func (in *instance) shutdown(ctx context.Context) error {
	err := in.srv.Shutdown(ctx)
	in.kill()
	return err
}

// vLLM's API server does not instrument these paths.
var uninstrumented = map[string]bool{"/metrics": true, "/health": true, "/load": true, "/ping": true, "/version": true}

// ServeHTTP tracks the handler, waits out a hang, and records the request
// the way prometheus-fastapi-instrumentator does.
func (in *instance) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !in.track.enter() {
		return
	}
	defer in.track.exit()
	start := in.e.clock.Now()
	if gate := in.e.hangGate(); gate != nil {
		in.hangWaiting.Add(1)
		select {
		case <-gate:
			in.hangWaiting.Add(-1)
		case <-r.Context().Done():
			in.hangWaiting.Add(-1)
			return
		}
		if in.ctx.Err() != nil {
			return
		}
	}
	h, pattern := in.mux.Handler(r)
	handler := "none"
	if _, path, ok := strings.Cut(pattern, " "); ok {
		handler = path
	}
	if uninstrumented[handler] {
		h.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	h.ServeHTTP(sw, r)
	if in.ctx.Err() != nil {
		return // killed mid-request: this incarnation's metrics are gone
	}
	in.vm.observeHTTP(r.Method, handler, sw.status, in.e.clock.Since(start).Seconds())
}

// statusWriter records the status code; Unwrap lets http.ResponseController
// reach the underlying writer to flush.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wroteHeader {
		s.status, s.wroteHeader = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wroteHeader = true
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// tracker counts running handlers so that a kill can wait for all of them;
// once closed it admits no more.
type tracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{}
}

func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) exit() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.zero != nil {
		close(t.zero)
		t.zero = nil
	}
}

func (t *tracker) closeAndWait() {
	t.mu.Lock()
	t.closed = true
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	if t.zero == nil {
		t.zero = make(chan struct{})
	}
	z := t.zero
	t.mu.Unlock()
	<-z
}
