package lab

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/completion"
	"github.com/isobar-mesh/isobar/internal/quantile"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/sim"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// maxSamples bounds the outcomes kept for the report.
const maxSamples = 1 << 20

// drainTimeout bounds how long stop waits for in-flight requests.
const drainTimeout = 30 * time.Second

// recentWindow is what the live view summarises.
const recentWindow = 10 * time.Second

// traffic is one region's clients, sending streaming requests to the
// region's gateway and measuring TTFT at the client: Poisson arrivals of
// single completions (WorkloadSteady), or chat sessions (WorkloadMultiturn,
// sessions.go).
type traffic struct {
	cfg     Config
	region  string
	gateway string
	seed    uint64
	clock   clockwork.Clock
	log     *slog.Logger
	client  *http.Client
	sem     chan struct{}

	mu        sync.Mutex
	outcomes  []Outcome
	abandoned int

	cancel, cancelReqs context.CancelFunc
	arrivalsDone       chan struct{}
	wg                 sync.WaitGroup
	stopOnce           sync.Once
}

// Outcome is one request as its client saw it.
type Outcome struct {
	Start time.Time
	End   time.Time
	// OK: HTTP 200 and the stream completed.
	OK     bool
	Status int
	TTFT   time.Duration
	// Cell and Region that served it (from the gateway's headers).
	Cell, Region string
	Long         bool
	// Turn is the request's turn in its multiturn session (1 for the
	// first); 0 in the steady workload.
	Turn int
	// Criticality and Tenant the request was sent with (Standard and ""
	// without Config.CriticalityMix and Config.Tenants).
	Criticality reqclass.Criticality
	Tenant      string
	// Error is the start of the answer of a failed request (or the
	// transport error).
	Error string
	// Cause classifies a failure (one of the Cause constants); empty when
	// OK.
	Cause string
}

// Failure causes, as the client sees them.
const (
	// CauseShedByPlan: a gateway answered 429 because the routing plan
	// shed this share of the demand.
	CauseShedByPlan = "shed_by_plan"
	// CauseSaturated: a gateway answered 429 because every endpoint was at
	// its in-flight limit (its flow-control queue off).
	CauseSaturated = "saturated"
	// CauseQueue: a gateway's flow-control queue refused, displaced or
	// timed out the request (429, x-isobar-shed queue_full, queue_evicted
	// or queue_expired).
	CauseQueue = "queue"
	// CauseResidency: the request's residency set had no capacity left in
	// its regions (503, x-isobar-shed residency); it was not spilled.
	CauseResidency = "residency"
	// CauseEngineError: an engine answered non-2xx (the gateway names the
	// endpoint that answered), or its stream ended without [DONE].
	CauseEngineError = "engine_error"
	// CauseGatewayError: a gateway answered non-2xx itself, with no
	// endpoint behind the answer (no route, no healthy upstream, upstream
	// reset before headers).
	CauseGatewayError = "gateway_error"
	// CauseTransport: the client's connection to its gateway failed.
	CauseTransport = "transport_error"
	// CauseTimeout: the client or a gateway gave up waiting (504).
	CauseTimeout = "timeout"
	// CauseClientDrop: the arrival was dropped at the client because
	// MaxInFlight requests were already open; it was never sent.
	CauseClientDrop = "client_drop"
)

// Causes lists every failure cause in report order.
func Causes() []string {
	return []string{CauseShedByPlan, CauseSaturated, CauseQueue, CauseResidency, CauseEngineError, CauseGatewayError, CauseTransport, CauseTimeout, CauseClientDrop}
}

// classify names the cause of a failed request from what the client saw:
// the transport error, or the status with the gateway's headers.
func classify(err error, status int, h http.Header) string {
	switch {
	case err != nil:
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			return CauseTimeout
		}
		return CauseTransport
	case status == http.StatusTooManyRequests && h.Get(xdscontract.ShedHeader) == "plan":
		return CauseShedByPlan
	case status == http.StatusTooManyRequests && strings.HasPrefix(h.Get(xdscontract.ShedHeader), "queue_"):
		return CauseQueue
	case status == http.StatusTooManyRequests && h.Get(xdscontract.ShedHeader) != "":
		return CauseSaturated
	case status == http.StatusServiceUnavailable && h.Get(xdscontract.ShedHeader) == "residency":
		return CauseResidency
	case status == http.StatusGatewayTimeout:
		return CauseTimeout
	case h.Get(xdscontract.EndpointHeader) != "" || h.Get(xdscontract.UpstreamEndpointHeader) != "":
		return CauseEngineError
	default:
		return CauseGatewayError
	}
}

func newTraffic(cfg Config, region, gw string, seed uint64, clock clockwork.Clock, log *slog.Logger) *traffic {
	return &traffic{
		cfg: cfg, region: region, gateway: gw, seed: seed, clock: clock, log: log,
		client: &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256}},
		sem:    make(chan struct{}, cfg.MaxInFlight),
	}
}

func (t *traffic) start(ctx context.Context) {
	var reqCtx context.Context
	reqCtx, t.cancelReqs = context.WithCancel(context.WithoutCancel(ctx))
	ctx, t.cancel = context.WithCancel(ctx)
	t.arrivalsDone = make(chan struct{})
	go func() {
		defer close(t.arrivalsDone)
		t.arrivals(ctx, reqCtx)
	}()
}

// stop ends arrivals, lets in-flight requests finish (up to drainTimeout;
// those cut off are counted as abandoned, not failed) and joins every
// goroutine. Idempotent.
func (t *traffic) stop() {
	t.stopOnce.Do(func() {
		if t.cancel == nil {
			return
		}
		t.cancel()
		<-t.arrivalsDone
		drained := make(chan struct{})
		go func() { t.wg.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-t.clock.After(drainTimeout):
			t.cancelReqs()
			<-drained
		}
		t.cancelReqs()
		t.client.CloseIdleConnections()
	})
}

