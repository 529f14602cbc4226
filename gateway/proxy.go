package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/internal/backoff"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// statusClientClosed is recorded for a request whose client went away
// before an answer (nginx's 499); nothing is written.
const statusClientClosed = 499

// hopByHop are the connection-specific headers a proxy does not forward.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
	for _, c := range src.Values("Connection") {
		for _, f := range strings.Split(c, ",") {
			dst.Del(strings.TrimSpace(f))
		}
	}
	for _, h := range hopByHop {
		dst.Del(h)
	}
}

// errorBody is the OpenAI error shape.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	var b errorBody
	b.Error.Message, b.Error.Code = msg, status
	switch {
	case status == http.StatusTooManyRequests:
		b.Error.Type = "RateLimitError"
		w.Header().Set("Retry-After", "1")
	case status == http.StatusNotFound:
		b.Error.Type = "NotFoundError"
	case status >= 500:
		b.Error.Type = "ServiceUnavailableError"
	default:
		b.Error.Type = "BadRequestError"
	}
	out, _ := json.Marshal(b)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(out, '\n'))
}

// outcome is what happened to one client request, for metrics and reports.
type outcome struct {
	model  string
	status int
	shed   string // "fault" or "saturated" when refused with 429 by the gateway
}

// handleGenerate serves one completion request: admission, routing (before
// the body is read when the headers allow), the body, then proxy.
func (g *Gateway) handleGenerate(w http.ResponseWriter, r *http.Request) {
	start := g.clock.Now()
	// Admission first: a gateway that holds its limit reads nothing more.
	if g.inflight.Add(1) > int64(g.cfg.MaxInflightRequests) {
		g.inflight.Add(-1)
		g.m.overloadRefused.Inc()
		g.m.requests.WithLabelValues("unknown", statusClass(http.StatusServiceUnavailable)).Inc()
		w.Header().Set("Retry-After", "1")
		abandonBody(w)
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("the gateway holds %d requests, its limit; retry later", g.cfg.MaxInflightRequests))
		return
	}
	defer g.inflight.Add(-1)
	g.m.inflight.Inc()
	defer g.m.inflight.Dec()
	q := &generation{g: g, w: w, r: r, out: outcome{model: "unknown"}}
	defer func() {
		g.m.requests.WithLabelValues(q.out.model, statusClass(q.out.status)).Inc()
		g.m.duration.WithLabelValues(q.out.model).Observe(g.clock.Since(start).Seconds())
	}()
	// With the model in its header and the body's length declared, the
	// route and the plan's shed share are settled before the body is read:
	// a request refused there is never read.
	headerModel := r.Header.Get(g.cfg.ModelHeader)
	early := headerModel != "" && r.ContentLength >= 0 && r.ContentLength <= g.cfg.MaxBodyBytes
	if early && !q.route(headerModel, int(r.ContentLength)) {
		abandonBody(w)
		return
	}
	body, ok := q.readBody()
	if !ok {
		return
	}
	if !early {
		model := headerModel
		if model == "" {
			var err error
			if model, err = BodyModel(body); err != nil {
				q.fail(http.StatusBadRequest, "malformed", strings.TrimPrefix(err.Error(), ErrBadRequest.Error()+": "))
				return
			}
		}
		if !q.route(model, len(body)) {
			return
		}
	}
	cl := q.t.clusters[q.rt.Cluster]
	if cl == nil {
		q.fail(http.StatusServiceUnavailable, "", fmt.Sprintf("cluster %q not found", q.rt.Cluster))
		return
	}
	ctx := r.Context()
	if q.rt.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = clockwork.WithTimeout(ctx, g.clock, q.rt.Timeout)
		defer cancel()
	}
	defer cutStalledWrites(ctx, w)()
	tokens := placement.PromptTokens(r.Header, len(body))
	q.out.status = g.proxy(ctx, w, r, body, tokens, g.promptChain(body), q.rt, cl, q.out.model, start, &q.class, q.shed)
}

// generation is one completion request on its way through handleGenerate,
// owned by the request's handler goroutine.
type generation struct {
	g   *Gateway
	w   http.ResponseWriter
	r   *http.Request
	out outcome
	hop bool // the hop header's proof held (set by route)
	// class is the request's class (set by route: classify).
	class classOf
	// t and rt are the table and the route the request matched (route).
	t  *table
	rt *xdsclient.Route
}

