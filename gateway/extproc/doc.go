// Package extproc is `isobar picker`: the Endpoint Picker of the Gateway
// API Inference Extension (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol) over Envoy's ext_proc, so
// that a stock Envoy gets the gateway's pick (docs/picker.md).
//
// # What it owns
//
//   - The Endpoint Picker Protocol over ext_proc (extproc.go): each
//     message of a stream answered in the proxy's processing mode (the
//     body modes NONE, STREAMED, BUFFERED, BUFFERED_PARTIAL and
//     FULL_DUPLEX_STREAMED; observability_mode and GRPC refused), the pick
//     made at the first moment the request is known (its headers, or its
//     whole body when the mode sends it), and the answer: the header
//     x-gateway-destination-endpoint and the dynamic metadata envoy.lb, or
//     an immediate response with the gateway's JSON error. The route and
//     the pick are the gateway's own (gateway.Gateway.Pick: routed as
//     handleGenerate routes, picked with the proxy's chooseEndpoint, the
//     subset hint envoy.lb.subset_hint a strict exclusion, and counted
//     with startAttempt: in flight until the stream ends, prompt tokens
//     pending until the first response body chunk), consumed through the
//     one-method interface picker. The request's class is read by the
//     gateway's own function (criticality, tenant, residency; the client's
//     address for --trusted-sources from Envoy's source.address request
//     attribute, when the filter sends it) and Envoy's copy of the request
//     gets the canonical class headers. The response's status, first byte and
//     end are recorded on the held gateway.Pick as the proxy records them.
//   - The parsing of what Envoy sends (parse.go): header maps, seen as the
//     route matcher sees an HTTP request, and the subset hint, with bounds
//     on their size.
//   - The server (picker.go): a Picker owns a gateway.Gateway whose HTTP
//     listener serves only /health and /metrics (Config.HealthOnly), and a
//     gRPC server (ext_proc, gRPC health: liveness, readiness and the
//     ext_proc service). With mTLS only this region's gateway identity
//     (spiffe://isobar/gateway/<region>) may open a stream. Bad input
//     closes the stream with InvalidArgument or ResourceExhausted, counted
//     in isobar_picker_stream_errors_total; every answer is counted in
//     isobar_picker_decisions_total.
//
// # Concurrency
//
// One goroutine per stream: gRPC runs each ext_proc stream (one HTTP
// request) on its own handler goroutine, the only one touching that
// stream's state; it shares the gateway's host and cluster atomics with
// the rest through gateway.Pick. A Picker adds, between Start and Stop,
// the gRPC server's Serve goroutine and a goroutine that turns gRPC health
// SERVING once the table is ready, besides its Gateway's own. Stop is
// idempotent and blocking: it drains the streams for the Gateway's
// Config.DrainTimeout, cuts what is left, then stops its Gateway.
package extproc
