package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocpb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// testPicker is a started picker and an ext_proc client to it.
type testPicker struct {
	*Picker
	reg    *prometheus.Registry
	client extprocpb.ExternalProcessorClient
}

// startPicker starts a picker against ctrl (plain text unless cfg.TLS is
// set; then the client is not dialled) and waits for a ready table.
func startPicker(t testing.TB, ctrl *control, cfg Config, deps Deps) *testPicker {
	t.Helper()
	cfg.Gateway.Controller = ctrl.addr
	if cfg.Gateway.Region == "" {
		cfg.Gateway.Region = "r1"
	}
	if cfg.Gateway.MinBackoff == 0 {
		cfg.Gateway.MinBackoff, cfg.Gateway.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	if cfg.Gateway.DrainTimeout == 0 {
		cfg.Gateway.DrainTimeout = 5 * time.Second
	}
	reg := prometheus.NewRegistry()
	deps.Gateway.Registerer, deps.Gateway.Gatherer = reg, reg
	if deps.Gateway.Logger == nil {
		deps.Gateway.Logger = testLogger(t)
	}
	deps.Gateway.DialOptions = insecureDial
	p, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	tp := &testPicker{Picker: p, reg: reg}
	if !cfg.TLS.Enabled() {
		tp.client = dialPicker(t, p.Addr(), insecure.NewCredentials())
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := p.WaitForTable(ctx, (*xdsclient.Table).Ready); err != nil {
		t.Fatalf("picker table not ready: %v", err)
	}
	return tp
}

func dialPicker(t testing.TB, addr string, creds credentials.TransportCredentials) extprocpb.ExternalProcessorClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return extprocpb.NewExternalProcessorClient(conn)
}

// load sums the in-flight counts and pending prompt tokens of the hosts
// of the picker's table, by address.
func (p *testPicker) load() (inflight, pending map[string]int64) {
	inflight, pending, _ = p.g.Load()
	return inflight, pending
}

// idle waits until no request is counted on any host.
func (p *testPicker) idle(t testing.TB) {
	t.Helper()
	eventually.True(t, testTimeout, "every pick given back", func() bool {
		in, pend := p.load()
		for a := range in {
			if in[a] != 0 || pend[a] != 0 {
				return false
			}
		}
		return true
	})
}

// epRequest is one HTTP request as Envoy's ext_proc filter presents it.
type epRequest struct {
	mode    filterpb.ProcessingMode_BodySendMode // request body mode
	method  string                               // default POST
	path    string                               // default /v1/completions
	headers map[string]string
	body    []byte          // nil: the headers end the request
	hint    *structpb.Value // the subset hint's value; nil: none
	source  string          // the source.address attribute; "": none
}

// completionBody is an OpenAI completion request for model with a prompt
// of n bytes.
func completionBody(model string, n int) []byte {
	return fmt.Appendf(nil, `{"model":%q,"prompt":%q,"max_tokens":1}`, model, strings.Repeat("a", n))
}

// epAnswer is what the picker answered the request phase.
type epAnswer struct {
	dest      string            // xdscontract.DestinationEndpointHeader set by the mutation; "" none
	mdDest    string            // the envoy.lb dynamic metadata's endpoint
	removed   bool              // xdscontract.DestinationEndpointHeader removed
	hop       string            // the hop header set
	sets      map[string]string // every header set
	removes   []string          // the headers removed
	clear     bool              // clear_route_cache
	immediate *extprocpb.ImmediateResponse
}

// epCall is one request's stream, open until finish.
type epCall struct {
	t      testing.TB
	s      extprocpb.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	ans    epAnswer
}

// send plays Envoy's ext_proc filter for r's request phase and checks
// every answer is the one the filter expects next in r's mode. An error
// is the stream's (a gRPC status).
func send(t testing.TB, c extprocpb.ExternalProcessorClient, r epRequest) (*epCall, error) {
	t.Helper()
	hm, md := envoyRequest(&r)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	call := &epCall{t: t, s: s, cancel: cancel}
	t.Cleanup(cancel)
	sendMsg := call.sendMsg
	var attrs map[string]*structpb.Struct
	if r.source != "" {
		attrs = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{"source.address": structpb.NewStringValue(r.source)}}}
	}
	err = sendMsg(&extprocpb.ProcessingRequest{
		Request:         &extprocpb.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocpb.HttpHeaders{Headers: hm, EndOfStream: r.body == nil}},
		MetadataContext: md,
		Attributes:      attrs,
		ProtocolConfig:  &extprocpb.ProtocolConfiguration{RequestBodyMode: r.mode, ResponseBodyMode: filterpb.ProcessingMode_STREAMED},
	})
	if err != nil {
		return call, err
	}
	headersOnly := r.body == nil || r.mode == filterpb.ProcessingMode_NONE || r.mode == filterpb.ProcessingMode_STREAMED
	if r.mode == filterpb.ProcessingMode_FULL_DUPLEX_STREAMED && r.body != nil {
		half := len(r.body) / 2
		for i, part := range [][]byte{r.body[:half], r.body[half:]} {
			if err := sendMsg(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestBody{
				RequestBody: &extprocpb.HttpBody{Body: part, EndOfStream: i == 1}}}); err != nil {
				return call, err
			}
		}
	}
	resp, err := s.Recv()
	if err != nil {
		return call, err
	}
	if call.immediate(resp) {
		return call, nil
	}
	hr := resp.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("answer %v to the request headers, want a headers response", resp)
	}
	if headersOnly || r.mode == filterpb.ProcessingMode_FULL_DUPLEX_STREAMED {
		call.read(hr.GetResponse(), resp.GetDynamicMetadata())
	} else if m := hr.GetResponse().GetHeaderMutation(); m != nil {
		t.Fatalf("BUFFERED: the headers' answer mutates %v before the body is seen", m)
	}
	return call, call.requestBody(r, headersOnly)
}

