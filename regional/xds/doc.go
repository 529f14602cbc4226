// Package xds is the regional controller's xDS layer: it turns a desired
// State (models, localities, weighted endpoints) into validated xDS
// snapshots and serves them over ADS to the region's Envoy, to isobar's
// gateway and to proxyless gRPC clients.
//
// The names, request headers, metadata keys, LB policy names and resource
// validation it writes by belong to package xdscontract, the contract it
// shares with every data plane that consumes its resources; below, an
// unqualified name such as ClusterName is xdscontract's.
//
// # What it owns
//
//   - The resource shapes (Builder). Envoy-like nodes get one HTTP Listener
//     (ListenerName) whose HttpConnectionManager loads RouteName over RDS via
//     ADS and runs the fault filter then the router; one RouteConfiguration
//     with a virtual host "*"; and per model a main Cluster (ClusterName:
//     EDS over ADS, the configured LB policy with locality weighting,
//     outlier detection, circuit breakers with a retry budget, connect
//     timeout) with its ClusterLoadAssignment (locality and endpoint
//     weights, EDS health DEGRADED for endpoints under a hardware derate,
//     endpoint metadata under MetadataKey: cell, max_model_len, the
//     placement inputs prefill_tokens_per_s, max_num_seqs, rtt_ms and
//     jitter_ms when known; locality metadata rtt_ms and jitter_ms for a
//     remote region's locality), plus Envoy-only
//     clusters built from the same endpoints: LocalClusterName (the
//     localities of Config.Region only, always present, possibly empty),
//     and per context class N of Config.ContextClasses ClassClusterName
//     (endpoints whose max_model_len is >= N or unknown, local and remote)
//     and LocalClassClusterName (the same, local only). A class cluster
//     that never had an endpoint is left out; once it has had one it
//     stays, empty or not, while its class does (make-before-break: a
//     route a data plane still holds never names a missing cluster). Filtered localities keep their weights;
//     emptied ones are dropped and priorities renumbered without gaps.
//     Proxyless gRPC nodes get, per model, an api_listener named after the
//     model with the route inlined, and the main Clusters and
//     ClusterLoadAssignments only. grpc-go honours endpoint weights only
//     under ring_hash, and drops DEGRADED endpoints.
//   - The LB policy. By default (LeastRequest) every cluster carries the
//     typed envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest
//     in load_balancing_policy: choice_count Config.ChoiceCount (2), or
//     selection_method FULL_SCAN (Config.FullScan), with locality-weighted
//     balancing in its locality_lb_config; the message is validated before
//     it is packed. Endpoint weights are capacity bands, equal for
//     identical healthy cells (regional/projection), so Envoy picks by
//     active requests on its unweighted path. The list then ends in
//     wrr_locality{round_robin}: xDS clients run the first entry they
//     know, and gRPC's Node and C-core libraries have no least_request, so
//     without it they refuse the Cluster (docs/interop.md has what each
//     client runs). RingHash and RoundRobin use
//     the legacy lb_policy enum (tests that check weights through grpc-go
//     use RingHash).
//   - The routes, per model, in match order (all require Config.ModelHeader
//     equal to the model; with a single model the same routes are repeated
//     without that condition as a catch-all):
//     1. Forwarded traffic (Config.HopHeader present, any value): by class
//     to the local class clusters, else to the local cluster. Never
//     forwarded again, never shed: no routing loop. The hop header and
//     xdscontract.HopAuthHeader are the RouteConfiguration's
//     internal_only_headers, which Envoy strips from external requests
//     before matching, so only traffic Envoy finds internal (or isobar's
//     gateway and picker, on a valid hop proof) reaches these routes.
//     2. Client traffic by class to the class clusters.
//     3. The rest to the main cluster.
//     A request's class is the smallest present class N that its token need
//     fits: PromptTokensHeader by int64 range (prev, N], or, when that
//     header is absent, content-length by range (4·prev, 4·N] (BytesPerToken
//     bytes per token, rounded up). A need above every present class, or no
//     size at all, goes to the main (local) cluster; a class with no
//     endpoint is left out, so its requests fall to the next larger class.
//     Routes of a model with Model.Shed > 0 carry a per-route HTTPFault
//     aborting that share (per million) of requests with 429.
//   - Validation before anything is served: the input State (weights >= 1,
//     IP hosts, no duplicate address or cell within a model, no duplicate
//     locality or priority gap, names by CheckName), ValidateAll on every
//     resource and on every message packed in an Any (ValidateDeep), the
//     snapshot's Consistent(), and a
//     reference check (routes and inlined api_listener routes point at
//     clusters of the same set; clusters and assignments pair up). A refused
//     State is counted, logged, returned as an error, and the previous
//     snapshot stays in place.
//   - Versions. Each resource type of each node kind has its own version: the
//     number of the Push that last changed it. A weight change therefore
//     sends only EDS. The same State always yields the same resources, in
//     canonical order whatever the input order.
//   - Serving and observing. Nodes are classified by user_agent_name
//     (ClassifyNode) and a NodeHash maps every node of a kind to one cache
//     key, so one Push serves every node that connects. ACKs and NACKs are
//     counted per type; a NACK is logged once per version and the rejected
//     version is not resent until the type changes (no resend storm).
//     WaitForAck and Streams expose what clients acknowledged.
//
// # Concurrency
//
// Push calls are serialised by the Server; the Builder they use is not safe
// for concurrent use on its own. The xDS library runs one goroutine per
// stream (owned by the grpc.Server passed to Register) and calls the
// Server's callbacks from them; the callbacks and Push share one mutex for
// the ACK table and versions. The Server starts no goroutine of its own.
// Stop cancels the streams, fails waiters, refuses new streams and waits
// for an in-flight Push; call it before stopping the grpc.Server.
//
// # Contracts
//
//   - Resources returned by a Builder are shared between builds and node
//     kinds: never modify them.
//   - Push is cheap when little changes: a Cluster and a gRPC Listener are
//     built and validated once per name, the RouteConfiguration when the set
//     of models, their shed shares or their present classes change, and a
//     model's ClusterLoadAssignments when its endpoints change (the
//     Envoy-only ones share the main one's endpoint messages).
//   - Delta xDS streams are served but their ACKs are not tracked; configure
//     clients for state-of-the-world ADS.
package xds