// shed counts a refusal before the client can see it.
func (q *generation) shed(reason string) {
	q.out.shed = reason
	if reason == "fault" {
		q.w.Header().Set(xdscontract.ShedHeader, "plan")
	} else {
		q.w.Header().Set(xdscontract.ShedHeader, reason)
	}
	q.g.m.shed.WithLabelValues(q.out.model, reason).Inc()
	if !q.hop {
		q.g.rep.addShed(q.out.model, &q.class)
	}
}

// fail answers the request with the gateway's error, counted under reason
// ("": not a bad request).
func (q *generation) fail(status int, reason, msg string) {
	if reason != "" {
		q.g.m.badRequests.WithLabelValues(reason).Inc()
	}
	q.out.status = status
	writeError(q.w, status, msg)
}

// route matches the request (model, body length) and settles what the
// plan says of it: its model label, its demand, the route's shed share.
// false: it has been answered.
func (q *generation) route(model string, bodyLen int) bool {
	g, r := q.g, q.r
	if q.t = g.tbl.Load(); q.t == nil || q.t.vhosts == nil {
		q.fail(http.StatusServiceUnavailable, "", "the gateway has no route configuration yet")
		return false
	}
	// Only an authenticated isobar gateway's request keeps the hop header
	// (hop.go); anyone else's is routed, shed and counted as a client's.
	q.hop, _ = g.trustHop(r.Header, q.t.internalOnly)
	// The class headers are settled and rewritten before the match, so
	// that the per-criticality and residency routes see the gateway's
	// decision, not the client's claim.
	q.class, _, _ = g.classify(r.Header, r.RemoteAddr, q.hop, model)
	view := newRequestView(r, g.cfg.ModelHeader, model, bodyLen)
	if vh := xdsclient.SelectVirtualHost(q.t.vhosts, strings.ToLower(r.Host)); vh != nil {
		q.rt = xdsclient.MatchRoute(vh, r.URL.RequestURI(), view)
	}
	if q.rt == nil {
		code, msg := q.class.noRoute(model)
		q.fail(code, "", msg)
		return false
	}
	q.out.model = q.rt.Model
	if q.out.model == "" {
		q.out.model = q.t.soleModel
	}
	if q.out.model == "" {
		q.out.model = "unknown"
	}
	if !q.hop {
		g.rep.addDemand(q.out.model, &q.class)
	}
	if q.rt.AbortPerMillion > 0 && rand.Uint32N(1_000_000) < q.rt.AbortPerMillion {
		reason, msg := q.class.abortMessage(q.rt.AbortStatus)
		if q.rt.AbortStatus == http.StatusTooManyRequests || reason == "residency" {
			q.shed(reason)
		}
		q.fail(q.rt.AbortStatus, "", msg)
		return false
	}
	return true
}

// readBody reads the request body, capped at Config.MaxBodyBytes; false:
// the request has been answered. The body arrives within the server's
// ReadTimeout (set when the request began) or is cut; the deadline is
// lifted once it is in, so that the server's background read does not end
// a long answer.
func (q *generation) readBody() ([]byte, bool) {
	g := q.g
	body, err := io.ReadAll(http.MaxBytesReader(q.w, q.r.Body, g.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			q.fail(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body exceeds %d bytes", g.cfg.MaxBodyBytes))
		case errors.Is(err, os.ErrDeadlineExceeded):
			q.w.Header().Set("Connection", "close")
			q.fail(http.StatusRequestTimeout, "timeout", fmt.Sprintf("request body not received within %v", g.cfg.ReadTimeout))
		default:
			q.fail(http.StatusBadRequest, "unreadable", "could not read the request body")
		}
		return nil, false
	}
	_ = http.NewResponseController(q.w).SetReadDeadline(time.Time{})
	return body, true
}

// abandonBody makes the answer being written the connection's last, its
// request body unread: "Connection: close" spares net/http draining the
// body before the answer (chunkWriter.writeHeader), and a read deadline in
// the past keeps the body's Close from draining it afterwards (body.Close
// reads up to 256 KiB), so a slow body holds nothing. Call it before the
// answer is written.
func abandonBody(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}

// stallGrace is how long a write may still take once the request's context
// has ended (its route timeout, or the client gone): enough for an error
// answer to reach a client that reads, not for a stalled reader to keep
// its slot.
const stallGrace = time.Second

// cutStalledWrites arranges that when ctx ends, a write to w blocked on a
// client that does not read fails within stallGrace (a write deadline:
// http.ResponseController.SetWriteDeadline), so that the handler returns
// and its slots are freed. Call the returned func before the handler
// returns: it lifts the deadline again if it was set, so that a
// keep-alive connection is not poisoned for its next request. Write
// deadlines are real time: the net package knows no other clock.
func cutStalledWrites(ctx context.Context, w http.ResponseWriter) (stop func()) {
	rc := http.NewResponseController(w)
	cut := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(cut)
		_ = rc.SetWriteDeadline(time.Now().Add(stallGrace))
	})
	return func() {
		if !stopAfter() {
			<-cut
			_ = rc.SetWriteDeadline(time.Time{})
		}
	}
}