// envoyRequest is r's request headers and metadata as Envoy's ext_proc
// filter sends them (r's method and path defaulted).
func envoyRequest(r *epRequest) (*core.HeaderMap, *core.Metadata) {
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/v1/completions"
	}
	hm := &core.HeaderMap{Headers: []*core.HeaderValue{
		{Key: ":method", RawValue: []byte(r.method)}, {Key: ":path", RawValue: []byte(r.path)},
		{Key: ":authority", RawValue: []byte("isobar.example")}, {Key: ":scheme", RawValue: []byte("http")},
	}}
	if r.body != nil {
		hm.Headers = append(hm.Headers, &core.HeaderValue{Key: "content-length", RawValue: fmt.Append(nil, len(r.body))})
	}
	for k, v := range r.headers {
		hm.Headers = append(hm.Headers, &core.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	var md *core.Metadata
	if r.hint != nil {
		md = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
			xdscontract.SubsetHintNamespace: {Fields: map[string]*structpb.Value{xdscontract.SubsetHintKey: r.hint}}}}
	}
	return hm, md
}

// sendMsg sends m; a Send on a stream the picker ended says io.EOF, and
// Recv then says why.
func (c *epCall) sendMsg(m *extprocpb.ProcessingRequest) error {
	err := c.s.Send(m)
	if errors.Is(err, io.EOF) {
		_, err = c.s.Recv()
	}
	return err
}

// requestBody plays the request body phase in r's mode after the
// headers' answer and reads the body's answer.
func (c *epCall) requestBody(r epRequest, headersOnly bool) error {
	c.t.Helper()
	switch {
	case r.mode == filterpb.ProcessingMode_FULL_DUPLEX_STREAMED && r.body != nil:
		var back []byte
		for {
			resp, err := c.s.Recv()
			if err != nil {
				return err
			}
			sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				c.t.Fatalf("FULL_DUPLEX_STREAMED: answer %v, want the body sent back", resp)
			}
			back = append(back, sr.GetBody()...)
			if sr.GetEndOfStream() {
				break
			}
		}
		if !bytes.Equal(back, r.body) {
			c.t.Fatalf("FULL_DUPLEX_STREAMED: the body came back as %d bytes, want the %d sent", len(back), len(r.body))
		}
	case r.mode == filterpb.ProcessingMode_STREAMED && r.body != nil:
		if err := c.sendMsg(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestBody{
			RequestBody: &extprocpb.HttpBody{Body: r.body, EndOfStream: true}}}); err != nil {
			return err
		}
		resp, err := c.s.Recv()
		if err != nil {
			return err
		}
		if resp.GetRequestBody() == nil || resp.GetRequestBody().GetResponse().GetHeaderMutation() != nil {
			c.t.Fatalf("STREAMED: answer %v to a body chunk, want it let through", resp)
		}
	case !headersOnly: // BUFFERED, BUFFERED_PARTIAL
		if err := c.sendMsg(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestBody{
			RequestBody: &extprocpb.HttpBody{Body: r.body, EndOfStream: true}}}); err != nil {
			return err
		}
		resp, err := c.s.Recv()
		if err != nil {
			return err
		}
		if c.immediate(resp) {
			return nil
		}
		if resp.GetRequestBody() == nil {
			c.t.Fatalf("answer %v to the body, want a body response", resp)
		}
		c.read(resp.GetRequestBody().GetResponse(), resp.GetDynamicMetadata())
	}
	return nil
}

