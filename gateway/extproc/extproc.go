package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocpb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// The classes of a stream's failure. refuse maps each to its gRPC code
// and counts it; they never leave the package but as a status.
var (
	// errExtProcMalformed: a message the picker cannot read (headers
	// without :path, a body that is not a JSON object, an unreadable
	// subset hint). codes.InvalidArgument.
	errExtProcMalformed = errors.New("gateway: malformed ext_proc request")
	// errExtProcOrder: a message out of the protocol's order (a body
	// before its headers, headers twice). codes.InvalidArgument.
	errExtProcOrder = errors.New("gateway: ext_proc message out of order")
	// errExtProcTooLarge: a request body over Config.Gateway.MaxBodyBytes.
	// codes.ResourceExhausted.
	errExtProcTooLarge = errors.New("gateway: request body too large")
	// errExtProcUnsupported: a processing mode the picker cannot answer
	// in (observability_mode, the GRPC body mode). codes.InvalidArgument.
	errExtProcUnsupported = errors.New("gateway: ext_proc processing mode not supported")
	// errNotGatewayPeer: with mTLS, a client whose certificate is not
	// this region's gateway identity. codes.PermissionDenied.
	errNotGatewayPeer = errors.New("gateway: only this region's gateways (spiffe://isobar/gateway/<region>) may use the picker")
)

// streamBodyChunk is the largest body chunk the picker sends back in
// FULL_DUPLEX_STREAMED mode: under the 64 KiB Envoy recommends
// (ext_proc's ProcessingMode.FULL_DUPLEX_STREAMED), the size the reference
// picker uses (llm-d-inference-scheduler pkg/common/envoy, bodyByteLimit).
const streamBodyChunk = 62000

// extProc is the Endpoint Picker Protocol (kubernetes-sigs/
// gateway-api-inference-extension docs/proposals/004-endpoint-picker-
// protocol) over Envoy's ext_proc service, on a Gateway's pick (its
// table, its endpoint choice and its per-address accounting). One stream
// is one HTTP request; gRPC runs each on its own goroutine, which alone
// touches the stream's state.
type extProc struct {
	extprocpb.UnsafeExternalProcessorServer
	pk    picker
	m     *pickerMetrics
	log   *slog.Logger
	clock clockwork.Clock
	// From the gateway's configuration (after defaults): the region whose
	// gateway identity may open a stream (with mtls), the model header and
	// the largest request body read.
	region, modelHeader string
	maxBody             int64
	// mtls: only this region's gateway identity may open a stream.
	mtls bool
}

var _ extprocpb.ExternalProcessorServer = (*extProc)(nil)

// picker is what the ext_proc service needs of a Gateway: a route and a
// pick for a request's facts, held until the stream ends.
type picker interface {
	Pick(gateway.PickRequest) (*gateway.Pick, *gateway.Refusal)
}

var _ picker = (*gateway.Gateway)(nil)

// newExtProc is the ext_proc service on g.
func newExtProc(g *gateway.Gateway, m *pickerMetrics, log *slog.Logger, clock clockwork.Clock, mtls bool) *extProc {
	cfg := g.Config()
	return &extProc{pk: g, m: m, log: log, clock: clock, region: cfg.Region, modelHeader: cfg.ModelHeader, maxBody: cfg.MaxBodyBytes, mtls: mtls}
}

