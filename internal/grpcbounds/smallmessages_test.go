package grpcbounds

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// TestSmallMessagesSendNoBDPPings runs a stream of small messages and
// their small answers, as a heartbeat stream is, over real loopback
// connections, and reads the HTTP/2 frames each side wrote with
// golang.org/x/net/http2's framer. With dynamic windows (grpc-go's
// default) both sides send a BDP ping for most messages; with
// SmallMessages and SmallMessagesDial, none.
func TestSmallMessagesSendNoBDPPings(t *testing.T) {
	const messages = 50
	for _, tc := range []struct {
		name   string
		server []grpc.ServerOption
		dial   []grpc.DialOption
		static bool
	}{
		{"dynamic windows (grpc-go's default)", nil, nil, false},
		{"SmallMessages", SmallMessages(), SmallMessagesDial(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fromClient, fromServer := echoStream(t, tc.server, tc.dial, messages)
			clientPings, serverPings := pings(t, fromClient, true), pings(t, fromServer, false)
			if tc.static && (clientPings > 0 || serverPings > 0) {
				t.Errorf("%d pings from the client, %d from the server; want none", clientPings, serverPings)
			}
			// The control: the frames are read right, and the default does
			// ping (half the messages is far below what it sends).
			if !tc.static && (clientPings < messages/2 || serverPings < messages/2) {
				t.Errorf("%d pings from the client, %d from the server; want BDP pings for most of %d messages", clientPings, serverPings, messages)
			}
		})
	}
}

// echoStream sends n small messages on one stream, each answered before
// the next, and returns the bytes the client and the server wrote.
func echoStream(t *testing.T, sopts []grpc.ServerOption, dopts []grpc.DialOption, n int) (fromClient, fromServer []byte) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingListener{Listener: lis}
	srv := grpc.NewServer(sopts...)
	testpb.RegisterTestServiceServer(srv, echoServer{})
	go func() { _ = srv.Serve(rec) }()
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := testpb.NewTestServiceClient(cc).FullDuplexCall(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 300)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream ended with %v, want EOF", err)
	}
	_ = cc.Close()
	srv.Stop()
	return rec.read(), rec.written()
}

// echoServer answers each message of a FullDuplexCall with a small one.
type echoServer struct {
	testpb.UnimplementedTestServiceServer
}

func (echoServer) FullDuplexCall(stream testpb.TestService_FullDuplexCallServer) error {
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, 20)}}); err != nil {
			return err
		}
	}
}

// pings counts the PING frames (not their acks) in the frames of one
// direction; fromClient skips the client's connection preface first.
func pings(t *testing.T, b []byte, fromClient bool) int {
	t.Helper()
	if fromClient {
		if !bytes.HasPrefix(b, []byte(http2.ClientPreface)) {
			t.Fatalf("the client's bytes do not start with the HTTP/2 preface")
		}
		b = b[len(http2.ClientPreface):]
	}
	fr := http2.NewFramer(nil, bytes.NewReader(b))
	fr.SetMaxReadFrameSize(1 << 24)
	n := 0
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return n // the end of what was recorded
		}
		if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
			n++
		}
	}
}

// recordingListener records the bytes of its one accepted connection in
// both directions.
type recordingListener struct {
	net.Listener
	mu       sync.Mutex
	in, out  bytes.Buffer
	accepted bool
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.accepted {
		_ = c.Close()
		return nil, errors.New("grpcbounds test: one connection only")
	}
	l.accepted = true
	return &recordingConn{Conn: c, l: l}, nil
}

func (l *recordingListener) read() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.in.Bytes())
}

func (l *recordingListener) written() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.out.Bytes())
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.mu.Lock()
	c.l.in.Write(p[:n])
	c.l.mu.Unlock()
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.l.mu.Lock()
	c.l.out.Write(p[:n])
	c.l.mu.Unlock()
	return n, err
}
