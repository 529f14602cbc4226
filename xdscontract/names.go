package xdscontract

import "strconv"

// Resource names of the Envoy set. The proxyless gRPC set has one Listener
// per model, named after the model (see GRPCListenerName).
const (
	// ListenerName is the name of the Envoy HTTP listener.
	ListenerName = "isobar_http"
	// RouteName is the name of the RouteConfiguration that the Envoy
	// listener loads over RDS, and that a data plane serves from.
	RouteName = "isobar_models"
)

// ClusterName is the name of the Cluster (and of its ClusterLoadAssignment)
// that serves model: every endpoint, local and remote.
func ClusterName(model string) string { return "isobar/" + model }

// LocalClusterName is the Envoy-only cluster of model's local endpoints
// (the localities of the server's own region). Requests carrying the hop
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

// PinnedClusterName is the cluster of model's requests pinned to residency
// set set (package residency): only the localities of the regions the set
// allows. Routes matching ResidencyHeader = set select it, ahead of the
// model's unpinned routes, which require ResidencyHeader to be absent; a
// data plane never sends its requests elsewhere, and answers 503 when it
// is empty (Envoy: "no healthy upstream"; isobar's gateway names the
// set). It is present for every residency set the server's State lists
// for the model, empty or not.
func PinnedClusterName(model, set string) string { return ClusterName(model) + "/pin-" + set }

// PinnedClassClusterName is the Envoy-only cluster of model's requests
// pinned to residency set set whose prompt fits context class tokens: the
// endpoints of PinnedClusterName(model, set) whose max_model_len is at
// least tokens (or unknown), with the same residency metadata. Routes
// matching ResidencyHeader = set choose it by prompt size, as the unpinned
// routes choose a ClassClusterName, ahead of the set's plain pinned route.
// It is present only once it has had an endpoint.
func PinnedClassClusterName(model, set string, tokens uint32) string {
	return PinnedClusterName(model, set) + "/ctx-" + strconv.FormatUint(uint64(tokens), 10)
}

// GRPCListenerName is the Listener name a proxyless gRPC client subscribes
// to when it dials "xds:///" + model: the model name itself.
func GRPCListenerName(model string) string { return model }
