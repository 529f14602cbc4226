package gateway

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/isobar-mesh/isobar/internal/truncate"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// PickRequest is what Gateway.Pick needs to know of a request that another
// data plane (the ext_proc picker) proxies: its facts as the HTTP proxy
// would see them.
type PickRequest struct {
	// Match is the request as the route matcher sees it: pseudo-headers,
	// ModelHeader (filled from the body's model), content-length the
	// body's length.
	Match xdsclient.HeaderView
	// Header holds the request's other headers; a hop header without a
	// valid proof is removed from it (and named in Pick.Remove).
	Header http.Header
	// Authority and Path select the virtual host and route; Model is the
	// request's model (for messages).
	Authority, Path, Model string
	// Body is the request body, nil when not seen (a headers-only pick);
	// BodyLen its length (or the declared one).
	Body    []byte
	BodyLen int
	// Allow, when set, is a strict exclusion: only endpoints whose address
	// it allows are eligible (the proxy's subset hint).
	Allow func(addr string) bool
	// Start is when the request began (its time to first byte is observed
	// from it).
	Start time.Time
	// Source is the client's address (host:port or an address) when the
	// data plane knows it; "" is unknown, hence not among
	// Config.TrustedSources (only a hop proof then keeps "critical").
	Source string
}

// Refusal is the gateway's answer to a request it does not pick an
// endpoint for: the status, headers and OpenAI error body the HTTP proxy
// would send, and Result, why (not_found, unavailable, shed, saturated).
type Refusal struct {
	Result string
	Status int
	Header http.Header
	Body   []byte
}

// Pick is a held pick: an endpoint's in-flight slot, its pending prompt
// tokens and its cluster's active count, given back by Close. Its methods
// record the answer as the HTTP proxy does; they are called from one
// goroutine (the request's).
type Pick struct {
	g      *Gateway
	a      *attempt
	cl     *clusterRT
	model  string // the metrics label
	tokens int64
	start  time.Time

	// Set are the headers (name, value) to set on the proxied request: the
	// destination and, for another region's endpoint, the hop header and
	// a fresh proof. Remove names headers to remove (a hop proof is never
	// shown to a cell).
	Set    [][2]string
	Remove []string

	status   int
	sse      bool      // text/event-stream: the slot is held from the first byte
	first    bool      // the first response body byte has arrived
	holdFrom time.Time // the slot hold's start
	firstAt  time.Time // the first response byte (zero: none yet)
	refusal  bool      // a 400 waits for its body's stated context limit
}

// Pick routes r and picks its endpoint as the HTTP proxy does
// (handleGenerate, proxy): the virtual host and route matchers, demand
// counted, the route's fault abort, the cluster, the prompt tokens
// (placement.PromptTokens), then chooseEndpoint (r.Allow a strict
// exclusion) and startAttempt's accounting. It returns the held pick, or
// the refusal when none can be made.
func (g *Gateway) Pick(r PickRequest) (*Pick, *Refusal) {
	rt, ref := g.pickRoute(&r)
	if ref != nil {
		return nil, ref
	}
	tokens := placement.PromptTokens(r.Header, r.BodyLen)
	var chain []uint64
	if r.Body != nil {
		chain = g.promptChain(r.Body)
	}
	h, ref := g.pickEndpoint(rt, &r, pickQuery{tokens: tokens, chain: chain, class: &rt.class, local: g.cfg.Region})
	if ref != nil {
		return nil, ref
	}
	p := &Pick{g: g, a: g.startAttempt(rt.cl, h, g.sendTokens(h, tokens, chain)), cl: rt.cl, model: rt.label, tokens: tokens, start: r.Start}
	p.holdFrom = p.a.sent
	g.pickHeaders(p, h, rt.hop, rt.removed)
	p.Set = append(p.Set, rt.classSet...)
	return p, nil
}

// pickedRoute is what Pick settled of the request before the endpoint.
type pickedRoute struct {
	cl      *clusterRT
	label   string   // the model label of metrics and reports
	hop     bool     // the hop header's proof held
	removed []string // headers to remove from the proxy's copy of the request
	// class is the request's class; classSet the class headers to set on
	// the proxy's copy of the request (classify's rewrite; the ones it
	// removed are in removed).
	class    classOf
	classSet [][2]string
}