func (t *traffic) arrivals(ctx, reqCtx context.Context) {
	if t.cfg.RPS == 0 {
		<-ctx.Done()
		return
	}
	if t.cfg.Workload == WorkloadMultiturn {
		t.sessions(ctx, reqCtx)
		return
	}
	rng := rand.New(rand.NewPCG(t.seed, 0x15ba4))
	for n := uint64(0); ctx.Err() == nil; n++ {
		gap := time.Duration(rng.ExpFloat64() / t.cfg.RPS * float64(time.Second))
		select {
		case <-ctx.Done():
			return
		case <-t.clock.After(gap):
		}
		long := rng.IntN(10) == 0
		prompt := t.cfg.PromptTokens - t.cfg.PromptJitter + rng.IntN(2*t.cfg.PromptJitter+1)
		if long {
			prompt = t.cfg.LongPrompt
		}
		class := drawClass(t.cfg, rand.New(rand.NewPCG(t.seed, classStream+n)))
		select {
		case t.sem <- struct{}{}:
		default:
			now := t.clock.Now()
			t.record(Outcome{Start: now, End: now, Long: long, Cause: CauseClientDrop, Error: "dropped at the client: MaxInFlight requests open",
				Criticality: class.crit, Tenant: class.tenant})
			continue
		}
		t.wg.Go(func() {
			defer func() { <-t.sem }()
			// The text comes from the request's own source, seeded by its
			// arrival number: distinct per request, the same per seed,
			// and drawn off the arrivals' source so arrivals and sizes
			// replay as before.
			text := promptText(rand.New(rand.NewPCG(t.seed, textStream+n)), prompt)
			body, _ := json.Marshal(map[string]any{
				"model": sim.DefaultModel, "prompt": text,
				"max_tokens": t.cfg.MaxTokens, "stream": true,
			})
			t.send(reqCtx, "/v1/completions", body, Outcome{Long: long, Criticality: class.crit, Tenant: class.tenant}, class.header, nil)
		})
	}
}

// textStream is the PCG stream (plus the arrival number) of the steady
// workload's prompt text.
const textStream = 0x7e47 << 32

// promptText is completion.PromptText: random words, exactly 4×tokens
// bytes.
func promptText(rng *rand.Rand, tokens int) string { return completion.PromptText(rng, tokens) }

// maxReplyBytes bounds the reply text a client keeps (a multiturn
// session sends it back as the assistant's message).
const maxReplyBytes = 64 << 10

// send posts one streaming request through the gateway, with the extra
// headers hdr, and records its outcome (o carries what the caller knows:
// Long, Turn, Criticality, Tenant). With reply set,
// the streamed text (choices[0].delta.content or .text) is appended to
// it, at most maxReplyBytes. It reports whether the request succeeded.
func (t *traffic) send(ctx context.Context, path string, body []byte, o Outcome, hdr http.Header, reply *strings.Builder) bool {
	o.Start = t.clock.Now()
	req := completion.Request{URL: "http://" + t.gateway + path, Body: body, Start: o.Start, Header: hdr}
	if reply != nil {
		req.OnData = func(data string) { appendDelta(reply, data) }
	}
	c := completion.Client{HTTP: t.client, Clock: t.clock}
	res := c.Send(ctx, req)
	o.End = t.clock.Now()
	o.OK, o.Status, o.TTFT, o.Cell, o.Region = res.OK, res.Status, res.FirstEvent, res.Endpoint, res.Region
	switch {
	case res.OK:
	case res.Status != 0 && res.Status != http.StatusOK:
		o.Error, o.Cause = res.Body, classify(nil, res.Status, res.Header)
	case errors.Is(res.Err, completion.ErrIncomplete):
		// The engine ended its stream early.
		o.Error, o.Cause = "stream ended without [DONE]", CauseEngineError
	default:
		// No answer, or the stream was cut off by a timeout or a broken
		// connection.
		o.Error, o.Cause = res.Err.Error(), classify(res.Err, 0, nil)
	}
	if !o.OK && ctx.Err() != nil {
		t.mu.Lock()
		t.abandoned++
		t.mu.Unlock()
		return false
	}
	t.record(o)
	return o.OK
}

// appendDelta appends the text of one SSE chunk (chat delta content or
// completion text) to reply, keeping it within maxReplyBytes. A chunk that
// is not a completion chunk adds nothing.
func appendDelta(reply *strings.Builder, data string) {
	var chunk struct {
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal([]byte(data), &chunk) != nil || len(chunk.Choices) == 0 {
		return
	}
	c := chunk.Choices[0]
	text := c.Delta.Content + c.Text
	if room := maxReplyBytes - reply.Len(); len(text) > room {
		text = text[:max(room, 0)]
	}
	reply.WriteString(text)
}

func (t *traffic) record(o Outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.outcomes) < maxSamples {
		t.outcomes = append(t.outcomes, o)
	}
}

// Outcomes returns a copy of every outcome recorded so far.
func (t *traffic) Outcomes() []Outcome {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Outcome(nil), t.outcomes...)
}

// Percentiles are latency percentiles in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(q float64) float64 { return float64(quantile.Sorted(s, q)) / float64(time.Millisecond) }
	return Percentiles{P50: ms(0.50), P95: ms(0.95), P99: ms(0.99)}
}

// Outcomes returns what the clients of region r saw so far.
func (l *Lab) Outcomes(region string) []Outcome {
	for i, r := range l.Regions() {
		if r.Name == region && i < len(l.traffic) {
			return l.traffic[i].Outcomes()
		}
	}
	return nil
}
