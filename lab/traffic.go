package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/sim"
)

// maxSamples bounds the TTFT samples kept for the report.
const maxSamples = 1 << 20

// traffic is a Poisson load driver that picks an endpoint per request by
// weighted random choice over the endpoint weights the control plane
// published (what Envoy's weighted balancing does on average).
type traffic struct {
	cfg    Config
	watch  *gateway.Watcher
	clock  clockwork.Clock
	log    *slog.Logger
	client *http.Client
	sem    chan struct{}

	mu        sync.Mutex
	cells     map[string]*stats
	total     stats
	shed      int
	abandoned int

	// cancel stops arrivals; cancelReqs aborts requests still in flight
	// when the drain timeout ends.
	cancel, cancelReqs context.CancelFunc
	arrivalsDone       chan struct{}
	wg                 sync.WaitGroup
	stopOnce           sync.Once
}

// drainTimeout bounds how long stop waits for in-flight requests.
const drainTimeout = 30 * time.Second

type stats struct {
	requests, succeeded int
	ttft                []time.Duration
	recent              []outcome // last recentWindow of outcomes, for the view
}

type outcome struct {
	at   time.Time
	ok   bool
	ttft time.Duration
}

const recentWindow = 10 * time.Second

func newTraffic(cfg Config, w *gateway.Watcher, clock clockwork.Clock, log *slog.Logger) *traffic {
	return &traffic{
		cfg: cfg, watch: w, clock: clock, log: log,
		client: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		sem:    make(chan struct{}, cfg.MaxInFlight),
		cells:  map[string]*stats{},
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
// those cut off then are counted as abandoned, not failed) and waits for
// every goroutine. Idempotent.
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
	})
}

func (t *traffic) arrivals(ctx, reqCtx context.Context) {
	if t.cfg.RPS == 0 {
		<-ctx.Done()
		return
	}
	rng := rand.New(rand.NewPCG(t.cfg.Seed, 0x15ba4))
	for ctx.Err() == nil {
		gap := time.Duration(rng.ExpFloat64() / t.cfg.RPS * float64(time.Second))
		select {
		case <-ctx.Done():
			return
		case <-t.clock.After(gap):
		}
		a, ok := t.watch.Latest()
		if !ok {
			continue
		}
		ep, ok := gateway.Pick(a, rng.Float64())
		if !ok {
			continue
		}
		prompt := t.cfg.PromptTokens - t.cfg.PromptJitter + rng.IntN(2*t.cfg.PromptJitter+1)
		select {
		case t.sem <- struct{}{}:
		default:
			t.mu.Lock()
			t.shed++
			t.mu.Unlock()
			continue
		}
		t.wg.Go(func() {
			defer func() { <-t.sem }()
			t.one(reqCtx, ep, prompt)
		})
	}
}

// one sends a streaming completion and records its outcome and TTFT.
func (t *traffic) one(ctx context.Context, ep gateway.Endpoint, promptTokens int) {
	body, _ := json.Marshal(map[string]any{
		"model": sim.DefaultModel, "prompt": strings.Repeat("abcd", promptTokens),
		"max_tokens": t.cfg.MaxTokens, "stream": true,
	})
	start := t.clock.Now()
	ok, ttft := false, time.Duration(0)
	defer func() {
		if !ok && ctx.Err() != nil {
			t.mu.Lock()
			t.abandoned++
			t.mu.Unlock()
			return
		}
		t.record(ep.Cell, start, ok, ttft)
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep.Address+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if ttft == 0 {
			ttft = t.clock.Since(start)
		}
		if line == "data: [DONE]" {
			ok = true
			return
		}
	}
}

func (t *traffic) record(cell string, at time.Time, ok bool, ttft time.Duration) {
	if cell == "" {
		cell = "unknown"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := t.cells[cell]
	if cs == nil {
		cs = &stats{}
		t.cells[cell] = cs
	}
	for _, s := range []*stats{cs, &t.total} {
		s.requests++
		if ok {
			s.succeeded++
			if len(s.ttft) < maxSamples {
				s.ttft = append(s.ttft, ttft)
			}
		}
		s.recent = append(s.recent, outcome{at: at, ok: ok, ttft: ttft})
		cut := 0
		for cut < len(s.recent) && t.clock.Since(s.recent[cut].at) > recentWindow {
			cut++
		}
		s.recent = s.recent[cut:]
	}
}

// Percentiles are TTFT percentiles in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(q float64) float64 { return float64(sim.Percentile(s, q)) / float64(time.Millisecond) }
	return Percentiles{P50: ms(0.50), P95: ms(0.95), P99: ms(0.99)}
}

func (s *stats) String() string {
	return fmt.Sprintf("%d/%d", s.succeeded, s.requests)
}
