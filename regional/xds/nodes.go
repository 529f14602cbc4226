package xds

import (
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// NodeKind is the kind of xDS client, which decides the resource set it gets.
type NodeKind string

// Node kinds.
const (
	// KindEnvoy is Envoy, isobar's gateway and any other client that is not
	// a proxyless gRPC library: it gets the HTTP listener, the RDS route and
	// the clusters.
	KindEnvoy NodeKind = "envoy"
	// KindGRPC is a proxyless gRPC client (user_agent_name "gRPC Go", "gRPC
	// Java", ...): it gets one api_listener per model.
	KindGRPC NodeKind = "grpc"
)

// ClassifyNode returns the kind of a node from its user_agent_name.
func ClassifyNode(n *core.Node) NodeKind {
	if strings.HasPrefix(n.GetUserAgentName(), "gRPC ") {
		return KindGRPC
	}
	return KindEnvoy
}

// nodeHash maps every node of a kind to one snapshot-cache key, so one
// SetSnapshot per kind serves every node that connects, whatever its id.
type nodeHash struct{}

var _ cache.NodeHash = nodeHash{}

// ID implements cache.NodeHash.
func (nodeHash) ID(n *core.Node) string { return string(ClassifyNode(n)) }
