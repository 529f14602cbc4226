// Package sim owns isobar's stand-ins for the systems it controls: a
// vLLM-compatible simulated inference engine, a simulated GPU and a fake
// dcgm-exporter, with fault injection. Tests, the lab (`isobar lab`) and
// `isobar sim engine` / `isobar sim dcgm` use them.
//
// # Pieces
//
//   - Batcher is the pure continuous-batching timing model (no clock, no
//     goroutines): FCFS waiting queue, a running batch capped by MaxNumSeqs
//     and the KV cache, chunked prefill under a per-step token budget, one
//     token per decoding sequence per step, optional vLLM-style preemption,
//     and automatic prefix caching as vLLM's v1 KV cache manager does it
//     (AddBlocks takes the hash chain of the prompt's full blocks; cached
//     leading blocks are reused, the last prompt token is always computed,
//     freed blocks stay cached until evicted least recently freed first;
//     Stats counts prefix-cache queries and hits in prompt tokens).
//     Step duration = StepBase + DecodePerSeq × decodes + AttnPerKToken ×
//     context/1000 + prefill tokens ÷ PrefillTokensPerSec (see Profile) for
//     the fitted profiles, or the roofline of a physics profile.
//   - The physics engine (PhysicsProfile, Roofline): a catalogue of GPUs
//     (LookupGPU, GPUNames: spec-sheet memory, bandwidth, dense FP16/FP8
//     peaks, link bandwidth and DCGM identity) and models (LookupModel,
//     ModelNames: parameters, weight bytes, shape), vLLM's scheduler
//     defaults for the GPU, a KV cache sized as vLLM sizes it
//     (KVCacheTokensFor) and a step time of max(memory, compute) plus
//     tensor-parallel all-reduces and fixed overheads. Only the
//     efficiencies and overheads (FittedEfficiency) are fitted, once, to
//     NVIDIA NIM's published single-engine curve for Llama-3.3-70B FP8 on
//     2×H100; TestPhysicsNIMCurve holds them to it.
//   - SimulateLoad runs the model against Poisson load in virtual time and
//     reports TTFT/ITL/E2E percentiles; calibration_test.go holds the default
//     profile to its targets with it. Sweep runs a closed-loop load curve
//     (fixed concurrency, like vllm bench serve --max-concurrency) in
//     virtual time; `isobar sim sweep` prints it.
//   - For callers that model an engine from outside: Step.PrefillDuration
//     (the prefill share of a step), Batcher.QueuedPrefillTokens, and
//     Profile.EstimatePrefill / EstimateDecodeStep (idle-engine prefill
//     time and decode-step time), for fitted and physics profiles alike.
//   - Engine serves the OpenAI API (/v1/completions, /v1/chat/completions
//     with SSE streaming), /v1/models (with max_model_len), /health and
//     /metrics with vLLM's metric names, labels and buckets, driven by one
//     scheduler goroutine that steps a Batcher on the injected clock. It
//     derives each prompt's token ids and block hashes from the request
//     (see Tokenizer below) and hands them to the Batcher, so prefix
//     caching is on unless EngineConfig.DisablePrefixCaching (vLLM's
//     --no-enable-prefix-caching) is set; vllm:prefix_cache_queries_total
//     and vllm:prefix_cache_hits_total (labels model_name and engine, like
//     the other vllm: series) count the prompt tokens looked up at each
//     admission and those found cached, as vLLM v1 does, and stay at 0
//     with caching off.
//   - GPU models one GPU's DCGM fields from the steps its engine reports;
//     DCGMExporter serves any number of GPUs in dcgm-exporter's format.
//   - Admin is the fault API (kill, restart, hang, slow_start,
//     max_model_len, errors, throttle, pcie, dcgm_down, xid, clear) behind a
//     bearer token; the same faults are Go methods on Engine, GPU and
//     DCGMExporter.
//   - RunEngine and RunDCGM are the composition roots of the two commands.
//
// # The default profile and its calibration
//
// Profile70B ("70b-awq") simulates a 70B AWQ model on one 80 GB GPU. Its
// parameters were fitted in virtual time to a published 9-GPU round-robin
// deployment (10 RPS over 9 engines, prompts 512±200, 128 output tokens) and
// frozen. At 1.11 RPS per engine SimulateLoad gives TTFT P50 ≈ 300 ms, P95 ≈
// 650 ms, P99 ≈ 1.1 s, 40 ms mean inter-token latency and E2E P95 ≈ 6.0 s;
// P95 TTFT crosses 1.5 s near 1.43 RPS per engine (12.9 RPS over 9 engines;
// the published figure is 12). The same parameters give sustainable rates
// (P95 TTFT within the class SLO, 9 engines) of 9.1 RPS for code_heavy
// (1024±512 prompt, 192 out, 3 s), 10.6 for rag_multidoc (4000±800, 3 s),
// 7.2 for long_context (8000±1500, 3 s) and 3.4 for very_long (16000±3000,
// 7 s), against 10, 13, 7 and 4 published. See Profile70B for the shape of
// the model; calibration_test.go holds the profile to these figures.
//
// # The physics engine
//
// A physics profile is immutable and pure like the fitted ones: Roofline
// holds no state, and the Batcher calls it once per step with the step's
// decodes, their context, the prefill chunks and their positions. Its
// linear Profile fields (StepBase, PrefillTokensPerSec, ...) are
// informational equivalents only. Its frontend latency is fixed (no
// random jitter), so a physics engine's TTFT is prefill and queueing, not
// noise. docs/bench.md ("The physics engine") gives the formula, the
// catalogue's sources, the fit and measured curves.
//
// A fitted profile's random frontend latency is drawn per request from a
// source keyed by the request's body, not from the engine's own sequence:
// the same request draws the same latency on any engine and in any run, so
// lab runs that replay the same requests (isobar lab --seed) under
// different load balancers share their draws.
//
// # Time
//
// Every model duration (profile costs, frontend latency, slow starts, fault
// lead times, the GPU's time constants) is multiplied by
// EngineConfig.TimeScale, so 0.05 runs an engine 20x faster. Nothing calls
// time.Now or time.Sleep: timers and timestamps come from the injected
// clockwork.Clock, and tests drive a fake clock.
//
// # Concurrency model and contracts
//
// An Engine's lifecycle (Start, Kill, Restart, Stop) is serialised by one
// mutex; fault setters and reads take a second, short-held mutex. Each
// incarnation of the engine (Start or Restart until Kill or Stop) owns an
// http.Server with its Serve goroutine and one scheduler goroutine, all
// bound to the incarnation's context. The scheduler goroutine alone owns
// the Batcher. HTTP handlers hand sequences over through a mutex-guarded
// inbox with a coalescing wake channel (never blocking the scheduler), and
// the scheduler publishes each sequence's token count through an atomic
// before signalling a 1-buffered notify channel; a sequence's done channel
// is closed after its final count is stored. The scheduler never blocks on
// a client: a slow client lags behind and catches up. Handlers are counted
// so that Kill and Stop return only when every handler, the server and the
// scheduler have exited. Kill closes the listener and every connection at
// once (clients see connection errors) and discards all state; Restart
// listens again on the same address with fresh state and fresh vLLM
// metrics. Stop is graceful (in-flight requests finish until its context
// ends), idempotent and blocking. GPU and DCGMExporter are safe for
// concurrent use; the GPU has no goroutine (its state is integrated lazily
// on reads). The admin API must be served on a listener of its own, which
// survives engine kills.
//
// # Outside input
//
// Request bodies are capped (16 MiB, HTTP 413), parsed strictly enough to
// refuse malformed input with vLLM's 400 error shape and counted in
// isobar_sim_bad_requests_total{reason}; unknown OpenAI fields are ignored.
// Admin requests without a bearer token get 401, with a wrong one 403
// (constant-time comparison), both counted in
// isobar_sim_admin_auth_failures_total{reason}. Both parsers, and the
// tokenizer and block hasher behind prefix caching, are fuzzed. The
// tenant header (xdscontract.TenantHeader) of every generate request that
// reaches the engine is counted (Engine.TenantRequests, kept across
// restarts, guarded by the engine's short-held mutex): normalised and
// bounded by package reqclass (64 tenants, the rest pooled), an unusable
// name not counted, so a client cannot grow the map.
//
// # Tokenizer
//
// A text prompt of n bytes counts ceil(n/4) tokens (send 4N bytes for N
// tokens); token-id prompts count their length; a chat request counts
// ceil(bytes/4) of each message's content plus 4 tokens per message.
// max_tokens defaults to 128 (DefaultMaxTokens) and generation always runs
// to max_tokens (finish_reason "length"), emitting deterministic filler
// words.
//
// The token ids behind those counts are deterministic, so the same prefix
// text always gives the same KV blocks (tokens.go): each 4-byte chunk of
// text, from the text's start, is one token whose id is FNV-1a 32 of the
// chunk; a chat request renders each message on its own with a fixed
// template (start-header, role, end-header, content, end-of-turn: Llama
// 3's special ids), so a conversation whose history grows shares its
// earlier messages as a prefix; token-id prompts are their ids. Every full
// block of BlockSize tokens (16 in every built-in profile) is named by
// FNV-1a 64 of its parent block's hash and its token ids, as vLLM's
// hash(parent_hash, block_tokens). The handler computes the chain once a
// request has passed its checks (empty prompts and prompts over
// max_model_len keep their 400s), in time linear in the prompt, and drops
// the prompt's text as soon as the chain is built; the Batcher holds the
// chain (8 bytes per 16 tokens) while the sequence runs and the hashes of
// cached blocks until they are evicted.
package sim
