package extproc

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocpb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// fakeEPStream is the server side of an ext_proc stream fed from a list:
// Recv returns the messages, then io.EOF (the proxy closed its side);
// Send checks every answer is one Envoy accepts as a message.
type fakeEPStream struct {
	grpc.ServerStream
	t    testing.TB
	in   []*extprocpb.ProcessingRequest
	sent int
}

func (f *fakeEPStream) Context() context.Context { return context.Background() }

func (f *fakeEPStream) Recv() (*extprocpb.ProcessingRequest, error) {
	if len(f.in) == 0 {
		return nil, io.EOF
	}
	m := f.in[0]
	f.in = f.in[1:]
	return m, nil
}

func (f *fakeEPStream) Send(r *extprocpb.ProcessingResponse) error {
	if r.GetResponse() == nil {
		f.t.Fatalf("answer without a response: %v", r)
	}
	if err := r.ValidateAll(); err != nil {
		f.t.Fatalf("answer Envoy would refuse: %v", err)
	}
	f.sent++
	return nil
}

func (f *fakeEPStream) SetHeader(metadata.MD) error  { return nil }
func (f *fakeEPStream) SendHeader(metadata.MD) error { return nil }
func (f *fakeEPStream) SetTrailer(metadata.MD)       {}

// fuzzPicker is a gateway (not started) holding one model's table, and
// the ext_proc service on it.
func fuzzPicker(t testing.TB) (*extProc, *gateway.Gateway) {
	g, err := gateway.New(gateway.Config{Controller: "127.0.0.1:1", Region: "r1", LB: gateway.LBIsobar, MaxBodyBytes: 64 << 10},
		gateway.Deps{Logger: discardLogger(), DialOptions: insecureDial})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := threeEndpoints()
	b, err := xds.NewBuilder(xds.Config{Region: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Build(st)
	if err != nil {
		t.Fatal(err)
	}
	pack := func(ms ...proto.Message) []*anypb.Any {
		var out []*anypb.Any
		for _, m := range ms {
			a, err := anypb.New(m)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, a)
		}
		return out
	}
	var cs, es, rs []proto.Message
	for _, c := range res.Envoy.Clusters {
		cs = append(cs, c)
	}
	for _, e := range res.Envoy.Endpoints {
		es = append(es, e)
	}
	for _, r := range res.Envoy.Routes {
		rs = append(rs, r)
	}
	if err := g.LoadResources(pack(cs...), pack(es...), pack(rs...), "1"); err != nil {
		t.Fatal(err)
	}
	if !g.Table().Ready() {
		t.Fatal("fuzz table not ready")
	}
	m, err := newPickerMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return newExtProc(g, m, discardLogger(), clockwork.NewRealClock(), false), g
}

// FuzzExtProcStream drives one ext_proc stream, as a proxy would shape it
// from outside input (the request's headers, body and subset hint, the
// body modes, the response status) plus one arbitrary message decoded
// from raw bytes, through the picker. It must never panic, must answer
// only with messages Envoy accepts, must end only cleanly or with
// InvalidArgument or ResourceExhausted, and must give back every pick.
func FuzzExtProcStream(f *testing.F) {
	f.Add(uint8(2), uint8(1), ":method: POST\n:path: /v1/completions\ncontent-type: application/json", []byte(`{"model":"m","prompt":"hi"}`), "", uint16(200), []byte(nil))
	f.Add(uint8(4), uint8(4), ":method: POST\n:path: /v1/chat/completions", []byte(`{"model":"m","messages":[]}`), "192.0.2.1:8001", uint16(200), []byte(nil))
	f.Add(uint8(0), uint8(0), ":method: POST\n:path: /v1/completions\nx-isobar-model: m\ncontent-length: 40", []byte(nil), "192.0.2.1", uint16(503), []byte(nil))
	f.Add(uint8(3), uint8(2), ":method: POST\n:path: /v1/completions\nx-isobar-prompt-tokens: 7", []byte(`{"model":7}`), "x;y", uint16(400), []byte{0x0a, 0x00})
	f.Add(uint8(1), uint8(1), ":method: GET\n:path: /v1/models\nx-gateway-destination-endpoint: 203.0.113.1:22", []byte(nil), "", uint16(200), []byte(nil))
	f.Add(uint8(2), uint8(9), ":method: POST\n:path: /v1/completions", []byte("\x00{"), "", uint16(0), []byte{0x1a, 0x02, 0x0a, 0x00})
	ep, g := fuzzPicker(f)
	f.Fuzz(func(t *testing.T, reqMode, respMode uint8, headerText string, body []byte, hint string, respStatus uint16, raw []byte) {
		if len(body) > 1<<17 || len(headerText) > 1<<14 || len(hint) > 1<<12 {
			return
		}
		var msgs []*extprocpb.ProcessingRequest
		hm := &core.HeaderMap{}
		for line := range strings.SplitSeq(headerText, "\n") {
			k, v, _ := strings.Cut(line, ": ")
			hm.Headers = append(hm.Headers, &core.HeaderValue{Key: k, RawValue: []byte(v)})
		}
		first := &extprocpb.ProcessingRequest{
			Request: &extprocpb.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocpb.HttpHeaders{Headers: hm, EndOfStream: body == nil}},
			ProtocolConfig: &extprocpb.ProtocolConfiguration{
				RequestBodyMode:  filterpb.ProcessingMode_BodySendMode(reqMode % 7),
				ResponseBodyMode: filterpb.ProcessingMode_BodySendMode(respMode % 7),
			},
		}
		if hint != "" {
			var vals []any
			for h := range strings.SplitSeq(hint, ";") {
				vals = append(vals, h)
			}
			if l, err := structpb.NewList(vals); err == nil {
				first.MetadataContext = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
					xdscontract.SubsetHintNamespace: {Fields: map[string]*structpb.Value{xdscontract.SubsetHintKey: structpb.NewListValue(l)}}}}
			}
		}
		msgs = append(msgs, first)
		if body != nil {
			half := len(body) / 2
			msgs = append(msgs,
				&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestBody{RequestBody: &extprocpb.HttpBody{Body: body[:half]}}},
				&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_RequestBody{RequestBody: &extprocpb.HttpBody{Body: body[half:], EndOfStream: true}}})
		}
		var extra extprocpb.ProcessingRequest
		if len(raw) > 0 && proto.Unmarshal(raw, &extra) == nil {
			msgs = append(msgs, &extra)
		}
		if respStatus != 0 {
			msgs = append(msgs,
				&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocpb.HttpHeaders{
					Headers: &core.HeaderMap{Headers: []*core.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(int(respStatus)))}}}}}},
				&extprocpb.ProcessingRequest{Request: &extprocpb.ProcessingRequest_ResponseBody{ResponseBody: &extprocpb.HttpBody{
					Body: []byte(`{"error":"maximum context length is 4096 tokens"}`), EndOfStream: true}}})
		}
		err := ep.Process(&fakeEPStream{t: t, in: msgs})
		if err != nil {
			switch status.Code(err) {
			case codes.InvalidArgument, codes.ResourceExhausted:
			default:
				t.Fatalf("stream ended with %v", err)
			}
			if errors.Is(err, io.EOF) {
				t.Fatal("io.EOF leaked as an error")
			}
		}
		inflight, pending, active := g.Load()
		for a, n := range inflight {
			if p := pending[a]; n != 0 || p != 0 {
				t.Fatalf("host %s keeps %d in flight and %d pending tokens after the stream", a, n, p)
			}
		}
		for cl, a := range active {
			if a != 0 {
				t.Fatalf("cluster %s keeps %d active after the stream", cl, a)
			}
		}
	})
}
