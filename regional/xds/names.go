package xds

import (
	"math"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Resource names of the Envoy set. The proxyless gRPC set has one Listener
// per model, named after the model (see GRPCListenerName).
const (
	// ListenerName is the name of the Envoy HTTP listener.
	ListenerName = "isobar_http"
	// RouteName is the name of the RouteConfiguration that the Envoy
	// listener loads over RDS.
	RouteName = "isobar_models"
)

// Request headers the Envoy routes match besides Config.ModelHeader and
// Config.HopHeader.
const (
	// PromptTokensHeader carries a client's count of the tokens its request
	// needs (the prompt, plus max_tokens when the client wants the class to
	// cover the whole context), as a decimal integer. It selects the
	// context-length class.
	PromptTokensHeader = "x-isobar-prompt-tokens"
	// BytesPerToken is the convention used when PromptTokensHeader is
	// absent: the request's content-length over 4, rounded up, counts as its
	// token need. isobar's simulated engine counts a prompt of n bytes as
	// ceil(n/4) tokens; JSON framing makes the estimate a little high, which
	// errs towards the larger class.
	BytesPerToken = 4
)

// ClusterName is the name of the Cluster (and of its ClusterLoadAssignment)
// that serves model: every endpoint, local and remote.
func ClusterName(model string) string { return "isobar/" + model }

// LocalClusterName is the Envoy-only cluster of model's local endpoints
// (the localities whose region is Config.Region). Requests carrying the hop
// header go there. It is always present, empty when no local endpoint
// serves the model.
func LocalClusterName(model string) string { return ClusterName(model) + "/local" }

// ClassClusterName is the Envoy-only cluster of model's endpoints, local and
// remote, whose max_model_len is at least tokens (or unknown). It is present
// only when it has an endpoint.
func ClassClusterName(model string, tokens uint32) string {
	return ClusterName(model) + "/ctx-" + strconv.FormatUint(uint64(tokens), 10)
}

// LocalClassClusterName is the Envoy-only cluster of model's local endpoints
// whose max_model_len is at least tokens (or unknown), for forwarded
// traffic. It is present only when it has an endpoint.
func LocalClassClusterName(model string, tokens uint32) string {
	return LocalClusterName(model) + "/ctx-" + strconv.FormatUint(uint64(tokens), 10)
}

// GRPCListenerName is the Listener name a proxyless gRPC client subscribes
// to when it dials "xds:///" + model: the model name itself.
func GRPCListenerName(model string) string { return model }

// statName turns a model name into a token safe inside Envoy stat names
// (no dots, no slashes).
func statName(model string) string {
	var b strings.Builder
	b.Grow(len("isobar_") + len(model))
	b.WriteString("isobar_")
	for i := 0; i < len(model); i++ {
		c := model[i]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// typeLabel maps a type URL to the bounded label used in metrics and logs.
// Type URLs come from clients, so anything unknown is "other".
func typeLabel(typeURL string) string {
	switch typeURL {
	case resource.ListenerType:
		return "listener"
	case resource.RouteType:
		return "route"
	case resource.ClusterType:
		return "cluster"
	case resource.EndpointType:
		return "endpoint"
	default:
		return "other"
	}
}

// typeIndex orders the four served types; -1 for any other.
func typeIndex(typeURL string) int {
	switch typeURL {
	case resource.ListenerType:
		return 0
	case resource.RouteType:
		return 1
	case resource.ClusterType:
		return 2
	case resource.EndpointType:
		return 3
	default:
		return -1
	}
}

// numTypes is the number of served resource types.
const numTypes = 4

// servedType is the inverse of typeIndex.
func servedType(i int) string {
	switch i {
	case 0:
		return resource.ListenerType
	case 1:
		return resource.RouteType
	case 2:
		return resource.ClusterType
	default:
		return resource.EndpointType
	}
}

// EndpointMetadata reads what the builder writes under MetadataKey: the
// cell id and max_model_len (0 when absent or not a whole number in
// [1, 2^32-1]). It accepts any metadata, as a data-plane consumer must.
func EndpointMetadata(md *core.Metadata) (cellID string, maxModelLen uint32) {
	fields := md.GetFilterMetadata()[MetadataKey].GetFields()
	cellID = fields["cell"].GetStringValue()
	if v, ok := fields["max_model_len"].GetKind().(*structpb.Value_NumberValue); ok {
		f := v.NumberValue
		if f >= 1 && f <= math.MaxUint32 && f == math.Trunc(f) {
			maxModelLen = uint32(f)
		}
	}
	return cellID, maxModelLen
}
