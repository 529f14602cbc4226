package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/completion"
	"github.com/isobar-mesh/isobar/internal/quantile"
)

// Arrival processes.
const (
	ArrivalConstant = "constant"
	ArrivalPoisson  = "poisson"
)

// Config is one load run. Zero fields take the defaults noted.
type Config struct {
	// URL is the base URL of an OpenAI-compatible server (a gateway, an
	// Envoy listener, a vLLM engine): http://HOST:PORT. Required.
	URL string
	// Model requested. Required (the command asks /v1/models when unset).
	Model string
	// Class shapes the requests. Default baseline_mixed.
	Class Class
	// RPS is the steady arrival rate. Required, (0, 100000].
	RPS float64
	// Arrival is constant (a request every 1/RPS) or poisson (default).
	Arrival string
	// Duration of arrivals. Default 60 s; at most 24 h.
	Duration time.Duration
	// MaxRequests bounds the requests sent. Default 100,000.
	MaxRequests int
	// Warmup and Cooldown are excluded from the summary (records keep
	// them).
	Warmup, Cooldown time.Duration
	// Seed of arrivals and prompt lengths. Default 1. Two runs with the
	// same seed and class send the same sequence of requests.
	Seed uint64
	// Timeout per request. Default 2 minutes.
	Timeout time.Duration
	// MaxInFlight bounds concurrent requests; arrivals beyond it are not
	// sent and are counted as client-shed. Default 1024.
	MaxInFlight int
	// Chat sends /v1/chat/completions instead of /v1/completions.
	Chat bool
	// MaxOutput, when > 0, replaces the class's output tokens.
	MaxOutput int
}

func (c *Config) withDefaults() {
	if c.Class.Name == "" {
		c.Class, _ = LookupClass("baseline_mixed")
	}
	if c.Arrival == "" {
		c.Arrival = ArrivalPoisson
	}
	if c.Duration == 0 {
		c.Duration = time.Minute
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = 100_000
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 1024
	}
}

// ErrConfig marks a configuration error.
var ErrConfig = errors.New("load: bad configuration")

// Validate checks the configuration (after defaults), naming the field.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		return bad("URL is required: the base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8080")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return bad("URL %q: want http://HOST:PORT or https://HOST:PORT", c.URL)
	case c.Model == "":
		return bad("Model is required")
	case !(c.RPS > 0 && c.RPS <= 100_000):
		return bad("RPS %v: want (0, 100000]", c.RPS)
	case c.Arrival != ArrivalConstant && c.Arrival != ArrivalPoisson:
		return bad("Arrival %q: want constant or poisson", c.Arrival)
	case c.Duration < 0 || c.Duration > 24*time.Hour:
		return bad("Duration %v: want (0, 24h]", c.Duration)
	case c.MaxRequests < 0 || c.MaxRequests > 10_000_000:
		return bad("MaxRequests %d: want 1..10000000", c.MaxRequests)
	case c.Warmup < 0 || c.Cooldown < 0 || c.Warmup+c.Cooldown >= c.Duration:
		return bad("Warmup %v + Cooldown %v must be >= 0 and shorter than Duration %v", c.Warmup, c.Cooldown, c.Duration)
	case c.Timeout < 0:
		return bad("Timeout %v: must be > 0", c.Timeout)
	case c.MaxInFlight < 0 || c.MaxInFlight > 100_000:
		return bad("MaxInFlight %d: want 1..100000", c.MaxInFlight)
	case c.MaxOutput < 0 || c.MaxOutput > 1<<20:
		return bad("MaxOutput %d: want 0..%d", c.MaxOutput, 1<<20)
	}
	return nil
}

// Record is one request as the client saw it: a line of the NDJSON output.
type Record struct {
	// due is the request's scheduled arrival, from the run's start: the
	// summary's window is decided on it, not on Start, so a request due
	// inside the window but sent late by a busy machine still counts.
	due time.Duration

	Seq   int       `json:"seq"`
	Class string    `json:"class"`
	Start time.Time `json:"start"`
	// TTFTms: start to the first streamed token; null when none came.
	TTFTms *float64  `json:"ttft_ms"`
	End    time.Time `json:"end"`
	E2Ems  float64   `json:"e2e_ms"`
	// Status is the HTTP status (0: no response).
	Status int  `json:"status"`
	OK     bool `json:"ok"`
	// Endpoint and Region that served it (the data plane's answer
	// headers; empty against a bare engine).
	Endpoint     string `json:"endpoint,omitempty"`
	Region       string `json:"region,omitempty"`
	PromptTokens int    `json:"prompt_tokens"`
	// OutputTokens streamed back.
	OutputTokens int    `json:"output_tokens"`
	Turn         int    `json:"turn,omitempty"`
	Burst        bool   `json:"burst,omitempty"`
	Error        string `json:"error,omitempty"`
}