// attempt is one upstream try.
type attempt struct {
	h      *hostRT
	tokens int64 // prompt tokens counted in h's pending until the first byte
	resp   *http.Response
	kind   failureKind // failNone with resp set, else why it failed
	status int         // the response's status, 0 without one
	err    error
	cancel context.CancelFunc
	closed bool
	sent   time.Time        // when the attempt was sent (injected clock)
	now    func() time.Time // the gateway's clock
	// freed, when set, is called once the attempt has given its slot back
	// (the flow-control queue's offer).
	freed func()
}

// proxy sends the request to the cluster, retrying per the route's policy
// within the cluster's budget, and relays the answer. It returns the status
// sent. c is the request's class: its residency limits every pick, and
// when its first pick finds every eligible endpoint saturated it waits in
// the flow-control queue (flow.go); shed is called with the reason
// before a 429 the gateway writes itself.
func (g *Gateway) proxy(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte, tokens int64, chain []uint64, rt *xdsclient.Route,
	cl *clusterRT, model string, start time.Time, c *classOf, shed func(reason string)) int {
	var tried []*hostRT
	var last *attempt
	retrySlot := false // this request holds one of the cluster's retry slots
	release := func() {
		if retrySlot {
			cl.st.retries.Add(-1)
			retrySlot = false
		}
	}
	defer func() {
		if last != nil {
			last.close()
		}
		release()
	}()
	for n := 1; ; n++ {
		q := pickQuery{tokens: tokens, chain: chain, class: c, local: g.cfg.Region}
		if rt.Retry.PreviousHosts {
			q.exclude, q.redraws = tried, rt.Retry.HostSelectionRetries
		}
		var h *hostRT
		var res pickResult
		if last == nil {
			var status int
			if h, res, status = g.firstPick(ctx, w, cl, q, c, shed); status != 0 {
				return status
			}
		} else {
			h, res = g.chooseEndpoint(cl, q)
		}
		if res == pickOverflow {
			return g.relayFailure(w, last, http.StatusServiceUnavailable, "upstream overflow: the cluster's circuit breaker is open")
		}
		if h == nil {
			if c.set != "" && last == nil && res == pickNoHost {
				g.m.class.residency.Inc()
				return g.relayFailure(w, nil, http.StatusServiceUnavailable, c.residencyMessage())
			}
			return g.relayFailure(w, last, http.StatusServiceUnavailable, "no healthy upstream")
		}
		tried = append(tried, h)
		a := g.try(ctx, r, body, tokens, g.sendTokens(h, tokens, chain), rt, cl, h, n)
		if a.kind == failNone && !retriesStatus(&rt.Retry, a.resp.StatusCode) {
			return g.relay(ctx, w, a, cl, model, start)
		}
		last = a
		if a.kind == failCanceled {
			return statusClientClosed
		}
		retriable := a.kind == failNone || (a.kind == failTimeout && ctx.Err() == nil && (rt.Retry.Any5xx || rt.Retry.GatewayError)) ||
			retriesLocal(&rt.Retry, a.kind)
		if !retriable || n > int(rt.Retry.NumRetries) || ctx.Err() != nil {
			return g.relayFailure(w, a, 0, "")
		}
		release() // the previous retry, if any, is over
		if !cl.st.tryRetry(cl.policy) {
			g.m.retriesRefused.WithLabelValues(model).Inc()
			return g.relayFailure(w, a, 0, "")
		}
		retrySlot = true
		g.m.retries.WithLabelValues(model).Inc()
		a.close() // its answer is dropped: the retry answers instead
		if !g.backoff(ctx, &rt.Retry, n) {
			return g.relayFailure(w, a, 0, "")
		}
	}
}