// pickRoute matches r to its route and cluster as handleGenerate does.
func (g *Gateway) pickRoute(r *PickRequest) (pickedRoute, *Refusal) {
	t := g.tbl.Load()
	if t == nil || t.vhosts == nil {
		return pickedRoute{}, refusal("unavailable", http.StatusServiceUnavailable, "the picker has no route configuration yet", nil)
	}
	// As the gateway: the hop header counts only with a valid proof
	// (hop.go); otherwise it is removed here and from the proxy's copy of
	// the request, so that neither this pick nor the proxy's route treats
	// the request as forwarded.
	hop, removed := g.trustHop(r.Header, t.internalOnly)
	// The class headers are settled and rewritten before the match, as
	// handleGenerate does; the proxy's copy gets the same rewrite.
	class, classSet, classRemoved := g.classify(r.Header, r.Source, hop, r.Model)
	removed = append(removed, classRemoved...)
	var rt *xdsclient.Route
	if vh := xdsclient.SelectVirtualHost(t.vhosts, strings.ToLower(r.Authority)); vh != nil {
		rt = xdsclient.MatchRoute(vh, r.Path, r.Match)
	}
	if rt == nil {
		if code, msg := class.noRoute(r.Model); code != http.StatusNotFound {
			return pickedRoute{}, refusal("unavailable", code, msg, nil)
		}
		return pickedRoute{}, refusal("not_found", http.StatusNotFound, fmt.Sprintf("no route for model %q", truncate.String(r.Model, maxModelNameLen)), nil)
	}
	p := pickedRoute{label: rt.Model, hop: hop, removed: removed, class: class, classSet: classSet}
	if p.label == "" {
		p.label = t.soleModel
	}
	if p.label == "" {
		p.label = "unknown"
	}
	if !hop {
		g.rep.addDemand(p.label, &p.class)
	}
	// The route's fault abort, drawn as handleGenerate draws it.
	if rt.AbortPerMillion > 0 && rand.Uint32N(1_000_000) < rt.AbortPerMillion {
		var hdr http.Header
		reason, msg := p.class.abortMessage(rt.AbortStatus)
		switch {
		case reason == "residency":
			hdr = g.pickShed(p, reason, reason)
		case rt.AbortStatus == http.StatusTooManyRequests:
			hdr = g.pickShed(p, "fault", "plan")
		}
		return pickedRoute{}, refusal("shed", rt.AbortStatus, msg, hdr)
	}
	if p.cl = t.clusters[rt.Cluster]; p.cl == nil {
		return pickedRoute{}, refusal("unavailable", http.StatusServiceUnavailable, fmt.Sprintf("cluster %q not found", rt.Cluster), nil)
	}
	return p, nil
}

// pickShed counts a refusal with 429 by reason and returns the header that
// tells the client why.
func (g *Gateway) pickShed(p pickedRoute, reason, header string) http.Header {
	g.m.shed.WithLabelValues(p.label, reason).Inc()
	if !p.hop {
		g.rep.addShed(p.label, &p.class)
	}
	return http.Header{xdscontract.ShedHeader: {header}}
}

// pickEndpoint chooses the endpoint with chooseEndpoint, r.Allow a strict
// exclusion.
func (g *Gateway) pickEndpoint(p pickedRoute, r *PickRequest, q pickQuery) (*hostRT, *Refusal) {
	if r.Allow != nil {
		q.strict = true
		for _, h := range p.cl.all {
			if !r.Allow(h.ep.Address) {
				q.exclude = append(q.exclude, h)
			}
		}
	}
	h, res := g.chooseEndpoint(p.cl, q)
	switch {
	case res == pickOverflow:
		return nil, refusal("unavailable", http.StatusServiceUnavailable, "upstream overflow: the cluster's circuit breaker is open", nil)
	case h == nil && res == pickSaturated:
		return nil, refusal("saturated", http.StatusTooManyRequests, "every endpoint is at its in-flight limit; retry later", g.pickShed(p, "saturated", "saturated"))
	case h == nil && p.class.set != "" && res == pickNoHost:
		g.m.class.residency.Inc()
		return nil, refusal("unavailable", http.StatusServiceUnavailable, p.class.residencyMessage(), nil)
	case h == nil && r.Allow != nil:
		return nil, refusal("unavailable", http.StatusServiceUnavailable, "no endpoint of the proxy's subset hint is eligible", nil)
	case h == nil:
		return nil, refusal("unavailable", http.StatusServiceUnavailable, "no healthy upstream", nil)
	}
	return h, nil
}

// pickHeaders fills p's header changes for h: the destination, the hop
// header and a fresh proof for another region's endpoint, and the headers
// removed.
func (g *Gateway) pickHeaders(p *Pick, h *hostRT, hop bool, removed []string) {
	p.Set = [][2]string{{xdscontract.DestinationEndpointHeader, h.ep.Address}}
	if h.remote {
		p.Set = append(p.Set, [2]string{g.cfg.HopHeader, g.cfg.Region})
		if tok := g.hop.token(g.cfg.Region, g.clock.Now()); tok != "" {
			p.Set = append(p.Set, [2]string{xdscontract.HopAuthHeader, tok})
		}
		// Set, not removed: this picker forwards it now.
		removed = slices.DeleteFunc(removed, func(h string) bool { return h == g.cfg.HopHeader || h == xdscontract.HopAuthHeader })
	} else if hop {
		removed = append(removed, xdscontract.HopAuthHeader) // never shown to a cell
	}
	p.Remove = removed
}

