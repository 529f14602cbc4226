package regional

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// heartbeatFrame is what the heartbeat service receives into: the message
// and its wire-size cap. heartbeatCodec fills hb, or, when the encoded
// message is over limit, sets oversize to its size and decodes nothing.
type heartbeatFrame struct {
	limit    int
	oversize int
	hb       *isobarpb.CellHeartbeat
}

// heartbeatCodec is the controller's server codec: grpc-go's proto codec
// (google.golang.org/grpc/encoding/proto, which it delegates to for every
// message) plus a wire-size check of heartbeats before they are decoded.
//
// Why a codec: grpc.MaxRecvMsgSize is one limit for the whole server, and
// the server also receives data-plane reports (up to 4,096 endpoints, about
// 1 MiB) and xDS requests, so it cannot be set to the heartbeat's 64 KiB.
// The codec sees each message's encoded bytes before decoding and knows its
// destination type, so a heartbeat over Config.MaxMessageBytes is refused
// on its size without the decode's allocations.
type heartbeatCodec struct{ proto encoding.CodecV2 }

func newHeartbeatCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(heartbeatCodec{proto: encoding.GetCodecV2(proto.Name)})
}

func (c heartbeatCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c heartbeatCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*heartbeatFrame); ok {
		if n := data.Len(); f.limit > 0 && n > f.limit {
			f.oversize = n
			return nil
		}
		return c.proto.Unmarshal(data, f.hb)
	}
	return c.proto.Unmarshal(data, v)
}

// Name is the proto codec's: clients send application/grpc+proto.
func (heartbeatCodec) Name() string { return proto.Name }