// Process serves one ext_proc stream: it answers every message the proxy
// sends in its processing mode, picks at the first moment the request
// is known (its headers, or its whole body when the mode sends it),
// holds the pick's accounting until the stream ends and gives it back
// then. A stream ends when Envoy closes it at the end of the HTTP stream
// (ext_proc.cc Filter::onDestroy), when it resets, or when the picker
// refuses its input.
func (x *extProc) Process(srv extprocpb.ExternalProcessor_ProcessServer) error {
	ctx := srv.Context()
	if x.mtls {
		if err := authorizeGateway(ctx, x.region); err != nil {
			return x.refuse(ctx, err)
		}
	}
	x.m.streams.Inc()
	defer x.m.streams.Dec()
	s := &epStream{x: x, srv: srv, start: x.clock.Now(), reqMode: filterpb.ProcessingMode_BUFFERED}
	defer s.end()
	for {
		req, err := srv.Recv()
		if err != nil {
			switch status.Code(err) {
			case codes.Canceled:
				return nil // the proxy reset the stream: the HTTP stream is over
			case codes.ResourceExhausted: // a message over the server's size limit
				return x.refuse(ctx, fmt.Errorf("%w: %v", errExtProcTooLarge, err))
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := s.handle(req); err != nil {
			return x.refuse(ctx, err)
		}
	}
}

// refuse ends a stream for err: the one place the stream's errors meet
// gRPC codes. Refusals are counted by reason; a refused identity is
// logged as a warning with the peer's identity (as the regional
// controller logs its refusals), input errors at debug (outside input
// must not flood the log). Anything else (a failed Send: the proxy went
// away) is returned as it is.
func (x *extProc) refuse(ctx context.Context, err error) error {
	var reason string
	var code codes.Code
	switch {
	case errors.Is(err, errNotGatewayPeer):
		x.m.streamErrors.WithLabelValues("forbidden").Inc()
		x.log.Warn("ext_proc stream refused", "peer_identity", certs.GRPCPeerName(ctx), "err", err)
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, errExtProcTooLarge):
		reason, code = "too_large", codes.ResourceExhausted
	case errors.Is(err, errExtProcMalformed):
		reason, code = "malformed", codes.InvalidArgument
	case errors.Is(err, errExtProcOrder):
		reason, code = "out_of_order", codes.InvalidArgument
	case errors.Is(err, errExtProcUnsupported):
		reason, code = "unsupported_mode", codes.InvalidArgument
	default:
		return err
	}
	x.m.streamErrors.WithLabelValues(reason).Inc()
	x.log.Debug("ext_proc stream closed for its input", "reason", reason, "err", err)
	return status.Error(code, err.Error())
}

// authorizeGateway admits an ext_proc client whose verified certificate
// is this region's gateway identity, spiffe://isobar/gateway/<region>,
// as the regional controller admits its xDS clients
// (regional/identity.go gatewayPeer): the URI SAN only, never a common
// name or DNS SAN.
func authorizeGateway(ctx context.Context, region string) error {
	id, err := certs.GRPCPeerIdentity(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errNotGatewayPeer, err)
	}
	if id.Kind != certs.KindGateway || id.Name != region {
		return fmt.Errorf("%w: certificate identity %s, this picker serves %s", errNotGatewayPeer, id, region)
	}
	return nil
}

// epStream is one ext_proc stream's state, owned by its goroutine.
type epStream struct {
	x     *extProc
	srv   extprocpb.ExternalProcessor_ProcessServer
	start time.Time

	// The body modes from the first message's protocol_config; without one,
	// the request body mode is taken to be BUFFERED (what the example
	// configuration uses) and the response body mode NONE.
	reqMode, respMode filterpb.ProcessingMode_BodySendMode
	seen              bool // a message has arrived

	req     *epHeaders    // nil until the request headers
	source  string        // the client's address (the source.address attribute), "" unknown
	hint    *subset       // the subset hint, nil when the proxy sent none
	hadDest bool          // the client sent xdscontract.DestinationEndpointHeader itself
	body    []byte        // FULL_DUPLEX_STREAMED: the body so far
	decided bool          // the request phase is answered
	p       *gateway.Pick // nil without a pick

	respHeaders bool // the response headers have arrived
}

