// Package xds is the regional controller's xDS layer: it turns a desired
// State (models, localities, weighted endpoints) into validated xDS
// snapshots and serves them over ADS to the region's Envoy, to isobar's
// gateway and to proxyless gRPC clients.
//
// # What it owns
//
//   - The resource shapes (Builder). Envoy-like nodes get one HTTP Listener
//     (ListenerName) whose HttpConnectionManager loads RouteName over RDS via
//     ADS, one RouteConfiguration with a virtual host "*" routing on
//     Config.ModelHeader (plus a catch-all when there is one model), and per
//     model a Cluster (ClusterName: EDS over ADS, the configured LB policy
//     with locality weighting, outlier detection, circuit breakers with a
//     retry budget, connect timeout) and its ClusterLoadAssignment (locality
//     and endpoint weights, endpoint metadata under MetadataKey). Proxyless
//     gRPC nodes get, per model, an api_listener named after the model with
//     the route inlined, and the same Clusters and ClusterLoadAssignments.
//     grpc-go honours endpoint weights only under ring_hash.
//   - Validation before anything is served: the input State (weights >= 1,
//     IP hosts, no duplicate address or cell within a model, no duplicate
//     locality or priority gap, names), ValidateAll on every resource and on
//     every message packed in an Any, the snapshot's Consistent(), and a
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
//     built and validated once per model, the RouteConfiguration when the set
//     of models changes, and a ClusterLoadAssignment when that model's
//     endpoints change.
//   - Delta xDS streams are served but their ACKs are not tracked; configure
//     clients for state-of-the-world ADS.
package xds
