// Package load is isobar's load driver, like GuideLLM: constant-rate or
// Poisson arrivals of streaming completions against any OpenAI-compatible
// URL (isobar's gateway, an Envoy listener, a vLLM engine), shaped by the
// eight workload classes of the evaluation, bounded by count and time.
//
// It owns the workload classes (Classes), the run (Run, Config) and its
// outputs: one Record per request (the NDJSON lines of isobar bench load:
// start, TTFT measured at the client from the first streamed token, end,
// status, serving endpoint and region, class) and a Summary with
// percentiles over a measured window that excludes warm-up and cool-down.
//
// Determinism: arrivals and request shapes come from PCG sources seeded by
// Config.Seed, so two runs with one seed send the same requests at the
// same offsets whatever the server does — the basis of comparing policies
// on the same requests.
//
// Concurrency: Run sends from the calling goroutine and runs one goroutine
// per request in flight, bounded by MaxInFlight (arrivals beyond it are
// counted as client-shed, never queued); it returns once every request has
// ended. Deps.OnRecord is called under the run's lock, one record at a
// time. No global state.
package load