// Percentiles in milliseconds; nil when no request counted.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// Summary describes the requests that started inside the measured window
// (after Warmup, before Duration-Cooldown).
type Summary struct {
	URL        string  `json:"url"`
	Class      string  `json:"class"`
	Arrival    string  `json:"arrival"`
	RPS        float64 `json:"rps"`
	Seed       uint64  `json:"seed"`
	WindowS    float64 `json:"window_s"`
	Requests   int     `json:"requests"`
	Succeeded  int     `json:"succeeded"`
	ClientShed int     `json:"client_shed"`
	// Success is Succeeded/Requests (null with no request).
	Success     *float64       `json:"success"`
	AchievedRPS float64        `json:"achieved_rps"`
	TTFTms      *Percentiles   `json:"ttft_ms"`
	E2Ems       *Percentiles   `json:"e2e_ms"`
	Statuses    map[string]int `json:"statuses"`
}

// Result is a whole run: every record in start order and the summary.
type Result struct {
	Summary Summary
	Records []Record
}

// Deps are the run's collaborators; zero fields take defaults.
type Deps struct {
	// Client sends the requests. Default: a client with Config.Timeout and
	// MaxInFlight idle connections per host.
	Client *http.Client
	Clock  clockwork.Clock
	// OnRecord receives each record as its request ends (NDJSON output),
	// from one goroutine at a time.
	OnRecord func(Record)
	// Progress receives a progress bar line per second; nil is quiet.
	Progress io.Writer
}

// Run sends the configured load and returns every record. It stops
// sending at Duration, MaxRequests or ctx's end, then waits for the
// requests in flight (each bounded by Timeout; ctx's end cancels them).
func Run(ctx context.Context, cfg Config, deps Deps) (*Result, error) {
	cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	if deps.Client == nil {
		deps.Client = &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.MaxInFlight}}
		defer deps.Client.CloseIdleConnections()
	}
	r := &run{cfg: cfg, deps: deps, sem: make(chan struct{}, cfg.MaxInFlight)}
	r.start = deps.Clock.Now()
	r.send(ctx)
	r.wg.Wait()
	sort.Slice(r.records, func(i, j int) bool { return r.records[i].Seq < r.records[j].Seq })
	res := &Result{Records: r.records}
	res.Summary = summarize(cfg, r.start, r.records, r.shed)
	if r.deps.Progress != nil {
		r.progress(true)
	}
	return res, nil
}

type run struct {
	cfg   Config
	deps  Deps
	start time.Time
	sem   chan struct{}
	wg    sync.WaitGroup

	mu       sync.Mutex
	records  []Record
	shed     int
	failed   int
	sent     int
	lastBar  time.Time
	barWidth int
}

// send runs the arrival process until Duration, MaxRequests or ctx's end.
func (r *run) send(ctx context.Context) {
	arr := rand.New(rand.NewPCG(r.cfg.Seed, 0xa441))
	shapes := NewSampler(r.cfg.Class, r.cfg.Seed)
	clock := r.deps.Clock
	var next time.Duration // offset of the next steady arrival
	nextBurst := r.cfg.Class.BurstEvery
	seq := 0
	for seq < r.cfg.MaxRequests {
		gap := time.Duration(float64(time.Second) / r.cfg.RPS)
		if r.cfg.Arrival == ArrivalPoisson {
			gap = time.Duration(arr.ExpFloat64() / r.cfg.RPS * float64(time.Second))
		}
		next += gap
		burst := r.cfg.Class.BurstSize > 0 && nextBurst > 0 && nextBurst <= next
		at := next
		if burst {
			at = nextBurst
		}
		if at >= r.cfg.Duration {
			return
		}
		if wait := r.start.Add(at).Sub(clock.Now()); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-clock.After(wait):
			}
		} else if ctx.Err() != nil {
			return
		}
		r.tick()
		n := 1
		if burst {
			n, next = r.cfg.Class.BurstSize, next-gap // the steady arrival is still due
			nextBurst += r.cfg.Class.BurstEvery
		}
		for range n {
			if seq >= r.cfg.MaxRequests {
				return
			}
			sh := shapes.Next(at)
			seq++
			r.launch(ctx, seq, sh, burst, at)
		}
	}
}

