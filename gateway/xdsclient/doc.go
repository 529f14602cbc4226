// Package xdsclient is the gateway's xDS client: it consumes the ADS
// resources the regional controller serves to Envoy and turns them into
// the forms the data plane routes with. The names, headers, metadata keys
// and validation it shares with the controller are package xdscontract's;
// it imports nothing of the regional controller, and nothing of the proxy.
//
// # What it owns
//
//   - The ADS stream (Subscription): one state-of-the-world stream per
//     resource type (wildcard) on go-control-plane's ADS client, with its
//     own reconnect and full-jitter exponential backoff. Each response goes
//     to the owner's Apply: nil ACKs it, an error NACKs it; NACKs are paced
//     by the same backoff, and the previous resources of that type stay in
//     use. Responses are received up to Subscription.MaxMsg; each
//     response's size, and a stream broken by one above the limit, is told
//     to Subscription.Size. With Subscription.Delta the endpoint type runs
//     over delta ADS instead (delta.go), subscribing to the LEDS
//     collections the assignments name when the controller serves them
//     (xdscontract.LEDSCollection). It keeps the endpoints decoded and
//     applies an update in O(changed): only the LbEndpoints a response
//     carries are validated and decoded, and only the clusters they fill
//     are rebuilt (delta_apply.go; the localities of several clusters
//     that name one collection and decode alike are decoded and copied
//     once), for Subscription.ApplyDecoded; without
//     it Apply gets the assignments reassembled whole. A refused response
//     changes nothing held.
//   - Decoding and validation (Decoder, DecodeAssignments): a response is
//     decoded and validated in full (ValidateAll including packed Anys, by
//     xdscontract.ValidateDeep; IP addresses; features the gateway cannot
//     honour such as weighted clusters, query matchers or delay faults are
//     refused with ErrInvalidResource). Clusters get Envoy's defaults for
//     what is unset (LB policy, locality weighting, choice count and
//     active-request bias, connect timeout, max_requests, retry budget,
//     outlier detection); an LB policy the gateway does not know becomes
//     ROUND_ROBIN with ClusterPolicy.LBFallbackFrom naming it. Endpoints
//     carry their isobar metadata (cell, max_model_len, probe budget,
//     prefill rate, RTT and jitter, batch cap; metadata.go). A pinned
//     cluster (xdscontract.PinnedClusterName) carries its residency set
//     and allowed regions (ClusterPolicy.Residency, AllowedRegions);
//     malformed residency metadata refuses the response (a NACK) rather
//     than read as unpinned, which would serve the set anywhere. Its
//     routes match xdscontract.ResidencyHeader exactly, and the
//     per-criticality routes xdscontract.CriticalityHeader: the gateway
//     must set both headers from what it trusts before MatchRoute.
//   - Route matching (SelectVirtualHost, MatchRoute), as Envoy matches:
//     virtual host by Host, then the first route whose path and header
//     matchers (exact, prefix, suffix, contains, RE2 regex, present, int64
//     range, invert, ignore case) all hold, over a HeaderView of the
//     request.
//   - The route table view (Inputs, Table): what the subscriptions last
//     accepted, and the read-only view of it a gateway hands out (the
//     RouteConfiguration in use, clusters with their endpoints, the models
//     the routes name, each type's version and arrival time).
//   - Watcher: the EDS subscription alone, keeping the latest Assignment,
//     for tests and tools that pick endpoints themselves (Pick).
//
// # Concurrency
//
// A Subscription's Run is its only goroutine: it alone reads its stream
// and calls Apply, Connected and Size; its fields are set before Run and
// not changed after. Decoding is pure: a Decoder holds only its
// configuration and is safe for concurrent use. A Table never changes once
// built, so any goroutine may read it; NewTable keeps references to its
// Inputs' values, which their owner replaces whole and never changes in
// place. A Watcher runs one goroutine between Start and Stop (the
// subscription's); Latest, Nacks and WaitFor may be called from any
// goroutine (one mutex guards the latest assignment). Stop is idempotent
// and blocks until the goroutine has exited. Reconnect and NACK timers run
// on the injected clock.
package xdsclient
