package xds

import (
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/isobar-mesh/isobar/xdscontract"
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

// resourceType indexes the resource types this server serves, as
// go-control-plane's types.ResponseType indexes a snapshot's: per-type
// arrays (stream state, versions, resource names) are [numTypes]T indexed
// by it. The order is the xDS one: listener, route, cluster, endpoint.
type resourceType int

const (
	typeListener resourceType = iota
	typeRoute
	typeCluster
	typeEndpoint
	// numTypes is the number of served resource types.
	numTypes
	// typeOther is any type URL this server does not serve.
	typeOther resourceType = -1
)

// typeIndex maps a type URL to its resourceType; typeOther for any other.
func typeIndex(typeURL string) resourceType {
	switch typeURL {
	case resource.ListenerType:
		return typeListener
	case resource.RouteType:
		return typeRoute
	case resource.ClusterType:
		return typeCluster
	case resource.EndpointType:
		return typeEndpoint
	default:
		return typeOther
	}
}

// url is the type URL of a served type.
func (t resourceType) url() string {
	switch t {
	case typeListener:
		return resource.ListenerType
	case typeRoute:
		return resource.RouteType
	case typeCluster:
		return resource.ClusterType
	default:
		return resource.EndpointType
	}
}

// label is the bounded name of t used in metrics and logs.
func (t resourceType) label() string {
	switch t {
	case typeListener:
		return "listener"
	case typeRoute:
		return "route"
	case typeCluster:
		return "cluster"
	case typeEndpoint:
		return "endpoint"
	default:
		return "other"
	}
}

// typeLabel maps a type URL to the bounded label used in metrics and logs:
// a served type's label, "lb_endpoint" for LEDS (Config.LEDS). Type URLs
// come from clients, so anything unknown is "other".
func typeLabel(typeURL string) string {
	if typeURL == xdscontract.LbEndpointType {
		return "lb_endpoint"
	}
	return typeIndex(typeURL).label()
}