// firstPick is a request's first pick. A request whose class yields
// (Gateway.yields: a more important band is short) waits in the queue as
// if every endpoint were saturated; when the queue refuses it (its band
// or the queue full) it is picked for as usual, as the bench's ingress
// does (bench/paper fleet.go, route). A pick that finds every eligible
// endpoint saturated waits or is shed (queueOrShed). status 0: proceed
// with h and res.
func (g *Gateway) firstPick(ctx context.Context, w http.ResponseWriter, cl *clusterRT, q pickQuery, c *classOf, shed func(string)) (*hostRT, pickResult, int) {
	if g.yields(c.crit) {
		g.m.flow.yielded.WithLabelValues(c.crit.String()).Inc()
		h, res, why := g.wait(ctx, cl, q, c)
		if why != shedQueueFull {
			return g.endWait(ctx, w, c, shed, h, res, why)
		}
	}
	h, res := g.chooseEndpoint(cl, q)
	if h == nil && res == pickSaturated {
		return g.queueOrShed(ctx, w, cl, q, c, shed)
	}
	return h, res, 0
}

// queueOrShed handles a first pick that found every eligible endpoint
// saturated: it waits in the flow-control queue (wait) unless flow
// control is off, then endWait.
func (g *Gateway) queueOrShed(ctx context.Context, w http.ResponseWriter, cl *clusterRT, q pickQuery, c *classOf, shed func(string)) (*hostRT, pickResult, int) {
	if g.flow == nil {
		return g.endWait(ctx, w, c, shed, nil, pickSaturated, "saturated")
	}
	h, res, why := g.wait(ctx, cl, q, c)
	return g.endWait(ctx, w, c, shed, h, res, why)
}

// endWait answers a request whose wait for an endpoint ended without one
// (reason not ""): 429 with Retry-After and the shed header naming the
// cause (saturated, queue_full, queue_evicted, queue_expired), 504 when
// the route's timeout ended the wait, nothing (499) when the client left.
// status 0: proceed with h and res (reason "").
func (g *Gateway) endWait(ctx context.Context, w http.ResponseWriter, c *classOf, shed func(string), h *hostRT, res pickResult, reason string) (*hostRT, pickResult, int) {
	if reason == "" {
		return h, res, 0
	}
	switch {
	case reason == "canceled" && errors.Is(ctx.Err(), context.Canceled):
		return nil, pickSaturated, statusClientClosed
	case reason == "canceled":
		writeError(w, http.StatusGatewayTimeout, "upstream request timeout while queued for an endpoint")
		return nil, pickSaturated, http.StatusGatewayTimeout
	}
	shed(reason)
	msg := "every endpoint is at its in-flight limit; retry later"
	switch reason {
	case shedQueueFull:
		msg = "every endpoint is at its in-flight limit and the " + c.crit.String() + " queue is full; retry later"
	case shedQueueEvicted:
		msg = "every endpoint is at its in-flight limit and a more critical request took this one's place in the queue; retry later"
	case shedQueueExpired:
		msg = "every endpoint stayed at its in-flight limit for the " + c.crit.String() + " queue's longest wait; retry later"
	}
	writeError(w, http.StatusTooManyRequests, msg)
	return nil, pickSaturated, http.StatusTooManyRequests
}

// sendTokens is the prompt tokens an attempt to h adds to h's pending
// count: with prefix affinity, those h is not expected to hold cached;
// the prompt's blocks are then recorded as sent to h.
func (g *Gateway) sendTokens(h *hostRT, tokens int64, chain []uint64) int64 {
	if g.balancer.prefix == nil || len(chain) == 0 {
		return tokens
	}
	n := placement.UncachedTokens(tokens, g.balancer.cachedTokens(h.ep.Address, chain))
	g.balancer.prefix.Record(h.ep.Address, chain, 0)
	return n
}

// chooseEndpoint is the one choice of an endpoint for a request that both
// data planes make: the HTTP proxy for each attempt, and the ext_proc
// picker (gateway/extproc, through Pick) once per stream. The cluster's
// circuit breaker first (its
// attempts in flight against max_requests: pickOverflow), then the pick of
// Config.LB (balancer.pick) at the clock's now, which takes one of the chosen
// host's in-flight slots. On pickOK the caller owns that slot and passes it
// to startAttempt, whose close gives it back.
func (g *Gateway) chooseEndpoint(cl *clusterRT, q pickQuery) (*hostRT, pickResult) {
	if cl.st.active.Load() >= int64(cl.policy.MaxRequests) {
		return nil, pickOverflow
	}
	q.now = g.clock.Now().UnixNano()
	q.regions = cl.allowedRegions()
	return g.balancer.pick(cl, q)
}

