// Package flowcontrol is the gateway's bounded per-criticality request
// queue, as a pure data structure: no goroutines, no clock (every call
// takes now), no I/O, a generic payload. The gateway (which owns the
// waiting goroutines and the timers) and the bench (which runs it in
// virtual time) share this one implementation.
//
// # What it owns
//
// One band per criticality (reqclass.Count), each a FIFO per tenant plus
// the band's arrival order:
//
//   - Bounds: each band holds at most Config.MaxLen[class] entries and the
//     whole queue at most Config.MaxTotal; an entry waits at most
//     Config.MaxAge[class]. Nothing else grows: tenants exist in a band only
//     while they have an entry there, and handles only while queued.
//   - Admission (Push): an arrival whose band is full is refused
//     (ErrBandFull: that class alone exceeds what it may queue) unless
//     another tenant holds at least two entries more than the arrival's
//     tenant in that band: then that heaviest tenant's oldest entry is
//     displaced (Evicted), so one tenant cannot fill a band and keep the
//     others out. An arrival whose band has room while the whole queue is
//     full displaces, from the least important non-empty band below its
//     own (sheddable first, then standard), the oldest entry of the
//     tenant holding the most there (the heaviest flow, so a quiet tenant
//     keeps its share): a critical arrival evicts a queued sheddable
//     request, or a standard one when no sheddable one waits; a standard
//     arrival evicts only sheddable ones; failing that, its own band's
//     heaviest tenant's entry as for a full band; else it is refused
//     (ErrQueueFull). The band bounds are the per-class reservation, the
//     total the memory bound, so with the defaults (MaxTotal below the sum
//     of the bands) a flood of less important requests can never keep a
//     critical one out.
//   - Dispatch (Pop): the most important non-empty band first (strict
//     priority), and within a band round-robin between tenants. A tenant
//     sending five times as much as another gets one turn per round like
//     it, never more. Each tenant's own entries leave oldest first, or
//     newest first in a Config.NewestFirst band (by default standard and
//     sheddable: under a sustained shortfall the newest entry is the one
//     with the most of its objective left). Dispatch is the same order
//     for a caller whose capacity serves only some entries (a freed slot
//     on one endpoint): the first entry in that order the caller accepts.
//   - Yield (Config.Yield): while a more important band is short (one of
//     its requests left unserved within its MaxAge, or the slot hold when
//     longer), a less important band yields: Pop and Dispatch pass over
//     it, and Yields tells the caller to queue its arrivals rather than
//     send them to a free slot, so the shortfall falls on the least
//     important class.
//   - Expiry: an entry past its band's MaxAge comes out of Push, Pop or
//     Expire with Outcome Expired and is never dispatched; NextExpiry tells
//     the caller when to call Expire. The defaults put the standard and
//     sheddable age bounds at the TTFT objective (DefaultTTFTObjective)
//     and count the time a dispatched request currently takes to its
//     first token (SetTTFT) against it (Config.Objective): a request
//     whose wait plus that time reaches the objective can no longer meet
//     it. Critical's bound (10 s) is a liveness bound.
//
// EndpointCap is the in-flight cap per endpoint at which the gateway
// counts an endpoint saturated and starts queueing: the engine's batch
// (max_num_seqs) plus the requests that will find a slot free on arrival,
// so that what waits, waits here, where it can be ordered.
//
// Entries that leave other than by dispatch carry their Outcome (Evicted,
// Expired); the caller answers them (the gateway: 429 with Retry-After and
// its shed header naming the cause) and Remove withdraws one whose client
// left.
//
// # Sources
//
// The structure follows the Gateway API Inference Extension / llm-d flow
// control (gateway-api-inference-extension and llm-d-inference-scheduler,
// pkg/epp/flowcontrol): priority bands dispatched in strict priority order
// (controller/internal/processor.go), an inter-flow round-robin fairness
// policy between flows within a band
// (framework/plugins/policies/interflow/dispatch/roundrobin) over FCFS
// intra-flow queues, capacity bounds per band and in all (types:
// QueueOutcomeRejectedCapacity) and a TTL after which a queued item is
// evicted (QueueOutcomeEvictedTTL). Differences: isobar's flows are tenants
// (one per tenant and band), a more important arrival may displace a less
// important queued one when the whole queue is full (the upstream
// controller has no displacement), and the gateway answers an expired
// entry 429, not upstream's 503, because the client should come back
// later rather than treat the pool as down.
//
// # Concurrency
//
// A Queue is not safe for concurrent use: its owner serialises calls (the
// gateway under one mutex, the bench on its one event loop). now must not
// go backwards between calls; an earlier now is taken as the latest seen.
package flowcontrol
