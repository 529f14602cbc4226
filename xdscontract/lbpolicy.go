package xdscontract

// LBPolicy names the load-balancing policy the server writes into every
// served Cluster.
type LBPolicy string

// The policies a served Cluster may carry.
const (
	// LeastRequest is written as the typed
	// envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest
	// (extension LeastRequestExtension) in the cluster's
	// load_balancing_policy, with a choice_count or FULL_SCAN and
	// locality-weighted balancing. Identical healthy cells carry equal
	// weights (regional/projection bands), so Envoy stays on its unweighted
	// path: P2C or a full scan over active requests, shared across workers,
	// and never its per-worker EDF schedule. grpc-go ignores endpoint and
	// locality weights under it.
	LeastRequest LBPolicy = "least_request"
	// RingHash is a consistent-hash ring with XX_HASH, in the legacy
	// lb_policy enum. It is the policy under which grpc-go honours
	// per-endpoint weights.
	RingHash LBPolicy = "ring_hash"
	// RoundRobin is weighted round robin, in the legacy lb_policy enum;
	// grpc-go honours only locality weights under it.
	RoundRobin LBPolicy = "round_robin"
)

// LeastRequestExtension is the typed_extension_config name of Envoy's
// typed least-request load-balancing policy (LeastRequest).
const LeastRequestExtension = "envoy.load_balancing_policies.least_request"
