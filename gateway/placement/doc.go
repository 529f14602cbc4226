// Package placement is isobar's own per-request pick: send a request to the
// eligible host with the least expected time to first token (TTFT). The
// gateway's --lb isobar mode uses it; the benchmark and a later Endpoint
// Picker server import it so that every caller picks with the same code.
//
// # The formula
//
// For a request of P prompt tokens and each eligible host h (weight > 0):
//
//	E[TTFT](h) = RTT(h) + JitterFactor × Jitter(h)
//	           + (Pending(h) + max(P − Cached(h), 1)) / PrefillRate(h)
//	           + DecodeCost × InFlight(h)
//	           + max(0, InFlight(h) + 1 − Slots(h)) × ServiceTime(h) / Slots(h)
//
// where:
//
//   - RTT and Jitter: the mean round trip to the host and its jitter (one
//     standard deviation), so network distance is added latency, never a
//     traffic share. JitterFactor (default 2) turns the jitter into an
//     allowance. Unknown: 0.
//   - Pending: prompt tokens the caller has sent to the host that have not
//     yet produced a first token — the prefill queue this request joins.
//     The caller counts them itself, fresh for every request, less the
//     progress of the oldest, which the host has been prefilling since the
//     later of its send and the host's last first token (HeadProgress, at
//     the host's prefill rate): otherwise a host one second into a long
//     prompt looks as loaded as one that has not started it.
//   - Cached: the leading tokens of this prompt the host is expected to
//     hold in its prefix cache (the caller's estimate: package
//     gateway/prefix's approximate index, or an engine's exact cache).
//     They are not prefilled again; the engine always computes the last
//     prompt token (UncachedTokens). Unknown: 0.
//   - PrefillRate: the host's prefill throughput in tokens per second, from
//     its capacity class; 0 or unknown takes
//     Config.DefaultPrefillTokensPerSecond (default 20,000).
//   - InFlight: the host's requests in flight; each costs DecodeCost
//     (default 25 ms): a running sequence lengthens every engine step (its
//     per-sequence overhead and the attention over its context, ~0.2 ms
//     for a 70B model on one GPU), and the new request shares one step
//     per output token with it (~128 tokens). The term is about the
//     request's whole answer, not only its first token: with the 1 ms a
//     running sequence adds to the prefill alone, the pick packed decodes
//     onto the hosts with the least prefill queued, and E2E P95 at light
//     load ran 1.5× round-robin's (docs/bench.md).
//   - Slots and ServiceTime: the engine's running-batch capacity (vLLM
//     --max-num-seqs, a fact of its capacity class) and the mean time a
//     request holds one of those slots there, as the caller measures it
//     (the benchmark: an EWMA of reply − first byte per host). A request
//     that arrives with InFlight requests on the host finds
//     k = InFlight + 1 − Slots of them, itself included, without a slot
//     (InFlight counts those still on the network or in the engine's
//     frontend, which will want a slot before it). While the batch is
//     full, Slots requests each hold a slot for ServiceTime on average,
//     so one frees every ServiceTime/Slots and the k-th after
//     k × ServiceTime / Slots: the wait a full host adds before the
//     request's prefill can start. It is the term the prefill queue
//     cannot show when the batch cap, not the prefill rate, is the
//     bottleneck, and it grows with the queue, so a full host loses to
//     one with a free slot unless that one is further away by more than
//     the wait. Either unknown (0): no term.
//
// The host with the smallest E[TTFT] wins, unless affinity applies: when
// Config.AffinityBand is positive and some eligible host has Cached > 0,
// the hosts whose E[TTFT] is at most (1 + AffinityBand) × the smallest
// compete on Cached first — the longest expected cached prefix wins,
// equal prefixes go to the smaller E[TTFT]. A hot prefix cannot pile
// onto one host: once that host's queue puts it beyond the band, the
// request goes to the fastest host, whose cache then warms with that
// prefix too. Without the band (pure prefix hashing) every request of a
// prefix goes to one host whatever its queue.
//
// Otherwise the host with the smallest E[TTFT] wins. Hosts within a relative 1e-9 of
// the best are tied, and a tie is broken uniformly at random with the
// caller's random source (one draw per tie met, reservoir sampling), so
// identical idle hosts share the load. A host of weight 0 is never
// eligible.
//
// P, a request's prompt tokens, is PromptTokens (tokens.go): the client's
// x-isobar-prompt-tokens when believable, else the body estimate at
// xdscontract.BytesPerToken.
//
// # Contracts and concurrency
//
// The package is pure: no I/O, no clock reads, no goroutines, no global
// state, no logging. Pick, ExpectedTTFT and PromptTokens only read their arguments, so
// they are safe for concurrent use with distinct arguments; a Rand shared
// between goroutines must itself be safe for concurrent use. Inputs are
// sanitised rather than refused: negative counts, durations and rates
// count as zero (and a zero rate as the default), so a caller's race or
// bug cannot make a host look infinitely attractive.
package placement