// handle answers one message.
func (s *epStream) handle(req *extprocpb.ProcessingRequest) error {
	if req.GetObservabilityMode() {
		return fmt.Errorf("%w: observability_mode ignores the picker's answers; turn it off", errExtProcUnsupported)
	}
	if !s.seen {
		s.seen = true
		if pc := req.GetProtocolConfig(); pc != nil {
			s.reqMode, s.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
			for _, m := range []filterpb.ProcessingMode_BodySendMode{s.reqMode, s.respMode} {
				if _, known := filterpb.ProcessingMode_BodySendMode_name[int32(m)]; !known || m == filterpb.ProcessingMode_GRPC {
					return fmt.Errorf("%w: body mode %v", errExtProcUnsupported, m)
				}
			}
		}
	}
	switch r := req.GetRequest().(type) {
	case *extprocpb.ProcessingRequest_RequestHeaders:
		s.source = sourceAddress(req.GetAttributes())
		return s.requestHeaders(r.RequestHeaders, req.GetMetadataContext())
	case *extprocpb.ProcessingRequest_RequestBody:
		return s.requestBody(r.RequestBody)
	case *extprocpb.ProcessingRequest_RequestTrailers:
		return s.requestTrailers()
	case *extprocpb.ProcessingRequest_ResponseHeaders:
		return s.responseHeaders(r.ResponseHeaders)
	case *extprocpb.ProcessingRequest_ResponseBody:
		return s.responseBody(r.ResponseBody)
	case *extprocpb.ProcessingRequest_ResponseTrailers:
		if s.req == nil {
			return fmt.Errorf("%w: response trailers before the request", errExtProcOrder)
		}
		return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocpb.TrailersResponse{}}})
	}
	return fmt.Errorf("%w: a message without a request or response phase", errExtProcMalformed)
}

// headersOnly: the request body never reaches the picker in time to
// choose on it (NONE: not sent; STREAMED: sent after the headers went
// on), so the pick is made on the headers.
func (s *epStream) headersOnly() bool {
	return s.reqMode == filterpb.ProcessingMode_NONE || s.reqMode == filterpb.ProcessingMode_STREAMED
}

func (s *epStream) fullDuplex() bool {
	return s.reqMode == filterpb.ProcessingMode_FULL_DUPLEX_STREAMED
}

// requestHeaders reads the request's headers and subset hint. A request
// without a body, or in a headers-only mode, is decided now; in BUFFERED
// modes the headers are let through unchanged (Envoy holds them until the
// body's answer, which carries the decision: processor_state.cc
// handleBodyResponse applies its header mutation); in
// FULL_DUPLEX_STREAMED the answer waits for the body.
func (s *epStream) requestHeaders(h *extprocpb.HttpHeaders, md *core.Metadata) error {
	if s.req != nil {
		return fmt.Errorf("%w: request headers twice", errExtProcOrder)
	}
	v, err := parseEPHeaders(h.GetHeaders(), s.x.modelHeader)
	if err != nil {
		return err
	}
	if s.hint, _, err = subsetHint(md); err != nil {
		return err
	}
	s.req = v
	s.hadDest = len(v.hdr.Values(xdscontract.DestinationEndpointHeader)) > 0
	switch {
	case h.GetEndOfStream():
		return s.answer(s.decide([]byte{}, 0, true), phaseHeaders, false)
	case s.headersOnly():
		n, known := v.knownLength(s.x.maxBody)
		return s.answer(s.decide(nil, n, known), phaseHeaders, false)
	case s.fullDuplex():
		return nil
	}
	return s.srv.Send(headersAnswer(&extprocpb.CommonResponse{}, nil))
}

