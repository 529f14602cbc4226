package interop

import (
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// rawCodec passes message bytes through unchanged, so a backend answers any
// method without generated code (the judges send an empty message).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" } // what the clients send

var _ encoding.Codec = rawCodec{}

// backend is a real gRPC server on loopback that answers every unary call
// with its name: the endpoint a cell advertises, so the judges' RPCs show
// which endpoint their xDS client picked.
type backend struct {
	name  string
	addr  string
	calls atomic.Int64
	// unavailable makes every call fail with UNAVAILABLE, the status the
	// gRPC route's retry policy retries.
	unavailable atomic.Bool
	failed      atomic.Int64
}

func startBackend(t *testing.T, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, addr: ln.Addr().String()}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var in []byte
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		b.calls.Add(1)
		if b.unavailable.Load() {
			b.failed.Add(1)
			return status.Error(codes.Unavailable, b.name+" is failing on purpose")
		}
		out := []byte(b.name)
		return ss.SendMsg(&out)
	}))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return b
}
