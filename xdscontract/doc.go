// Package xdscontract is the contract between isobar's xDS server (the
// regional controller's regional/xds) and any data plane that consumes what
// it serves: isobar's gateway, Envoy, proxyless gRPC clients and tools that
// read the served resources. The server writes by it and a data plane reads
// by it; neither side defines these names itself.
//
// # What it owns
//
//   - Resource names: the Envoy listener (ListenerName), its
//     RouteConfiguration (RouteName), and per model the main cluster
//     (ClusterName), the local-only cluster (LocalClusterName), the
//     context-class clusters (ClassClusterName, LocalClassClusterName) and
//     the proxyless gRPC listener (GRPCListenerName). A cluster's
//     ClusterLoadAssignment carries the cluster's name.
//   - Request headers the routes match: the defaults of the model and hop
//     headers (DefaultModelHeader, DefaultHopHeader), the client's token
//     count (PromptTokensHeader) and the body-size convention used when it
//     is absent (BytesPerToken).
//   - Endpoint and locality metadata: the filter_metadata namespace
//     (MetadataKey), its keys (MetadataCell, MetadataMaxModelLen,
//     MetadataProbeBudget, MetadataPrefillRate, MetadataMaxNumSeqs,
//     MetadataRTT, MetadataJitter), the bounds beyond which a value is
//     corrupt (MaxPrefillTokensPerSecond, MaxRTT), and the reader of the
//     cell id and max_model_len (EndpointMetadata).
//   - The load-balancing policies a served Cluster may carry (LBPolicy:
//     LeastRequest, RingHash, RoundRobin) and the extension name of the
//     typed least-request policy (LeastRequestExtension).
//   - Validation both sides apply: ValidateDeep on every resource built or
//     received (ValidateAll on the message and on every message packed in an
//     Any inside it; errors wrap ErrInvalidResource), CheckName on the names
//     both sides put into resources and headers (a region, a zone, a model,
//     a cell id), and CheckHeaders on the model and hop headers, which the
//     server's routes and a data plane's matcher must agree on.
//
// It imports no other isobar package: only the xDS and protobuf libraries
// and the standard library.
//
// # Concurrency
//
// The package is pure: it holds no state, starts no goroutine and does no
// I/O. Every function may be called concurrently; the metadata and messages
// passed in are only read.
package xdscontract