func (c *epCall) immediate(resp *extprocpb.ProcessingResponse) bool {
	if ir := resp.GetImmediateResponse(); ir != nil {
		c.ans.immediate = ir
		return true
	}
	return false
}

func (c *epCall) read(common *extprocpb.CommonResponse, md *structpb.Struct) {
	c.ans.clear = common.GetClearRouteCache()
	c.ans.sets = map[string]string{}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		c.ans.sets[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
		switch h.GetHeader().GetKey() {
		case xdscontract.DestinationEndpointHeader:
			if h.GetAppendAction() != core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				c.t.Errorf("the destination header is set with %v, want it overwritten", h.GetAppendAction())
			}
			c.ans.dest = string(h.GetHeader().GetRawValue())
		case xdscontract.DefaultHopHeader:
			c.ans.hop = string(h.GetHeader().GetRawValue())
		}
	}
	c.ans.removes = common.GetHeaderMutation().GetRemoveHeaders()
	c.ans.removed = slices.Contains(common.GetHeaderMutation().GetRemoveHeaders(), xdscontract.DestinationEndpointHeader)
	c.ans.mdDest = md.GetFields()[xdscontract.DestinationEndpointNamespace].GetStructValue().GetFields()[xdscontract.DestinationEndpointHeader].GetStringValue()
}

// finish plays the response (status, one body chunk, unless status is 0:
// the request ends without one) and ends the stream as Envoy does at the
// end of the HTTP stream; it returns once the picker's handler returned.
func (c *epCall) finish(status int) {
	c.t.Helper()
	if status != 0 {
		if err := c.s.Send(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocpb.HttpHeaders{
			Headers: &core.HeaderMap{Headers: []*core.HeaderValue{{Key: ":status", RawValue: fmt.Append(nil, status)},
				{Key: "content-type", RawValue: []byte("application/json")}}}}}}); err != nil {
			c.t.Fatalf("send response headers: %v", err)
		}
		resp, err := c.s.Recv()
		if err != nil || resp.GetResponseHeaders() == nil {
			c.t.Fatalf("answer to the response headers: %v %v", resp, err)
		}
		if err := c.s.Send(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_ResponseBody{ResponseBody: &extprocpb.HttpBody{
			Body: []byte(`{"choices":[]}`), EndOfStream: true}}}); err != nil {
			c.t.Fatalf("send response body: %v", err)
		}
		if resp, err := c.s.Recv(); err != nil || resp.GetResponseBody() == nil {
			c.t.Fatalf("answer to the response body: %v %v", resp, err)
		}
	}
	if err := c.s.CloseSend(); err != nil {
		c.t.Fatalf("close: %v", err)
	}
	if _, err := c.s.Recv(); !errors.Is(err, io.EOF) {
		c.t.Fatalf("stream end: %v, want the picker to end it cleanly", err)
	}
}

// threeEndpoints is a model served by three endpoints on documentation
// addresses (the picker never connects to them).
func threeEndpoints() (xds.State, []string) {
	var eps []xds.Endpoint
	var addrs []string
	for i := range 3 {
		eps = append(eps, xds.Endpoint{CellID: fmt.Sprintf("c%d", i), Host: "192.0.2.1", Port: uint32(8000 + i), Weight: 1})
		addrs = append(addrs, fmt.Sprintf("192.0.2.1:%d", 8000+i))
	}
	return oneModel(model, eps...), addrs
}