// requestBody takes the request body: in BUFFERED modes the one message
// holding all of it (BUFFERED_PARTIAL: a part only when it ends the
// stream; a cut body is too large), in FULL_DUPLEX_STREAMED the chunks up
// to the one ending the stream; in headers-only modes each chunk is let
// through.
func (s *epStream) requestBody(b *extprocpb.HttpBody) error {
	if s.req == nil {
		return fmt.Errorf("%w: request body before its headers", errExtProcOrder)
	}
	limit := s.x.maxBody
	switch {
	case s.headersOnly():
		if !s.decided {
			return fmt.Errorf("%w: request body before the headers were answered", errExtProcOrder)
		}
		return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_RequestBody{
			RequestBody: &extprocpb.BodyResponse{Response: &extprocpb.CommonResponse{}}}})
	case s.fullDuplex():
		if s.decided {
			return fmt.Errorf("%w: request body after the request was answered", errExtProcOrder)
		}
		if int64(len(s.body))+int64(len(b.GetBody())) > limit {
			return fmt.Errorf("%w: more than %d bytes", errExtProcTooLarge, limit)
		}
		s.body = append(s.body, b.GetBody()...)
		if !b.GetEndOfStream() {
			return nil
		}
		return s.answer(s.decide(s.body, len(s.body), true), phaseDuplex, false)
	}
	if s.decided {
		return fmt.Errorf("%w: a second request body message in %v mode", errExtProcOrder, s.reqMode)
	}
	if int64(len(b.GetBody())) > limit {
		return fmt.Errorf("%w: %d bytes, more than %d", errExtProcTooLarge, len(b.GetBody()), limit)
	}
	if s.reqMode == filterpb.ProcessingMode_BUFFERED_PARTIAL && !b.GetEndOfStream() {
		return fmt.Errorf("%w: the proxy cut the body at its buffer limit (BUFFERED_PARTIAL); raise the limit or use BUFFERED", errExtProcTooLarge)
	}
	return s.answer(s.decide(b.GetBody(), len(b.GetBody()), true), phaseBody, false)
}

// requestTrailers: in FULL_DUPLEX_STREAMED they end the body (the body
// chunks did not), so the request is decided now.
func (s *epStream) requestTrailers() error {
	if s.req == nil {
		return fmt.Errorf("%w: request trailers before the headers", errExtProcOrder)
	}
	if s.fullDuplex() && !s.decided {
		if err := s.answer(s.decide(s.body, len(s.body), true), phaseDuplex, true); err != nil {
			return err
		}
	}
	return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocpb.TrailersResponse{}}})
}

// decision is the answer to the request phase: a header mutation
// (nil: let the request through unchanged) with its dynamic metadata, or
// an immediate response, or an error ending the stream.
type decision struct {
	common    *extprocpb.CommonResponse
	md        *structpb.Struct
	immediate *extprocpb.ImmediateResponse
	err       error
}

// decide routes the request and picks its endpoint as the gateway does
// (Gateway.Pick): model from ModelHeader, else the body's "model"
// (gateway.BodyModel); the route with content-length the body's length;
// the pick with the subset hint as a strict exclusion. body nil: not seen
// (a headers-only pick, lenKnown from content-length). Requests the
// gateway does not proxy pass through.
func (s *epStream) decide(body []byte, bodyLen int, lenKnown bool) decision {
	s.decided = true
	v := s.req
	if !v.generates() {
		return s.pass()
	}
	if lenKnown {
		v.contentLength = strconv.Itoa(bodyLen)
	}
	model := v.hdr.Get(s.x.modelHeader)
	if model == "" && body != nil {
		m, err := gateway.BodyModel(body)
		if err != nil {
			return decision{err: fmt.Errorf("%w: %w", errExtProcMalformed, err)}
		}
		model = m
	}
	v.model = model
	r := gateway.PickRequest{Match: v, Header: v.hdr, Authority: v.authority, Path: v.path, Model: model,
		Body: body, BodyLen: bodyLen, Start: s.start, Source: s.source}
	if s.hint != nil {
		r.Allow = s.hint.allows
	}
	p, ref := s.x.pk.Pick(r)
	if ref != nil {
		return s.refuseRequest(ref)
	}
	s.p = p
	s.x.m.decisions.WithLabelValues("picked").Inc()
	return picked(p)
}