// startAttempt counts an attempt of tokens prompt tokens on h, whose
// in-flight slot chooseEndpoint took: its tokens in h's pending count until
// its firstByte, and one in the cluster's active count until its close,
// which also gives the slot back. The proxy (try) and the ext_proc picker
// both count a request through it, so the two account alike.
func (g *Gateway) startAttempt(cl *clusterRT, h *hostRT, tokens int64) *attempt {
	a := &attempt{h: h, tokens: tokens, sent: g.clock.Now(), now: g.clock.Now}
	if g.flow != nil {
		a.freed = g.offerOne
	}
	h.st.addPending(a)
	cl.st.active.Add(1)
	a.cancel = func() { cl.st.active.Add(-1) }
	return a
}

// backoff waits a random time in [0, min(max, base·2^(n-1))) before retry
// n, like Envoy's fully jittered back-off. It returns false if ctx ended.
func (g *Gateway) backoff(ctx context.Context, p *xdsclient.RetryPolicy, n int) bool {
	d := backoff.Policy{Min: p.BackoffBase, Max: p.BackoffMax, Jitter: backoff.Full}.Delay(n - 1)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := g.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}

// firstByte takes the attempt's prompt tokens out of its host's pending
// count: the first response byte arrived, or the attempt ended without
// one. Idempotent.
func (a *attempt) firstByte() {
	if a.tokens != 0 {
		a.h.st.removePending(a, a.now())
		a.tokens = 0
	}
}

// close ends the attempt: its body, its context, its pending prompt tokens,
// its in-flight slot and its place in the cluster's active count.
// Idempotent.
func (a *attempt) close() {
	if a.closed {
		return
	}
	a.closed = true
	a.firstByte()
	if a.resp != nil {
		a.resp.Body.Close()
	}
	if a.cancel != nil {
		a.cancel()
	}
	a.h.st.release()
	a.resp, a.cancel = nil, nil
	if a.freed != nil {
		a.freed()
	}
}

// connectTimeoutKey carries a cluster's connect timeout to the dialer.
type connectTimeoutKey struct{}

// try sends one attempt to h, holding h's in-flight slot (taken by pick)
// and the cluster's active count until the attempt is closed, and pending
// (its prompt tokens h is expected to prefill: tokens less the prefix h
// probably holds) in h's pending count until its first response byte (or
// its end). It records the endpoint's outcome up to the response headers,
// the context memory with the whole prompt's tokens.
func (g *Gateway) try(ctx context.Context, r *http.Request, body []byte, tokens, pending int64, rt *xdsclient.Route, cl *clusterRT, h *hostRT, n int) *attempt {
	actx, cancel := context.WithCancel(context.WithValue(ctx, connectTimeoutKey{}, cl.policy.ConnectTimeout))
	a := g.startAttempt(cl, h, pending)
	inactive := a.cancel
	a.cancel = func() {
		cancel()
		inactive()
	}
	out, err := g.upstreamRequest(actx, r, body, h, n)
	if err != nil {
		a.kind, a.err = failReset, err
		g.recordEndpoint(cl, h, 0, a.kind)
		return a
	}
	resp, err := g.roundTrip(out, rt.Retry.PerTryTimeout, cancel)
	if err != nil {
		a.firstByte() // no answer will come
		a.err = err
		a.kind = classifyError(ctx, err)
		if a.kind == failCanceled {
			return a // the client left: not the endpoint's failure
		}
		g.recordEndpoint(cl, h, 0, a.kind)
		return a
	}
	a.resp, a.status = resp, resp.StatusCode
	g.noteAnswer(h, resp, tokens)
	kind := failNone
	if resp.StatusCode >= 500 {
		kind = fail5xx
	}
	g.recordEndpoint(cl, h, resp.StatusCode, kind)
	return a
}

