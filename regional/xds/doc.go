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
//     Per residency set of Model.Pinned, PinnedClusterName(model, set):
//     the set's own localities (Pinned.Localities, each in a region the
//     set allows), always present even when empty, with cluster metadata
//     filter_metadata["isobar"] {"residency": set, "allowed_regions":
//     [regions]} (MetadataResidency, MetadataAllowedRegions); and per
//     context class N present among the set's endpoints (Config's classes
//     and the max_model_len values the set's endpoints declare)
//     PinnedClassClusterName(model, set, N): the set's endpoints whose
//     max_model_len is >= N or unknown, filtered by the same code as the
//     unpinned class clusters, with the same lifecycle (left out until it
//     has an endpoint, then kept while its class is), and the pinned
//     cluster's settings and residency metadata. isobar's gateway
//     (--lb isobar) also keeps a prompt off an endpoint whose
//     max_model_len metadata is below it in every cluster.
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
//     2. Per residency set, in set order, client traffic whose
//     ResidencyHeader equals the set: by class to the set's pinned class
//     clusters, else to the set's pinned cluster.
//     3. Client traffic without ResidencyHeader by class to the class
//     clusters.
//     4. The rest without ResidencyHeader to the main cluster.
//     A request's class is the smallest present class N that its token need
//     fits: PromptTokensHeader by int64 range (prev, N], or, when that
//     header is absent, content-length by range (4·prev, 4·N] (BytesPerToken
//     bytes per token, rounded up). A need above every present class, or no
//     size at all, goes to the main (local, pinned) cluster; a class with no
//     endpoint (of the set, for a pinned route) is left out, so its
//     requests fall to the next larger class.
//     A client request naming a residency set the model does not list
//     matches no route: Envoy answers 404 rather than serve it outside its
//     regions.
//   - Shedding by criticality. Every client route group (a class route, a
//     main route, a pinned class route, a pinned route) is written as up
//     to three routes: one requiring CriticalityHeader == "critical", one
//     "sheddable", then the group's route for the rest (standard, absent
//     or any other value). Each carries its share (Model.Shed for the
//     rest, ShedCritical, ShedSheddable; a pinned set's own shares) as a
//     per-route HTTPFault aborting that share, per million, with 429 (503
//     on a set's pinned routes: its excess is never spilled); a share of
//     0 writes no fault. A criticality's route is written only when its
//     share differs from the standard one, which keeps RDS small. Envoy evaluates the
//     header matchers of a route together and takes the first route that
//     matches (envoy/config/route/v3/route_components.proto RouteMatch
//     headers, HeaderMatcher string_match exact: case-sensitive, so
//     "Critical" is standard), and the fault filter replaces its listener
//     config by the matched route's typed_per_filter_config
//     (envoy/extensions/filters/http/fault/v3/fault.proto HTTPFault abort,
//     percentage; the route's config replaces the filter's, as Envoy's
//     docs/root/intro/arch_overview/advanced/data_sharing_between_filters.rst
//     says of the fault filter, source/extensions/filters/http/fault/
//     fault_filter.cc). Forwarded traffic is never shed.
//     The criticality and residency headers are client input: an Envoy
//     deployment must strip or overwrite both before route selection
//     (in an authenticating proxy in front of the listener, or in Envoy
//     with the HttpConnectionManager's early_header_mutation_extensions;
//     a route's request_headers_to_remove acts only after the route is
//     chosen), or a client can promote itself to critical or pick its
//     residency. isobar's gateway does both itself: it reads criticality
//     only from trusted sources and sets or removes ResidencyHeader from
//     its own residency config.
//   - Residency. A set's pinned routes are split by context class as the
//     unpinned ones are, so under Envoy a long pinned prompt goes to the
//     set's class cluster that holds only the set's engines long enough
//     for it (or of unknown limit), never to a shorter one; a prompt above
//     every class of the set, or of no size, goes to the plain pinned
//     cluster, all of the set's endpoints. isobar's gateway keeps what it
//     knows of capability on top: the pinned endpoints carry max_model_len
//     in their metadata as on every cluster, for its pick to filter on, and
//     its rejection memory learns an undeclared limit. A set with no
//     allowed locality has an empty cluster, and Envoy answers its requests 503 "no healthy
//     upstream": never a fallback to the unpinned clusters. The proxyless
//     gRPC set carries no pinned route or cluster: a proxyless client sets
//     its own headers, so there is no trusted party between it and the
//     routes to say its residency, and a pinned workload must not use
//     proxyless gRPC across regions (give it a model whose every locality
//     is allowed, or route it through a gateway).
//   - The retry budget. Every cluster of a model carries
//     circuit_breakers.thresholds[DEFAULT].retry_budget: budget_percent is
//     Model.RetryBudgetPercent when above 0, rounded to a whole percent and
//     at least 1 (so that load noise does not rebuild the clusters: a
//     changed Cluster makes Envoy warm a new one and drain the old one's
//     connection pools), else Config.RetryBudgetPercent (20);
//     min_retry_concurrency is always Config.RetryBudgetMinConcurrency (3).
//     Envoy allows max(budget_percent × active requests,
//     min_retry_concurrency) concurrent retries
//     (envoy/config/cluster/v3/circuit_breaker.proto RetryBudget). The
//     regional controller sets the percent from the region's utilisation
//     by RetryBudgetAt on a RetryBudgetCurve: DefaultRetryBudgetCurve(max)
//     keeps the full budget (max, Config's 20 %) while retries fit in the
//     headroom, up to utilisation 100/(100+max) (0.83), falls along a
//     smoothstep to 1 % at full utilisation, where min_retry_concurrency
//     is what bounds retries on a small cluster (retrybudget.go says why).
//   - Validation before anything is served: the input State (weights >= 1,
//     IP hosts, no duplicate address or cell within a model, no duplicate
//     locality or priority gap, names by CheckName, shed shares in [0, 1],
//     retry budget in [0, 100]; residency sets named by CheckName, distinct,
//     at most residency.MaxSets per model, each locality's region, its
//     Region or else Config.Region, among the set's), ValidateAll on every
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
//   - Build and Push keep nothing of the State they are given: what the
//     Builder memoises (each model's input and canonical form) it copies,
//     into buffers of its own that it reuses from the build before last
//     (modelEntry.keepCanon). A caller may write over a State's slices once
//     Push has returned (the regional registry builds its next State in
//     them).
//   - Push is cheap when little changes: a Cluster and a gRPC Listener are
//     built and validated once per name (again when its model's published
//     retry budget or, for a pinned cluster or pinned class cluster, its
//     allowed regions change),
//     the RouteConfiguration when the set of models, their shed shares,
//     residency sets or present classes (a set's among them) change, and
//     a model's ClusterLoadAssignments when its endpoints change (the
//     Envoy-only ones share the main one's endpoint messages; a pinned
//     set's, its class clusters' included, when its localities change).
//     A model whose localities are those of its last build and whose
//     endpoints come in canonical order (the registry sends them by
//     address) is canonicalised from the last build (canonicalizeFrom):
//     only the endpoints not in the last input are checked, and the
//     duplicate sets follow what left and came, so a cycle that changes a
//     few of 10,000 endpoints does not parse and hash every one; anything
//     else, a problem included, takes the full path, which reports it.
//   - Delta (incremental) xDS streams are served; their ACKs, NACKs, stale
//     nonces and unknown names are counted but not tracked (WaitForAck and
//     Streams see state-of-the-world streams only). By default they get the
//     EDS layout, where a delta resource is a whole ClusterLoadAssignment.
//     With Config.LEDS they get the LEDS layout (leds.go): assignments
//     whose localities name an LbEndpoint glob collection
//     (xdscontract.LEDSCollection) and one LbEndpoint resource per endpoint
//     and collection, so one endpoint's change costs the same bytes
//     whatever the cluster's size. Clusters whose locality holds the same
//     endpoint messages share one collection (a uniform model's main,
//     local and class clusters: each endpoint is served once, not eight
//     times). State-of-the-world clients get the same
//     resources either way: go-control-plane's MuxCache routes them to the
//     snapshot cache they always used, delta requests to a second snapshot
//     cache and a LinearCache of LbEndpoints per node kind. A glob
//     subscription is served as the kind's wildcard (go-control-plane has
//     no glob collections), a superset for a client that subscribes to
//     fewer collections than its assignments name.
package xds