// refusal is the gateway's own error (writeError's status, headers and
// body, with extra headers) as a Refusal.
func refusal(result string, code int, msg string, extra http.Header) *Refusal {
	r := &replyRecorder{h: http.Header{}}
	for k, vs := range extra {
		r.h[k] = vs
	}
	writeError(r, code, msg)
	return &Refusal{Result: result, Status: code, Header: r.h, Body: r.body}
}

// Address is the picked endpoint's address.
func (p *Pick) Address() string { return p.a.h.ep.Address }

// Response records the endpoint's answer as the proxy path does (try: the
// status in metrics, reports and outlier detection, the context memory);
// sse says the answer is text/event-stream, end that it has no body. It
// returns how the gateway names the endpoint (xdscontract.EndpointHeader)
// and its region (xdscontract.RegionHeader). Call it once.
func (p *Pick) Response(status int, sse, end bool) (endpoint, region string) {
	p.status, p.sse = status, sse
	host := p.a.h
	kind := failNone
	if status >= 500 {
		kind = fail5xx
	}
	p.g.recordEndpoint(p.cl, host, status, kind)
	if host.st.ctx != nil {
		switch {
		case status == http.StatusBadRequest:
			p.refusal = true // its body states the limit
		case status < 300:
			host.st.ctx.served(p.tokens)
		}
	}
	endpoint = host.ep.Cell
	if host.remote || endpoint == "" {
		endpoint = host.ep.Address
	}
	if end {
		p.responseEnd()
	}
	return endpoint, host.ep.Region
}

// Body takes a chunk of the response body: at the first byte the pick's
// pending prompt tokens are taken back and the time to first byte
// observed, as relay does; end is the response's last chunk.
func (p *Pick) Body(chunk []byte, end bool) {
	if len(chunk) > 0 && !p.first {
		p.first = true
		now := p.g.clock.Now()
		p.a.firstByte()
		p.firstAt = now
		if p.sse {
			p.holdFrom = now
		}
		p.g.m.ttft.WithLabelValues(p.model).Observe(now.Sub(p.start).Seconds())
		if p.refusal {
			p.refusal = false
			peek := chunk[:min(len(chunk), refusalPeekBytes)]
			p.a.h.st.ctx.refusedPrompt(p.tokens, statedContextLimit(peek), now)
		}
	}
	if end {
		p.responseEnd()
	}
}

// responseEnd is the response's last byte: a successful answer's slot
// hold is observed as relay observes it.
func (p *Pick) responseEnd() {
	if p.status > 0 && p.status < 300 {
		p.g.observeAnswer(p.a, p.holdFrom, p.firstAt)
	}
}

// Close gives the pick's accounting back: the request is over.
func (p *Pick) Close() {
	if p.refusal { // a 400 whose body never came: no stated limit
		p.a.h.st.ctx.refusedPrompt(p.tokens, 0, p.g.clock.Now())
	}
	p.a.close()
}

// replyRecorder is an http.ResponseWriter that keeps what writeError
// writes, to hand it over as a Refusal.
type replyRecorder struct {
	h    http.Header
	body []byte
}

func (r *replyRecorder) Header() http.Header { return r.h }
func (r *replyRecorder) WriteHeader(int)     {}
func (r *replyRecorder) Write(b []byte) (int, error) {
	r.body = append(r.body, b...)
	return len(b), nil
}

// Config returns the gateway's configuration, after defaults.
func (g *Gateway) Config() Config { return g.cfg }

// Load is the accounting of the configuration in use: the requests in
// flight and the prompt tokens pending per endpoint address, and the
// requests active per cluster name (nil maps before any configuration).
// Tests check with it that every pick was given back.
func (g *Gateway) Load() (inflight, pending, active map[string]int64) {
	t := g.tbl.Load()
	if t == nil {
		return nil, nil, nil
	}
	inflight, pending, active = map[string]int64{}, map[string]int64{}, map[string]int64{}
	for _, cl := range t.clusters {
		for _, h := range cl.all {
			inflight[h.ep.Address], pending[h.ep.Address] = h.st.inflight.Load(), h.st.pending.Load()
		}
		active[cl.name] = cl.st.active.Load()
	}
	return inflight, pending, active
}

// GenerateHandler is the gateway's OpenAI completion handler (POST
// /v1/completions and /v1/chat/completions), whatever Config.HealthOnly
// says: the picker's tests compare its pick with the HTTP proxy's on one
// state.
func (g *Gateway) GenerateHandler() http.Handler { return http.HandlerFunc(g.handleGenerate) }

// LoadResources applies a configuration's clusters, endpoints and routes
// as the xDS subscriptions would, without a controller (tests and fuzzing
// of what runs on the table).
func (g *Gateway) LoadResources(clusters, endpoints, routes []*anypb.Any, version string) error {
	for i, rs := range [][]*anypb.Any{clusters, endpoints, routes} {
		if err := g.apply(i, rs, version); err != nil {
			return err
		}
	}
	return nil
}
