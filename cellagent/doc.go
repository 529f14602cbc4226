// Package cellagent is the per-GPU agent of isobar (`isobar cellagent`). One
// agent runs beside each vLLM replica. It owns:
//
//   - reading the replica's telemetry: vLLM's /metrics (parsed with the
//     Prometheus text parser, summed over the engine label of data-parallel
//     engines), /health and /v1/models beside it, and the GPU from a
//     dcgm-exporter page (one exporter serves every GPU of a node; the
//     selector picks this cell's by index or UUID) or from NVML (build tag
//     nvml);
//   - deriving the cell's signal vector (Signals): counts raw, utilisations
//     as fractions in [0,1], TTFT P95, error rate, request rate, window
//     requests and the prefix-cache hit rate from counter and histogram
//     deltas over a sliding window;
//   - observing the engine's lifecycle (READY, LOADING, FAILED; DRAINING on
//     the controller's command; TERMINATED on shutdown);
//   - streaming heartbeats to the regional controller (CellRegistry.Heartbeat).
//
// The parsers (ParseVLLM, ParseDCGM, ParseModels) and the derivation
// (Derive, HistogramQuantile) are pure functions, fuzzed and unit-tested.
//
// # Signals
//
// TTFT P95 is PromQL's histogram_quantile over the bucket deltas between the
// window's ends. Error rate is non-2xx over all responses on the completion
// handlers of http_requests_total, whose status label may be grouped ("2xx",
// as prometheus-fastapi-instrumentator does by default) or exact ("200").
// Window requests is that denominator and request rate the growth of
// vllm:request_success_total per second. The prefix-cache hit rate is the
// growth of vllm:prefix_cache_hits_total over that of
// vllm:prefix_cache_queries_total (prompt tokens found cached over those
// looked up; vLLM 0.8's vllm:gpu_prefix_cache_* names are read when the
// current ones are absent); a page whose hits exceed its queries has both
// dropped as invalid. When the window saw no request, TTFT P95 and error
// rate are absent, never 0, and so is the hit rate when the window looked
// nothing up (prefix caching off, or no admission). The window holds the samples of the
// last Config.Window plus the newest one before it. Any cumulative value that
// decreases (an engine restart) restarts the window from that sample, so a
// delta is never negative; a failed scrape clears it.
//
// A value that is NaN, infinite, negative where that is impossible, or a
// fraction outside [0,1] by more than 0.01 is dropped: the signal is left
// unset, isobar_cellagent_invalid_values_total counts it, and the source's
// SourceHealth.error names it while ok stays true (the source was read). A
// source that cannot be read or parsed reports ok=false with the reason and
// its signals are absent, so the controller renormalises over what remains;
// a missing dcgm-exporter is ok=false "not configured". Every request has a
// timeout (Config.ScrapeTimeout) and every body a cap (Config.MaxBodyBytes).
//
// # Lifecycle and engine death
//
// /health answering 200 is READY, any other answer LOADING, and an engine
// that refuses or resets the connection FAILED with the reason. A /health
// that times out is FAILED too, but an engine that was answering gets
// Config.HealthTimeouts (default 3) consecutive timeouts first: a busy
// engine or a loaded machine can miss one deadline (each tolerated miss is
// logged and counted). A controller DRAIN command reports DRAINING until
// UNDRAIN (FAILED still wins). Config.StartupGrace optionally reports an
// engine that has never been reachable as LOADING for a while, since vLLM
// only listens once its model is loaded.
//
// Engine death is detected at once, not at the next tick: while the engine is
// reachable the agent keeps a plain TCP connection open to its port and
// blocks reading it. vLLM never writes on that connection, so the read only
// returns when the connection ends: EOF or RST when the engine process dies
// (the kernel closes its sockets), or an idle close by the server. Either
// event triggers an immediate /health probe, which tells the two apart; on
// death a FAILED heartbeat goes out at once. The watcher is re-armed by a
// probe that finds the engine reachable: by every scrape tick, and at most
// once per tick by an event probe, so a server that closes idle connections
// cannot make the agent spin. An engine that hangs without closing its
// socket is caught by the /health timeout at the next tick.
//
// # Heartbeats
//
// A heartbeat goes out every interval (Config.Interval, then whatever the
// controller's ack asks, clamped to [MinInterval, MaxInterval]) and at once
// on a change of lifecycle state or of a source's ok. The first one waits for
// the first scrape and a random phase within one interval; scrapes tick on
// their own phase-jittered period. sequence increases strictly for the life
// of the process, incarnation is random per process, sent_at comes from the
// injected clock. A broken stream is reopened after a full-jitter exponential
// backoff (BackoffMin doubling up to BackoffMax, on the injected clock),
// reset once the controller has answered on a stream. An ack's error (a
// refused heartbeat) is logged and counted. On Stop, or when Start's context
// ends, the agent sends a TERMINATED heartbeat (reason "agent stopped"),
// half-closes the stream and waits for the controller to end it, at most
// ShutdownTimeout; the controller is expected to end the stream when it reads
// the half-close. Pause withholds heartbeats without touching the engine, for
// drills that make an agent go silent.
//
// With Config.TLS the stream uses mutual TLS. The controller checks the
// client certificate's identity against the cell id and region of the
// heartbeats, so a cell's certificate must carry both as the URI SAN
// spiffe://isobar/region/<region>/cell/<cell-id> (isobar certs issue --role
// cellagent); a common name or DNS SAN does not count.
//
// # Concurrency
//
// Start launches three goroutines, all owned by the Agent, all ending with
// Start's context or Stop, and all joined by Stop:
//
//   - the scrape loop owns the scrapes: one at start, then one per
//     ScrapeInterval; each round probes /health and reads vLLM (and
//     /v1/models while the capability is unknown or after the engine was
//     down) and the GPU concurrently, then folds the results into the state.
//   - the watcher holds the engine connection described above and runs the
//     immediate /health probe itself, so a slow scrape round cannot delay
//     it; probes are numbered as they start and a result older than the one
//     recorded is dropped, so a round's stale "healthy" cannot undo a FAILED.
//     It has no timers; scrape ticks re-arm it over a 1-buffered channel.
//   - the heartbeat loop owns the controller stream and is the only sender,
//     so sequence numbers follow send order; per stream it runs one receiver
//     goroutine for acks and one shutdown watchdog, both joined before the
//     stream is dropped.
//
// The Agent composes two parts along their locks: the scraper (scraper.go)
// runs the scrape loop and the watcher and holds the derived state
// (signals, sources, lifecycle, drain flag) behind one mutex; the streamer
// (stream.go) runs the heartbeat loop and holds the sequence, interval and
// pause as atomics, reading the state through a small interface. The
// Agent itself holds only their lifecycle. The loops exchange wake-ups
// over 1-buffered coalescing channels, never blocking. Every timer runs on Deps.Clock; only network
// deadlines (ScrapeTimeout, ShutdownTimeout) use real time. Stop is
// idempotent, safe before Start, and returns when every goroutine has
// exited. ScrapeOnce and the parsers start no goroutine that outlives them.
//
// # Metrics
//
// With Deps.Registerer set the agent registers isobar_cellagent_* metrics:
// scrapes_total{source,result}, scrape_duration_seconds{source},
// invalid_values_total{source}, source_up{source}, window_restarts_total,
// heartbeats_sent_total, heartbeats_refused_total, stream_reconnects_total,
// commands_total{command}, engine_watch_events_total{event} and
// lifecycle_state{state}. Several agents sharing a registry must wrap it,
// e.g. prometheus.WrapRegistererWith(prometheus.Labels{"cell": id}, reg).
package cellagent