// Every completion request gets an endpoint of its model's cluster, named
// alike in the header and the envoy.lb metadata, with the route cache
// cleared, in every body mode the picker supports; the accounting is
// given back when the streams end; other requests pass through.
func TestPickerEveryRequestGetsAnEndpoint(t *testing.T) {
	st, addrs := threeEndpoints()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	for _, lb := range []gateway.LBMode{gateway.LBXDS, gateway.LBIsobar, gateway.LBRoundRobin, gateway.LBLeastRequest} {
		t.Run(string(lb), func(t *testing.T) {
			p := startPicker(t, ctrl, Config{Gateway: gateway.Config{LB: lb}}, Deps{})
			modes := []struct {
				name    string
				mode    filterpb.ProcessingMode_BodySendMode
				headers map[string]string
			}{
				{"buffered", filterpb.ProcessingMode_BUFFERED, nil},
				{"buffered partial", filterpb.ProcessingMode_BUFFERED_PARTIAL, nil},
				{"full duplex", filterpb.ProcessingMode_FULL_DUPLEX_STREAMED, nil},
				{"headers only", filterpb.ProcessingMode_NONE, map[string]string{xdscontract.DefaultModelHeader: model}},
				{"streamed", filterpb.ProcessingMode_STREAMED, map[string]string{xdscontract.DefaultModelHeader: model}},
			}
			picked := map[string]int{}
			n := 0
			for _, m := range modes {
				var open []*epCall
				for i := range 6 {
					call, err := send(t, p.client, epRequest{mode: m.mode, headers: m.headers, body: completionBody(model, 100+200*i)})
					if err != nil {
						t.Fatalf("%s request %d: %v", m.name, i, err)
					}
					a := call.ans
					if a.immediate != nil || !slices.Contains(addrs, a.dest) || a.mdDest != a.dest || !a.clear {
						t.Fatalf("%s request %d: answer %+v, want one of %v in the header and the metadata, route cache cleared", m.name, i, a, addrs)
					}
					picked[a.dest]++
					open = append(open, call)
					n++
				}
				in, _ := p.load()
				total := int64(0)
				for _, v := range in {
					total += v
				}
				if total != int64(len(open)) {
					t.Errorf("%s: %d requests in flight on the hosts, want the %d open streams", m.name, total, len(open))
				}
				for _, c := range open {
					c.finish(http.StatusOK)
				}
				p.idle(t)
			}
			if got := testutil.ToFloat64(p.x.m.decisions.WithLabelValues("picked")); got != float64(n) {
				t.Errorf("isobar_picker_decisions_total{result=picked} = %v, want %d", got, n)
			}
			t.Logf("picks by endpoint: %v", picked)

			// Not a completion: let through, and a client's own destination
			// header is removed.
			call, err := send(t, p.client, epRequest{mode: filterpb.ProcessingMode_BUFFERED, method: http.MethodGet, path: "/v1/models",
				headers: map[string]string{xdscontract.DestinationEndpointHeader: "203.0.113.9:22"}})
			if err != nil {
				t.Fatal(err)
			}
			if a := call.ans; a.dest != "" || a.immediate != nil || !a.removed || !a.clear {
				t.Errorf("GET /v1/models: answer %+v, want it let through with the client's destination header removed", a)
			}
			call.finish(http.StatusOK)
		})
	}
}

