// Package capacity estimates what each cell serves within its SLO, in
// requests per second for the request mix it is serving now, with a
// confidence in [0,1], from the signals its heartbeats carry (completed
// request rate, running and waiting counts, KV-cache use, TTFT P95). A
// configured per-cell figure is only the cold-start prior: the estimate
// starts there and moves to the measurement as evidence arrives.
//
// # Model
//
// From the heartbeats with request rate λ > 0 (docs/design.md §5.1; docs/capacity.md
// gives the derivation and its limits), with λ, T (TTFT P95) and K (KV
// use) smoothed with time constant Tau:
//
//	ρ     = clamp(1 − T0/T, MinUtilisation, 1)  TTFT inflation over the low-load TTFT T0 (M/M/1 shape)
//	ρ*    = 1 − T0/SLO                          the utilisation at which TTFT P95 reaches the SLO
//	capT  = λ·ρ*/ρ                              throughput / utilisation, scaled to the SLO point
//	capKV = λ·KVTarget/K                        Little's law: the concurrency the KV cache holds at the
//	                                            current mix (R·KVTarget/K) over the time each request
//	                                            holds it (R/λ)
//	m     = min(capT, capKV)                    the measurement
//	u     = clamp(max(ρ/ρ*, K/KVTarget), 0, 1)  how close the cell is to the limit that binds
//
// The inputs are smoothed, not m: m is convex in T, so averaging it over
// noisy windows would bias it upward. T0 is learned per cell from the raw
// heartbeats: it follows a TTFT below it at once and one above it, seen on
// a nearly idle engine, with time constant BaselineTau. The demonstrated
// rate s, λ of the heartbeats with T ≤ SLO and no waiting request, is
// smoothed with Tau and decays otherwise. The confidence is
//
//	c = u² · e · f,  e = 1 − exp(−n/EvidenceRequests),  f = exp(−age/StaleAfter)
//
// where n counts the requests seen (Σ λ·Δt) and age is the time since the
// last heartbeat with traffic; the capacity is
//
//	capacity = max((1 − c)·prior + c·m, e·f·s).
//
// The measurement is exact at the SLO point (T = SLO gives m = λ) and its
// error grows fast with the distance from it: an engine whose TTFT knee is
// sharper than M/M/1's (vLLM's, once its batch slots fill) shows almost no
// TTFT inflation at half load, and the extrapolation there overestimates
// several times (4–7x on the fitted 70B profile, see profile_test.go).
// Hence the weight u², which keeps a lightly loaded cell near its prior
// and hands over to the measurement as the cell nears its limit. The floor
// e·f·s is what the cell has shown it serves within the SLO.
//
// A heartbeat without traffic changes nothing, so an estimator that sees
// no traffic keeps the prior with confidence 0. A heartbeat whose values
// are NaN, infinite, negative or absurd (beyond the bounds in Observe) is
// ignored and counted (Rejected). Missing values leave out the term they
// feed; a cell never gets a capacity of zero or below from a measurement
// (m is floored at MinFraction·prior).
//
// # Concurrency
//
// An Estimator is not safe for concurrent use: one goroutine owns it (in
// the regional controller, the summary builder). It does no I/O, keeps no
// global state and takes the time from its callers.
package capacity