// upstreamRequest is the request of attempt n to h: the client's request
// with its body, the attempt number, the hop header and proof for another
// region's endpoint (never a proof for a cell), and X-Forwarded-For.
func (g *Gateway) upstreamRequest(ctx context.Context, r *http.Request, body []byte, h *hostRT, n int) (*http.Request, error) {
	out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+h.ep.Address+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyHeaders(out.Header, r.Header)
	out.Host = r.Host
	out.ContentLength = int64(len(body))
	out.Header.Set(xdscontract.AttemptHeader, strconv.Itoa(n))
	out.Header.Del(xdscontract.HopAuthHeader) // never shown to a cell
	if h.remote {
		out.Header.Set(g.cfg.HopHeader, g.cfg.Region)
		if tok := g.hop.token(g.cfg.Region, g.clock.Now()); tok != "" {
			out.Header.Set(xdscontract.HopAuthHeader, tok)
		}
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	return out, nil
}

// roundTrip sends out; a per-try timeout d (0: none) covers the wait for
// the response headers only, and cancel, the attempt's, ends it when the
// timeout fires first (the error is then context.DeadlineExceeded).
func (g *Gateway) roundTrip(out *http.Request, d time.Duration, cancel context.CancelFunc) (*http.Response, error) {
	// The per-try timeout covers the wait for the response headers only.
	var (
		perTry  clockwork.Timer
		ptMu    sync.Mutex
		ptDone  bool // headers (or an error) arrived
		ptFired bool // the timer cancelled the attempt
	)
	if d > 0 {
		perTry = g.clock.AfterFunc(d, func() {
			ptMu.Lock()
			defer ptMu.Unlock()
			if !ptDone {
				ptFired = true
				cancel()
			}
		})
	}
	resp, err := g.transport.RoundTrip(out)
	if perTry != nil {
		perTry.Stop()
		ptMu.Lock()
		ptDone = true
		fired := ptFired
		ptMu.Unlock()
		if fired {
			if resp != nil {
				resp.Body.Close()
			}
			resp, err = nil, context.DeadlineExceeded
		}
	}
	return resp, err
}

// noteAnswer feeds h's context memory with an answer to a request of
// tokens prompt tokens: a 400 (vLLM's answer to a prompt above its
// max_model_len, whose message states the limit; the body is relayed
// unchanged) or a success.
func (g *Gateway) noteAnswer(h *hostRT, resp *http.Response, tokens int64) {
	if h.st.ctx == nil {
		return
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		// vLLM's answer to a prompt above its max_model_len (the
		// gateway has already refused malformed bodies itself), whose
		// message states the limit; the body is relayed unchanged.
		peek, _ := io.ReadAll(io.LimitReader(resp.Body, refusalPeekBytes))
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(peek), resp.Body), resp.Body}
		h.st.ctx.refusedPrompt(tokens, statedContextLimit(peek), g.clock.Now())
	case resp.StatusCode < 300:
		h.st.ctx.served(tokens)
	}
}

// classifyError tells a connect failure from a reset, a timeout or the
// client's departure. ctx is the request's context.
func classifyError(ctx context.Context, err error) failureKind {
	var op *net.OpError
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return failCanceled
	case ctx.Err() != nil:
		return failTimeout // the route's timeout
	case errors.As(err, &op) && op.Op == "dial":
		return failConnect // refused, unreachable or past the connect timeout
	case errors.Is(err, context.DeadlineExceeded):
		return failTimeout // the per-try timeout
	}
	return failReset
}

// recordEndpoint counts an attempt's outcome (status 0: no response) in the
// metrics, the report and the outlier detector.
func (g *Gateway) recordEndpoint(cl *clusterRT, h *hostRT, status int, kind failureKind) {
	g.m.upstreamRequests.WithLabelValues(h.label, statusClass(status)).Inc()
	if kind != failNone {
		g.recordFailure(cl, h, kind)
		return
	}
	g.rep.addEndpoint(h, false, status >= 400 && status < 500)
	h.st.recordSuccess()
}

// recordFailure is the one accounting path of an upstream failure, whether
// it ends an attempt (recordEndpoint) or breaks a response already started
// (relay): the error metric, the report and the outlier detector, which
// may eject h.
func (g *Gateway) recordFailure(cl *clusterRT, h *hostRT, kind failureKind) {
	g.m.upstreamErrors.WithLabelValues(h.label, kind.String()).Inc()
	g.rep.addEndpoint(h, true, false)
	now := g.clock.Now()
	d := h.st.recordFailure(now, cl.policy.Outlier, kind != fail5xx, func() (int, int) { return cl.ejectedCount(h.st, now.UnixNano()) })
	if d > 0 {
		g.m.ejections.WithLabelValues(h.label).Inc()
		g.log.Warn("endpoint ejected", "endpoint", h.label, "address", h.ep.Address, "cluster", cl.name, "for", d)
	}
}

