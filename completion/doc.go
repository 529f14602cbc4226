// Package completion is the one streaming-completion client of isobar's
// harnesses: it posts an OpenAI-compatible streaming request (completions
// or chat completions), reads the server-sent events to the end and says
// what the client saw: the status, the data plane's answer headers (the
// endpoint and region that served it, from xdscontract), the time to the
// first event, the events streamed and whether the stream completed with
// [DONE]. It also owns the prompt text the harnesses send (PromptText).
//
// The load driver (bench/load), the drills (chaos) and the lab's clients
// (lab) all send through it; it imports nothing of isobar's but
// xdscontract, so each of them may use it without importing another.
//
// Concurrency: a Client holds no state of its own beyond its
// configuration; Send may be called from any number of goroutines at once
// (the http.Client is shared, as net/http allows).
package completion