func (r *run) launch(ctx context.Context, seq int, sh Shape, burst bool, due time.Duration) {
	select {
	case r.sem <- struct{}{}:
	default:
		r.mu.Lock()
		r.shed++
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.sent++
	r.mu.Unlock()
	r.wg.Go(func() {
		defer func() { <-r.sem }()
		rec := r.one(ctx, seq, sh)
		rec.Burst, rec.due = burst, due
		r.mu.Lock()
		defer r.mu.Unlock()
		r.records = append(r.records, rec)
		if !rec.OK {
			r.failed++
		}
		if r.deps.OnRecord != nil {
			r.deps.OnRecord(rec)
		}
	})
}

// body builds the request: a text of exactly sh.Prompt tokens by the
// 4-bytes-per-token estimate OpenAI-compatible servers' routers use, words
// drawn per segment (Shape.Text), so the requests of a conversation,
// document or tenant share their text as a prefix and nothing else does.
func (r *run) body(sh Shape) ([]byte, string) {
	text := sh.Text()
	out := sh.Output
	if r.cfg.MaxOutput > 0 {
		out = r.cfg.MaxOutput
	}
	req := map[string]any{"model": r.cfg.Model, "max_tokens": out, "stream": true}
	path := "/v1/completions"
	if r.cfg.Chat {
		req["messages"] = []map[string]string{{"role": "user", "content": text}}
		path = "/v1/chat/completions"
	} else {
		req["prompt"] = text
	}
	b, _ := json.Marshal(req)
	return b, path
}

// maxErrorLen bounds Record.Error.
const maxErrorLen = 200

func (r *run) one(ctx context.Context, seq int, sh Shape) Record {
	clock := r.deps.Clock
	rec := Record{Seq: seq, Class: r.cfg.Class.Name, PromptTokens: sh.Prompt, Turn: sh.Turn, Start: clock.Now()}
	body, path := r.body(sh)
	c := completion.Client{HTTP: r.deps.Client, Clock: clock, ErrorBody: 512}
	res := c.Send(ctx, completion.Request{URL: strings.TrimRight(r.cfg.URL, "/") + path, Body: body,
		PromptTokens: sh.Prompt, Start: rec.Start})
	rec.Status, rec.Endpoint, rec.Region, rec.OK = res.Status, res.Endpoint, res.Region, res.OK
	rec.OutputTokens = res.Events
	if res.Events > 0 {
		v := ms(res.FirstToken)
		rec.TTFTms = &v
	}
	errText := res.Body
	if res.Err != nil {
		errText = res.Err.Error()
	}
	rec.End = clock.Now()
	rec.E2Ems = ms(rec.End.Sub(rec.Start))
	if len(errText) > maxErrorLen {
		errText = errText[:maxErrorLen] + "…"
	}
	rec.Error = errText
	return rec
}

// tick draws the progress bar at most once a second.
func (r *run) tick() {
	if r.deps.Progress == nil {
		return
	}
	r.progress(false)
}

func (r *run) progress(final bool) {
	now := r.deps.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !final && now.Sub(r.lastBar) < time.Second {
		return
	}
	r.lastBar = now
	frac := min(1, float64(now.Sub(r.start))/float64(r.cfg.Duration))
	if final {
		frac = 1
	}
	const width = 30
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	line := fmt.Sprintf("\r[%s] %3.0f%%  sent %d  done %d  failed %d  shed %d", bar, frac*100, r.sent, len(r.records), r.failed, r.shed)
	if pad := r.barWidth - len(line); pad > 0 {
		line += strings.Repeat(" ", pad)
	}
	r.barWidth = len(line)
	if final {
		line += "\n"
	}
	fmt.Fprint(r.deps.Progress, line)
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }

// percentiles of vs (milliseconds), nearest-rank; nil for none.
func percentiles(vs []float64) *Percentiles {
	if len(vs) == 0 {
		return nil
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	return &Percentiles{P50: quantile.Sorted(s, 0.50), P95: quantile.Sorted(s, 0.95), P99: quantile.Sorted(s, 0.99)}
}

// summarize describes the records due in the measured window.
func summarize(cfg Config, start time.Time, recs []Record, shed int) Summary {
	from, to := start.Add(cfg.Warmup), start.Add(cfg.Duration-cfg.Cooldown)
	s := Summary{URL: cfg.URL, Class: cfg.Class.Name, Arrival: cfg.Arrival, RPS: cfg.RPS, Seed: cfg.Seed,
		WindowS: to.Sub(from).Seconds(), ClientShed: shed, Statuses: map[string]int{}}
	var ttft, e2e []float64
	for _, r := range recs {
		if due := start.Add(r.due); due.Before(from) || !due.Before(to) {
			continue
		}
		s.Requests++
		key := strconv.Itoa(r.Status)
		if r.Status == 0 {
			key = "no response"
		}
		s.Statuses[key]++
		if !r.OK {
			continue
		}
		s.Succeeded++
		e2e = append(e2e, r.E2Ems)
		if r.TTFTms != nil {
			ttft = append(ttft, *r.TTFTms)
		}
	}
	if s.Requests > 0 {
		v := float64(s.Succeeded) / float64(s.Requests)
		s.Success = &v
	}
	if s.WindowS > 0 {
		s.AchievedRPS = float64(s.Requests) / s.WindowS
	}
	s.TTFTms, s.E2Ems = percentiles(ttft), percentiles(e2e)
	return s
}