// relayFailure answers with the last failed attempt: its response when it
// had one (a retriable status), else an error of status (0: from the
// attempt's failure kind) with msg.
func (g *Gateway) relayFailure(w http.ResponseWriter, last *attempt, status int, msg string) int {
	if last != nil && last.resp != nil {
		hdr := w.Header()
		copyHeaders(hdr, last.resp.Header)
		g.setEndpointHeaders(hdr, last.h, last.resp.Header)
		w.WriteHeader(last.resp.StatusCode)
		_, _ = io.Copy(w, last.resp.Body)
		return last.resp.StatusCode
	}
	if last != nil {
		g.setEndpointHeaders(w.Header(), last.h, nil)
		switch {
		case last.status != 0:
			status, msg = last.status, fmt.Sprintf("upstream answered %d", last.status)
		case last.kind == failTimeout:
			status, msg = http.StatusGatewayTimeout, "upstream request timeout"
		default:
			status, msg = http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers: "+last.kind.String()
		}
	}
	writeError(w, status, msg)
	return status
}

func (g *Gateway) setEndpointHeaders(hdr http.Header, h *hostRT, upstream http.Header) {
	id := h.ep.Cell
	if h.remote || id == "" {
		id = h.ep.Address
	}
	if upstream != nil {
		if v := upstream.Get(xdscontract.EndpointHeader); v != "" {
			hdr.Set(xdscontract.UpstreamEndpointHeader, v)
		}
	}
	hdr.Set(xdscontract.EndpointHeader, id)
	hdr.Set(xdscontract.RegionHeader, h.ep.Region)
}

// observeAnswer records a successful answer on attempt a, whose batch
// slot was held from holdFrom and whose first byte came at firstAt: the
// host's slot hold (hostState.slotHold) and the gateway's time to first
// byte (Gateway.ttft), as the bench's ingress records both on each
// successful reply.
func (g *Gateway) observeAnswer(a *attempt, holdFrom, firstAt time.Time) {
	a.h.st.observeSlotHold(g.clock.Since(holdFrom))
	if !firstAt.After(a.sent) {
		return // no byte came, or none the clock could tell from the send
	}
	observeEWMA(&g.ttft, firstAt.Sub(a.sent))
}

// relay streams the response to the client, flushing every chunk as it
// arrives. A failure after the first byte cannot be retried: the client's
// connection is aborted so it sees a truncated response, not a clean end.
func (g *Gateway) relay(ctx context.Context, w http.ResponseWriter, a *attempt, cl *clusterRT, model string, start time.Time) int {
	defer a.close()
	resp := a.resp
	hdr := w.Header()
	copyHeaders(hdr, resp.Header)
	g.setEndpointHeaders(hdr, a.h, resp.Header)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	bufp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bufp)
	buf := *bufp
	first := true
	// The slot hold --lb isobar's pick prices: a streamed answer holds its
	// batch slot from its first token to its end (the decode), an answer
	// sent whole from the attempt's start.
	holdFrom, firstAt := a.sent, a.sent
	streamed := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if first {
				first = false
				a.firstByte()
				firstAt = g.clock.Now()
				if streamed {
					holdFrom = firstAt
				}
				g.m.ttft.WithLabelValues(model).Observe(g.clock.Since(start).Seconds())
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return resp.StatusCode // the client went away
			}
			if rc.Flush() != nil {
				return resp.StatusCode
			}
		}
		if err == io.EOF {
			if resp.StatusCode < 300 {
				g.observeAnswer(a, holdFrom, firstAt)
			}
			return resp.StatusCode
		}
		if err != nil {
			if r := ctx.Err(); r != nil && errors.Is(r, context.Canceled) {
				return resp.StatusCode // the client went away
			}
			kind := failReset
			if ctx.Err() != nil {
				kind = failTimeout
			}
			g.recordFailure(cl, a.h, kind)
			g.log.Debug("upstream stream broke after the response started", "endpoint", a.h.label, "err", err)
			a.close()
			panic(http.ErrAbortHandler)
		}
	}
}
