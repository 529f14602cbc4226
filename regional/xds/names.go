package xds

import (
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

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