// picked is the answer naming p's endpoint: the destination header and
// metadata, the hop header and proof, and the headers removed.
func picked(p *gateway.Pick) decision {
	set := make([]*core.HeaderValueOption, 0, len(p.Set))
	for _, kv := range p.Set {
		set = append(set, overwrite(kv[0], kv[1]))
	}
	return decision{
		common: &extprocpb.CommonResponse{HeaderMutation: &extprocpb.HeaderMutation{SetHeaders: set, RemoveHeaders: p.Remove}, ClearRouteCache: true},
		md: &structpb.Struct{Fields: map[string]*structpb.Value{
			xdscontract.DestinationEndpointNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				xdscontract.DestinationEndpointHeader: structpb.NewStringValue(p.Address())}})}},
	}
}

// pass lets a request the picker does not choose for through unchanged,
// but for a xdscontract.DestinationEndpointHeader the client sent: that is removed
// (and the route recomputed without it) so that no client names its own
// upstream. The Envoy configuration removes it before the filter too
// (deploy/envoy/picker.yaml), which also covers the picker being down.
func (s *epStream) pass() decision {
	s.x.m.decisions.WithLabelValues("passthrough").Inc()
	if !s.hadDest {
		return decision{}
	}
	return decision{common: &extprocpb.CommonResponse{
		HeaderMutation:  &extprocpb.HeaderMutation{RemoveHeaders: []string{xdscontract.DestinationEndpointHeader}},
		ClearRouteCache: true,
	}}
}

// refuseRequest answers the request with the gateway's refusal (its
// status, the gateway's OpenAI error body and its headers), counted
// under its result.
func (s *epStream) refuseRequest(r *gateway.Refusal) decision {
	s.x.m.decisions.WithLabelValues(r.Result).Inc()
	var set []*core.HeaderValueOption
	for k, vs := range r.Header {
		for _, v := range vs {
			set = append(set, overwrite(strings.ToLower(k), v))
		}
	}
	sc := typepb.StatusCode(r.Status)
	if _, ok := typepb.StatusCode_name[int32(r.Status)]; !ok {
		sc = typepb.StatusCode_InternalServerError
	}
	return decision{immediate: &extprocpb.ImmediateResponse{
		Status:  &typepb.HttpStatus{Code: sc},
		Headers: &extprocpb.HeaderMutation{SetHeaders: set},
		Body:    r.Body,
		Details: "isobar_picker_" + r.Result,
	}}
}

// Where a decision is sent.
const (
	phaseHeaders = iota // in the request headers' answer
	phaseBody           // in the (whole) request body's answer
	phaseDuplex         // FULL_DUPLEX_STREAMED: the headers' answer, then the body sent back
)

// answer sends d in phase; trailers says more follows the body
// (FULL_DUPLEX_STREAMED ended by trailers).
func (s *epStream) answer(d decision, phase int, trailers bool) error {
	if d.err != nil {
		return d.err
	}
	if d.immediate != nil {
		return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_ImmediateResponse{ImmediateResponse: d.immediate}})
	}
	common := d.common
	if common == nil {
		common = &extprocpb.CommonResponse{}
	}
	switch phase {
	case phaseHeaders:
		return s.srv.Send(headersAnswer(common, d.md))
	case phaseBody:
		return s.srv.Send(&extprocpb.ProcessingResponse{
			Response:        &extprocpb.ProcessingResponse_RequestBody{RequestBody: &extprocpb.BodyResponse{Response: common}},
			DynamicMetadata: d.md,
		})
	}
	if err := s.srv.Send(headersAnswer(common, d.md)); err != nil {
		return err
	}
	body := s.body
	s.body = nil
	return sendChunks(body, !trailers, func(chunk []byte, eos bool) error {
		return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_RequestBody{
			RequestBody: &extprocpb.BodyResponse{Response: streamed(chunk, eos)}}})
	})
}