// The picker chooses, for the same state, the endpoint the gateway's HTTP
// path chooses: the same pick (chooseEndpoint) on the same counts. The
// state is made deterministic for --lb isobar: a fake clock (no prefill
// progress), unequal prefill rates and unequal pending prompt tokens,
// held by open picker streams.
func TestPickerPicksAsTheGateway(t *testing.T) {
	var eps []xds.Endpoint
	cells := map[string]string{} // address -> cell
	for i, rate := range []float64{4000, 8000, 16000} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[]}`)
		}))
		t.Cleanup(srv.Close)
		e := endpointOf(t, fmt.Sprintf("c%d", i), srv.Listener.Addr().String(), 1, 0)
		e.PrefillTokensPerSecond = rate
		eps = append(eps, e)
		cells[srv.Listener.Addr().String()] = e.CellID
	}
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, oneModel(model, eps...))
	clock := clockwork.NewFakeClock()
	p := startPicker(t, ctrl, Config{Gateway: gateway.Config{LB: gateway.LBIsobar}}, Deps{Gateway: gateway.Deps{Clock: clock, Rand: newLockedRand(1, 2)}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := p.WaitForTable(ctx, func(tb *xdsclient.Table) bool { return len(tb.Clusters[xdscontract.ClusterName(model)].Endpoints) == 3 }); err != nil {
		t.Fatal(err)
	}
	// httpPick is the endpoint the gateway's HTTP path picks for a prompt
	// of n bytes on the current state.
	httpPick := func(n int) string {
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(completionBody(model, n)))
		req.Host = "isobar.example"
		w := httptest.NewRecorder()
		p.g.GenerateHandler().ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("gateway: status %d: %s", w.Code, w.Body)
		}
		return w.Header().Get(xdscontract.EndpointHeader)
	}
	var held []*epCall
	agree := 0
	for round, prompt := range []int{40000, 4000, 120000, 400, 60000, 8000, 200000, 1000} {
		call, err := send(t, p.client, epRequest{mode: filterpb.ProcessingMode_BUFFERED, body: completionBody(model, prompt)})
		if err != nil || call.ans.dest == "" {
			t.Fatalf("round %d: picker: %+v %v", round, call.ans, err)
		}
		viaPicker := cells[call.ans.dest]
		call.finish(0) // the state is again what the gateway will see
		p.idleExcept(t, held)
		if viaHTTP := httpPick(prompt); viaHTTP != viaPicker {
			t.Errorf("round %d (prompt %d bytes): the picker chose %s, the gateway %s", round, prompt, viaPicker, viaHTTP)
		} else {
			agree++
		}
		// Hold this round's request open: the next round sees more load.
		hold, err := send(t, p.client, epRequest{mode: filterpb.ProcessingMode_BUFFERED, body: completionBody(model, prompt)})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, hold)
	}
	_, pend := p.load()
	t.Logf("%d rounds agree; pending tokens at the end %v", agree, pend)
	distinct := map[string]bool{}
	for _, h := range held {
		distinct[h.ans.dest] = true
		h.finish(http.StatusOK)
	}
	if len(distinct) < 2 {
		t.Errorf("every held request went to one endpoint %v: the state never made the pick change", distinct)
	}
	p.idle(t)
}

// idleExcept waits until the hosts hold exactly the held calls.
func (p *testPicker) idleExcept(t testing.TB, held []*epCall) {
	t.Helper()
	want := map[string]int64{}
	for _, h := range held {
		want[h.ans.dest]++
	}
	eventually.True(t, testTimeout, "the held requests alone in flight", func() bool {
		in, _ := p.load()
		for a, n := range in {
			if n != want[a] {
				return false
			}
		}
		return true
	})
}

// envoyDecision is what Envoy's ext_proc filter with failure_mode_allow
// does with the picker's answer: the destination it routes to, an
// immediate response, or, when the stream failed, the fallback (the
// filter is skipped: no destination header, so the route without it, to
// the weighted cluster from xDS, takes the request).
type envoyDecision struct {
	dest      string
	immediate int
	fallback  bool
	err       error
}

func envoyDecide(t testing.TB, c extprocpb.ExternalProcessorClient, r epRequest) (envoyDecision, *epCall) {
	call, err := send(t, c, r)
	switch {
	case err != nil:
		return envoyDecision{fallback: true, err: err}, call
	case call.ans.immediate != nil:
		return envoyDecision{immediate: int(call.ans.immediate.GetStatus().GetCode())}, call
	}
	return envoyDecision{dest: call.ans.dest}, call
}

// A picker that dies mid-stream leaves the proxy on its fallback: the
// stream fails at once (the client does not wait for a timeout), Envoy's
// failure_mode_allow skips the filter and the request, without the
// destination header, takes the weighted route; the picker gives the
// dead stream's pick back.
func TestPickerKilledMidStreamFallsBack(t *testing.T) {
	st, _ := threeEndpoints()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	p := startPicker(t, ctrl, Config{}, Deps{})
	d, live := envoyDecide(t, p.client, epRequest{mode: filterpb.ProcessingMode_BUFFERED, body: completionBody(model, 100)})
	if d.dest == "" || d.fallback {
		t.Fatalf("before the kill: %+v", d)
	}
	// A second request is in its request phase when the picker dies: its
	// headers are answered, its body is not yet sent.
	s, err := p.client.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocpb.HttpHeaders{
		Headers: &core.HeaderMap{Headers: []*core.HeaderValue{{Key: ":method", RawValue: []byte("POST")},
			{Key: ":path", RawValue: []byte("/v1/completions")}}}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	p.gs.Stop() // the process dies: connections close, no drain
	body := completionBody(model, 100)
	_ = s.Send(&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestBody{RequestBody: &extprocpb.HttpBody{Body: body, EndOfStream: true}}})
	_, err = s.Recv()
	if code := status.Code(err); code != codes.Unavailable && code != codes.Canceled {
		t.Fatalf("the stream of a dead picker ended with %v, want Unavailable", err)
	}
	if _, err := live.s.Recv(); err == nil {
		t.Fatal("the picked request's stream survived the picker")
	}
	// The next request finds no picker: Envoy falls back.
	d, _ = envoyDecide(t, p.client, epRequest{mode: filterpb.ProcessingMode_BUFFERED, body: body})
	if !d.fallback || d.dest != "" {
		t.Fatalf("after the kill: %+v, want the fallback without a destination", d)
	}
	t.Logf("fallback on %v", d.err)
	p.idle(t)
}

// Only the region's gateway identity may use the picker: any other
// certificate of the same CA (another region's gateway, the regional
// controller, an operator) is refused with PermissionDenied, counted.
func TestPickerRefusesOtherIdentities(t *testing.T) {
	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	caFile := dir + "/" + certs.CACertFile
	issue := func(name string, id certs.Identity, server bool) (string, string) {
		l := id.Leaf(nil, nil)
		l.Name, l.Server = name, server
		if server {
			l.IPs = []net.IP{net.ParseIP("127.0.0.1")}
		}
		c, k, err := ca.IssueTo(dir, l, false)
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	srvCert, srvKey := issue("picker", certs.Identity{Kind: certs.KindGateway, Name: "r1"}, true)
	st, _ := threeEndpoints()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	p := startPicker(t, ctrl, Config{TLS: TLSFiles{Cert: srvCert, Key: srvKey, CA: caFile}}, Deps{})
	client := func(name string, id certs.Identity) extprocpb.ExternalProcessorClient {
		c, k := issue(name, id, false)
		tc, err := certs.ClientConfig(c, k, caFile, "")
		if err != nil {
			t.Fatal(err)
		}
		return dialPicker(t, p.Addr(), credentials.NewTLS(tc))
	}
	req := epRequest{mode: filterpb.ProcessingMode_BUFFERED, body: completionBody(model, 100)}
	call, err := send(t, client("envoy", certs.Identity{Kind: certs.KindGateway, Name: "r1"}), req)
	if err != nil || call.ans.dest == "" {
		t.Fatalf("the region's gateway: %+v %v", call, err)
	}
	call.finish(http.StatusOK)
	refused := 0
	for _, tc := range []struct {
		name string
		id   certs.Identity
	}{
		{"other-region", certs.Identity{Kind: certs.KindGateway, Name: "r2"}},
		{"controller", certs.Identity{Kind: certs.KindRegion, Name: "r1"}},
		{"operator", certs.Identity{Kind: certs.KindOperator, Name: "alice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := send(t, client(tc.name, tc.id), req)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("%s: %v, want PermissionDenied", tc.id, err)
			}
			refused++
			if got := testutil.ToFloat64(p.x.m.streamErrors.WithLabelValues("forbidden")); got != float64(refused) {
				t.Errorf("isobar_picker_stream_errors_total{reason=forbidden} = %v, want %d", got, refused)
			}
		})
	}
	// Plain text does not reach the service at all.
	if _, err := send(t, dialPicker(t, p.Addr(), insecure.NewCredentials()), req); err == nil {
		t.Error("a plain-text client was served by the mTLS picker")
	}
	p.idle(t)
}

// Garbage and oversized input end the stream with a status, counted by
// reason; the picker neither panics nor keeps a pick.
func TestPickerRefusesBadInput(t *testing.T) {
	st, _ := threeEndpoints()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	p := startPicker(t, ctrl, Config{Gateway: gateway.Config{MaxBodyBytes: 4096}}, Deps{})
	headers := func(kv ...string) *extprocpb.ProcessingRequest {
		hm := &core.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			hm.Headers = append(hm.Headers, &core.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return &extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocpb.HttpHeaders{Headers: hm}}}
	}
	good := headers(":method", "POST", ":path", "/v1/completions")
	bodyMsg := func(b []byte) *extprocpb.ProcessingRequest {
		return &extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestBody{RequestBody: &extprocpb.HttpBody{Body: b, EndOfStream: true}}}
	}
	manyHints := make([]any, maxSubsetEntries+1)
	for i := range manyHints {
		manyHints[i] = "192.0.2.1:1"
	}
	hintList, err := structpb.NewList(manyHints)
	if err != nil {
		t.Fatal(err)
	}
	tooManyHints := headers(":method", "POST", ":path", "/v1/completions")
	tooManyHints.MetadataContext = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
		xdscontract.SubsetHintNamespace: {Fields: map[string]*structpb.Value{xdscontract.SubsetHintKey: structpb.NewListValue(hintList)}}}}
	for _, tc := range []struct {
		name   string
		msgs   []*extprocpb.ProcessingRequest
		code   codes.Code
		reason string
	}{
		{"body not JSON", []*extprocpb.ProcessingRequest{good, bodyMsg([]byte("\x00garbage{"))}, codes.InvalidArgument, "malformed"},
		{"model not a string", []*extprocpb.ProcessingRequest{good, bodyMsg([]byte(`{"model":7}`))}, codes.InvalidArgument, "malformed"},
		{"body over the limit", []*extprocpb.ProcessingRequest{good, bodyMsg(bytes.Repeat([]byte("a"), 5000))}, codes.ResourceExhausted, "too_large"},
		{"body over the server's message limit", []*extprocpb.ProcessingRequest{good, bodyMsg(bytes.Repeat([]byte("a"), 2<<20))}, codes.ResourceExhausted, "too_large"},
		{"no :path", []*extprocpb.ProcessingRequest{headers(":method", "POST")}, codes.InvalidArgument, "malformed"},
		{"unknown pseudo-header", []*extprocpb.ProcessingRequest{headers(":method", "POST", ":path", "/", ":bogus", "x")}, codes.InvalidArgument, "malformed"},
		{"header without a name", []*extprocpb.ProcessingRequest{headers(":method", "POST", ":path", "/", "", "x")}, codes.InvalidArgument, "malformed"},
		{"subset hint too long", []*extprocpb.ProcessingRequest{tooManyHints}, codes.InvalidArgument, "malformed"},
		{"empty message", []*extprocpb.ProcessingRequest{{}}, codes.InvalidArgument, "malformed"},
		{"body before headers", []*extprocpb.ProcessingRequest{bodyMsg([]byte("{}"))}, codes.InvalidArgument, "out_of_order"},
		{"headers twice", []*extprocpb.ProcessingRequest{good, good}, codes.InvalidArgument, "out_of_order"},
		{"observability mode", []*extprocpb.ProcessingRequest{{ObservabilityMode: true, Request: good.Request}}, codes.InvalidArgument, "unsupported_mode"},
		{"GRPC body mode", []*extprocpb.ProcessingRequest{{Request: good.Request,
			ProtocolConfig: &extprocpb.ProtocolConfiguration{RequestBodyMode: filterpb.ProcessingMode_GRPC}}}, codes.InvalidArgument, "unsupported_mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(p.x.m.streamErrors.WithLabelValues(tc.reason))
			s, err := p.client.Process(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var last error
			for _, m := range tc.msgs {
				if err := s.Send(m); err != nil {
					break // the picker closed the stream: Recv says why
				}
			}
			for last == nil {
				_, last = s.Recv() // skip the answers to the good messages
			}
			if status.Code(last) != tc.code {
				t.Fatalf("stream ended with %v, want %v", last, tc.code)
			}
			eventually.True(t, testTimeout, "the refusal counted", func() bool {
				return testutil.ToFloat64(p.x.m.streamErrors.WithLabelValues(tc.reason)) == before+1
			})
		})
	}
	p.idle(t)
}

// With a subset hint the picker chooses only among the listed endpoints
// (a list of "ip:port", comma-separated strings, or a bare IP); a hint
// that leaves no eligible endpoint is a 503, never a pick outside it.
func TestPickerHonoursSubsetHint(t *testing.T) {
	st, addrs := threeEndpoints()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	list := func(s ...string) *structpb.Value {
		vs := make([]any, len(s))
		for i, x := range s {
			vs[i] = x
		}
		l, err := structpb.NewList(vs)
		if err != nil {
			t.Fatal(err)
		}
		return structpb.NewListValue(l)
	}
	for _, lb := range []gateway.LBMode{gateway.LBXDS, gateway.LBIsobar, gateway.LBLeastRequest} {
		t.Run(string(lb), func(t *testing.T) {
			p := startPicker(t, ctrl, Config{Gateway: gateway.Config{LB: lb}}, Deps{})
			for _, tc := range []struct {
				name string
				hint *structpb.Value
				want []string // nil: 503
			}{
				{"one of three", list(addrs[1]), addrs[1:2]},
				{"two of three", list(addrs[0], addrs[2]), []string{addrs[0], addrs[2]}},
				{"comma-separated string", structpb.NewStringValue(addrs[2] + ", " + addrs[0]), []string{addrs[0], addrs[2]}},
				{"comma-separated in a list", list(addrs[1] + "," + addrs[2]), addrs[1:]},
				{"bare IP", list("192.0.2.1"), addrs},
				{"IPv4-mapped IPv6", list("[::ffff:192.0.2.1]:8001"), addrs[1:2]},
				{"unknown endpoint", list("198.51.100.7:8000"), nil},
				{"empty list", list(), nil},
				{"not a list", structpb.NewNumberValue(7), nil},
				{"garbage entries", list("not-an-address", "192.0.2.1:99999"), nil},
			} {
				var open []*epCall
				for i := range 12 {
					call, err := send(t, p.client, epRequest{mode: filterpb.ProcessingMode_BUFFERED, hint: tc.hint, body: completionBody(model, 100+50*i)})
					if err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
					if tc.want == nil {
						if ir := call.ans.immediate; ir == nil || ir.GetStatus().GetCode() != http.StatusServiceUnavailable ||
							!json.Valid(ir.GetBody()) || !strings.Contains(string(ir.GetBody()), "subset hint") {
							t.Fatalf("%s: answer %+v, want 503 with a JSON error naming the subset hint", tc.name, call.ans)
						}
						continue
					}
					if !slices.Contains(tc.want, call.ans.dest) {
						t.Fatalf("%s: picked %q (%+v), want one of %v", tc.name, call.ans.dest, call.ans, tc.want)
					}
					open = append(open, call) // held: the pick must spread within the subset, not leave it
				}
				for _, c := range open {
					c.finish(http.StatusOK)
				}
				p.idle(t)
			}
		})
	}
}

// The picker reports ready over gRPC health (the Endpoint Picker
// Protocol's "Health Checking") once its table is, and /health and
// /metrics are served on its HTTP listener, without the OpenAI API.
func TestPickerHealthAndHTTP(t *testing.T) {
	st, _ := threeEndpoints()
	ctrl := startControl(t, "127.0.0.1:0", xds.Config{}, st)
	p := startPicker(t, ctrl, Config{}, Deps{})
	conn, err := grpc.NewClient(p.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		eventually.True(t, testTimeout, "health of "+svc, func() bool {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
	}
	for path, want := range map[string]int{"/health": http.StatusOK, "/metrics": http.StatusOK} {
		resp, err := http.Get("http://" + p.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
		if path == "/metrics" && !strings.Contains(string(b), "isobar_picker_stream_errors_total") {
			t.Error("/metrics lacks isobar_picker_stream_errors_total")
		}
	}
	resp, err := http.Post("http://"+p.HTTPAddr()+"/v1/completions", "application/json", bytes.NewReader(completionBody(model, 10)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/completions on the picker's HTTP listener: %d, want it not served", resp.StatusCode)
	}
}
