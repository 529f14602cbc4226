package xdscontract

// Request headers the routes match.
const (
	// DefaultModelHeader is the default header selecting a model. The
	// server's routes and a data plane's matcher must use the same one.
	DefaultModelHeader = "x-isobar-model"
	// DefaultHopHeader is the default header marking traffic forwarded from
	// another region's data plane (any value); such requests go to a
	// model's local-only clusters, are never forwarded again and never
	// shed. It is trusted only from an authenticated isobar gateway
	// (HopAuthHeader); data planes strip it from every other request.
	DefaultHopHeader = "x-isobar-hop"
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
	// CriticalityHeader carries a request's criticality: "critical",
	// "standard" (the default) or "sheddable" (package reqclass). A data
	// plane trusts "critical" only from the sources its operator lists;
	// from any other it is read as at most standard.
	CriticalityHeader = "x-isobar-criticality"
	// TenantHeader names a request's tenant (package reqclass bounds it):
	// fairness between tenants in the gateway's queues and residency pins
	// (package residency) read it.
	TenantHeader = "x-isobar-tenant"
	// ObjectiveHeader names the Gateway API Inference Extension
	// InferenceObjective of a request, whose priority maps to a
	// criticality (reqclass.FromPriority) where a deployment configures
	// the objectives' priorities (site-src/api-types/inferenceobjective.md:
	// "the system uses a specific header: x-gateway-inference-objective").
	ObjectiveHeader = "x-gateway-inference-objective"
	// ResidencyHeader names the residency set (package residency) a
	// request is pinned to; routes matching it select the set's pinned
	// cluster (PinnedClusterName). isobar's gateway always sets or removes
	// it from its own residency config (tenant and model), whatever the
	// client sent; an Envoy deployment must do the same at its edge.
	ResidencyHeader = "x-isobar-residency"
)

// HopAuthHeader carries the proof that a request bearing the hop header
// was forwarded by an isobar gateway holding the operator's hop key (see
// package gateway, hop.go): "v1.<unix seconds>.<base64url HMAC-SHA256>".
// It is internal: data planes strip it, with the hop header, from every
// request that does not prove itself, and never send it to a cell.
const HopAuthHeader = "x-isobar-hop-auth"

// InternalHeaders are the request headers only isobar itself may set,
// given the hop header in use: a data plane removes them from requests
// that do not come from an authenticated isobar gateway, and the routes
// list them in the RouteConfiguration's internal_only_headers, which
// Envoy removes from every request it finds external before matching a
// route (envoy/config/route/v3/route.proto internal_only_headers;
// source/common/http/conn_manager_utility.cc mutateRequestHeaders →
// cleanInternalHeaders).
func InternalHeaders(hopHeader string) []string {
	return []string{hopHeader, HopAuthHeader}
}

// Response headers isobar's gateway sets and request headers it sends
// upstream. Clients, drills and load drivers read them from here.
const (
	// EndpointHeader names the endpoint that served the request: its cell
	// id, or the remote region's ingress address.
	EndpointHeader = "x-isobar-endpoint"
	// RegionHeader names the region of that endpoint.
	RegionHeader = "x-isobar-region"
	// UpstreamEndpointHeader carries the EndpointHeader a remote region's
	// gateway returned, when the request was forwarded there.
	UpstreamEndpointHeader = "x-isobar-upstream-endpoint"
	// AttemptHeader is sent upstream: 1 for the first attempt, 2 for the
	// first retry, ...
	AttemptHeader = "x-isobar-attempt"
	// ShedHeader is set on a refusal the gateway itself answered by
	// choice: "plan" (429) when the routing plan shed the request,
	// "saturated" (429) when every endpoint was at its in-flight limit and
	// the queue is off, "queue_full", "queue_evicted" or "queue_expired"
	// (429) when the flow-control queue refused, displaced or timed out
	// the request, "residency" (503) when its residency set's regions had
	// no capacity left for it. Clients use it to count failures by cause
	// without parsing the body.
	ShedHeader = "x-isobar-shed"
)

// The Endpoint Picker Protocol's names, as the Gateway API Inference
// Extension defines them (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol/README.md, "Destination
// Endpoint" and "Endpoint Subset"; the same strings as its
// pkg/lwepp/metadata/consts.go).
const (
	// DestinationEndpointHeader is the request header in which the picker
	// names the chosen endpoint ("ip:port"); Envoy's ORIGINAL_DST cluster
	// reads it (original_dst_lb_config.http_header_name).
	DestinationEndpointHeader = "x-gateway-destination-endpoint"
	// DestinationEndpointNamespace is the dynamic metadata namespace in
	// which the picker names the same endpoint, under the key
	// DestinationEndpointHeader.
	DestinationEndpointNamespace = "envoy.lb"
	// SubsetHintNamespace is the filter metadata namespace in which the
	// proxy may restrict the endpoints the picker may choose.
	SubsetHintNamespace = "envoy.lb.subset_hint"
	// SubsetHintKey is the key, in SubsetHintNamespace, of the list of
	// "ip:port" strings the picker must choose among.
	SubsetHintKey = "x-gateway-destination-endpoint-subset"
)