// responseHeaders records the endpoint's answer as the proxy path does
// (Pick.Response) and names the endpoint in the response
// (xdscontract.EndpointHeader, xdscontract.RegionHeader), as the gateway
// does.
func (s *epStream) responseHeaders(h *extprocpb.HttpHeaders) error {
	if s.req == nil {
		return fmt.Errorf("%w: response headers before the request", errExtProcOrder)
	}
	if s.respHeaders {
		return fmt.Errorf("%w: response headers twice", errExtProcOrder)
	}
	s.respHeaders = true
	common := &extprocpb.CommonResponse{}
	if p := s.p; p != nil {
		var upstream string
		status, sse := 0, false
		for _, hv := range h.GetHeaders().GetHeaders() {
			val := hv.GetValue()
			if raw := hv.GetRawValue(); len(raw) > 0 {
				val = string(raw)
			}
			switch strings.ToLower(hv.GetKey()) {
			case ":status":
				status, _ = strconv.Atoi(val)
			case "content-type":
				sse = strings.HasPrefix(val, "text/event-stream")
			case xdscontract.EndpointHeader:
				upstream = val
			}
		}
		if status < 100 || status > 599 {
			return fmt.Errorf("%w: response headers without a valid :status", errExtProcMalformed)
		}
		id, region := p.Response(status, sse, h.GetEndOfStream())
		set := []*core.HeaderValueOption{overwrite(xdscontract.EndpointHeader, id), overwrite(xdscontract.RegionHeader, region)}
		if upstream != "" {
			set = append(set, overwrite(xdscontract.UpstreamEndpointHeader, upstream))
		}
		common.HeaderMutation = &extprocpb.HeaderMutation{SetHeaders: set}
	}
	return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocpb.HeadersResponse{Response: common}}})
}

// responseBody hands the chunk to the pick (Pick.Body: the pending prompt
// tokens back at the first byte, as relay does) and answers it: sent back
// in FULL_DUPLEX_STREAMED, let through otherwise.
func (s *epStream) responseBody(b *extprocpb.HttpBody) error {
	if s.req == nil {
		return fmt.Errorf("%w: response body before the request", errExtProcOrder)
	}
	if p := s.p; p != nil {
		p.Body(b.GetBody(), b.GetEndOfStream())
	}
	if s.respMode != filterpb.ProcessingMode_FULL_DUPLEX_STREAMED {
		return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocpb.BodyResponse{Response: &extprocpb.CommonResponse{}}}})
	}
	return sendChunks(b.GetBody(), b.GetEndOfStream(), func(chunk []byte, eos bool) error {
		return s.srv.Send(&extprocpb.ProcessingResponse{Response: &extprocpb.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocpb.BodyResponse{Response: streamed(chunk, eos)}}})
	})
}

// end gives the pick's accounting back: the stream is over.
func (s *epStream) end() {
	if s.p != nil {
		s.p.Close()
	}
}

func headersAnswer(common *extprocpb.CommonResponse, md *structpb.Struct) *extprocpb.ProcessingResponse {
	return &extprocpb.ProcessingResponse{
		Response:        &extprocpb.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocpb.HeadersResponse{Response: common}},
		DynamicMetadata: md,
	}
}

func streamed(chunk []byte, eos bool) *extprocpb.CommonResponse {
	return &extprocpb.CommonResponse{BodyMutation: &extprocpb.BodyMutation{Mutation: &extprocpb.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocpb.StreamedBodyResponse{Body: chunk, EndOfStream: eos}}}}
}

// sendChunks calls send for body in pieces of at most streamBodyChunk
// bytes, eos on the last (one empty piece for an empty body).
func sendChunks(body []byte, eos bool, send func(chunk []byte, eos bool) error) error {
	for {
		n := min(len(body), streamBodyChunk)
		last := n == len(body)
		if err := send(body[:n], eos && last); err != nil {
			return err
		}
		if last {
			return nil
		}
		body = body[n:]
	}
}

func overwrite(key, value string) *core.HeaderValueOption {
	return &core.HeaderValueOption{
		Header:       &core.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}
