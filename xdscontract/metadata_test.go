package xdscontract

import (
	"fmt"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzEndpointMetadata checks that EndpointMetadata reads back the cell id
// and max_model_len written under MetadataKey and survives any metadata a
// data plane could receive.
func FuzzEndpointMetadata(f *testing.F) {
	f.Add("cell-1", 8192.0, true)
	f.Add("", -1.0, true)
	f.Add("c", 4294967296.0, true)
	f.Add("c", 1.5, false)
	f.Fuzz(func(t *testing.T, cell string, n float64, asNumber bool) {
		v := structpb.NewStringValue(fmt.Sprint(n))
		if asNumber {
			v = structpb.NewNumberValue(n)
		}
		md := &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
			MetadataKey: {Fields: map[string]*structpb.Value{MetadataCell: structpb.NewStringValue(cell), MetadataMaxModelLen: v}},
		}}
		gotCell, gotLen := EndpointMetadata(md)
		if gotCell != cell {
			t.Fatalf("cell %q, want %q", gotCell, cell)
		}
		if gotLen != 0 && (!asNumber || float64(gotLen) != n) {
			t.Fatalf("max_model_len %d from %v (number %v)", gotLen, n, asNumber)
		}
		if asNumber && n >= 1 && n <= 4294967295 && n == float64(uint32(n)) && gotLen != uint32(n) {
			t.Fatalf("max_model_len %d, want %v", gotLen, n)
		}
		if c, l := EndpointMetadata(nil); c != "" || l != 0 {
			t.Fatal("nil metadata read as non-empty")
		}
	})
}
