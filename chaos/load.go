package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/completion"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// LoadConfig shapes the load a drill drives through every region's
// ingress: Poisson arrivals of streaming completions, a LongFraction of
// them long prompts.
type LoadConfig struct {
	// RPS per region. Default 5.
	RPS float64
	// Model requested. Default the fleet's.
	Model string
	// PromptTokens ± PromptJitter: default 512 ± 200; long prompts have
	// LongPrompt tokens (default 6000) and make LongFraction (default 0.1)
	// of the requests.
	PromptTokens, PromptJitter, LongPrompt int
	LongFraction                           float64
	// MaxTokens generated per request. Default 16.
	MaxTokens int
	// MaxInFlight per region; arrivals beyond it are counted as shed by the
	// client. Default 256.
	MaxInFlight int
	// MaxRequests bounds the requests of one drill. Default 1,000,000.
	MaxRequests int
	// Timeout per request. Default 2 minutes.
	Timeout time.Duration
	// Seed of the arrivals and prompt lengths. Default 1.
	Seed uint64
	// RegionRPS overrides RPS for the clients of the named regions (a
	// drill that overloads one region).
	RegionRPS map[string]float64 `json:"region_rps,omitempty"`
	// Tenants gives, per tenant, the share of every region's requests
	// that name it in xdscontract.TenantHeader (drawn per arrival from
	// Seed; the rest name none). The shares sum to at most 1. Default
	// none.
	Tenants map[string]float64 `json:"tenants,omitempty"`
}

func (c *LoadConfig) withDefaults() {
	if c.RPS == 0 {
		c.RPS = 5
	}
	if c.PromptTokens == 0 {
		c.PromptTokens, c.PromptJitter = 512, 200
	}
	if c.LongPrompt == 0 {
		c.LongPrompt = 6000
	}
	if c.LongFraction == 0 {
		c.LongFraction = 0.1
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = 16
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 256
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = 1_000_000
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// Outcome is one request as its client saw it.
type Outcome struct {
	Start, End time.Time
	// OK: HTTP 200 and the stream completed.
	OK     bool
	Status int
	TTFT   time.Duration
	// Home is the region whose clients sent it; Ingress the region whose
	// ingress took it (another one after a client-side failover).
	Home, Ingress string
	// Cell and Region that served it (the data plane's answer headers).
	Cell, Region string
	Prompt       int
	Long         bool
	// Tenant the request named ("" for none).
	Tenant string
	Error  string
}

// Ingress is one region's entry point.
type Ingress struct {
	Region string
	Addr   string
}

// Load drives requests until Stop.
type Load struct {
	cfg    LoadConfig
	clock  clockwork.Clock
	client *http.Client

	mu       sync.Mutex
	outcomes []Outcome
	failed   int
	shed     int
	sent     int
	// textSeed numbers the requests' prompt texts: each is distinct, so
	// an engine's prefix cache finds nothing shared by accident.
	textSeed atomic.Uint64

	cancel, cancelReqs context.CancelFunc
	arrivalsWG, wg     sync.WaitGroup
	stop               sync.Once
}

// StartLoad starts clients for every ingress. A client whose own ingress
// refuses the connection (the site is gone) sends to the next region in
// ingresses order instead, as DNS or anycast failover would: nothing was
// sent, so nothing is duplicated. Outcome.Ingress records where it went.
func StartLoad(ctx context.Context, cfg LoadConfig, ingresses []Ingress, clock clockwork.Clock) *Load {
	cfg.withDefaults()
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	l := &Load{cfg: cfg, clock: clock,
		client: &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	// Requests in flight outlive the end of arrivals: Stop lets them finish.
	var reqCtx context.Context
	reqCtx, l.cancelReqs = context.WithCancel(context.WithoutCancel(ctx))
	ctx, l.cancel = context.WithCancel(ctx)
	for i := range ingresses {
		order := append(append([]Ingress(nil), ingresses[i:]...), ingresses[:i]...)
		rps := cfg.RPS
		if v, ok := cfg.RegionRPS[ingresses[i].Region]; ok {
			rps = v
		}
		l.arrivalsWG.Go(func() { l.arrivals(ctx, reqCtx, order, rps, cfg.Seed+uint64(i)*7919) })
	}
	return l
}

func (l *Load) arrivals(ctx, reqCtx context.Context, order []Ingress, rps float64, seed uint64) {
	if rps <= 0 {
		<-ctx.Done()
		return
	}
	rng := rand.New(rand.NewPCG(seed, 0xc4a05))
	tenants := slices.Sorted(maps.Keys(l.cfg.Tenants))
	sem := make(chan struct{}, l.cfg.MaxInFlight)
	for ctx.Err() == nil {
		gap := time.Duration(rng.ExpFloat64() / rps * float64(time.Second))
		select {
		case <-ctx.Done():
			return
		case <-l.clock.After(gap):
		}
		long := rng.Float64() < l.cfg.LongFraction
		prompt := l.cfg.PromptTokens - l.cfg.PromptJitter + rng.IntN(2*l.cfg.PromptJitter+1)
		if long {
			prompt = l.cfg.LongPrompt
		}
		tenant := ""
		if len(tenants) > 0 {
			// Drawn only with tenants, so that other loads replay as
			// before.
			tenant = pickTenant(rng.Float64(), tenants, l.cfg.Tenants)
		}
		l.mu.Lock()
		full := l.sent >= l.cfg.MaxRequests
		if !full {
			l.sent++
		}
		l.mu.Unlock()
		if full {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			l.mu.Lock()
			l.shed++
			l.mu.Unlock()
			continue
		}
		l.wg.Go(func() {
			defer func() { <-sem }()
			l.record(l.one(reqCtx, order, prompt, long, tenant))
		})
	}
}

// pickTenant returns the tenant whose share covers u (in [0,1)), the
// tenants' shares laid end to end in names' order; "" past them.
func pickTenant(u float64, names []string, shares map[string]float64) string {
	acc := 0.0
	for _, n := range names {
		acc += shares[n]
		if u < acc {
			return n
		}
	}
	return ""
}

// refused reports a connection the ingress never accepted.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// one sends one request, to the next ingress in order while the previous
// refuses the connection.
func (l *Load) one(ctx context.Context, order []Ingress, prompt int, long bool, tenant string) Outcome {
	o := Outcome{Start: l.clock.Now(), Home: order[0].Region, Prompt: prompt, Long: long, Tenant: tenant}
	var hdr http.Header
	if tenant != "" {
		hdr = http.Header{xdscontract.TenantHeader: {tenant}}
	}
	body, _ := json.Marshal(map[string]any{
		"model": l.cfg.Model, "prompt": completion.PromptText(rand.New(rand.NewPCG(l.textSeed.Add(1), 0x7e47)), prompt), "max_tokens": l.cfg.MaxTokens, "stream": true,
	})
	c := completion.Client{HTTP: l.client, Clock: l.clock}
	var res completion.Result
	for _, in := range order {
		o.Ingress = in.Region
		res = c.Send(ctx, completion.Request{URL: "http://" + in.Addr + "/v1/completions", Body: body, PromptTokens: prompt, Start: o.Start, Header: hdr})
		if res.Status != 0 || !refused(res.Err) {
			break
		}
	}
	o.End = l.clock.Now()
	o.OK, o.Status, o.TTFT, o.Cell, o.Region = res.OK, res.Status, res.FirstEvent, res.Endpoint, res.Region
	o.Error = res.Body
	if res.Err != nil {
		o.Error = res.Err.Error()
	}
	return o
}

func (l *Load) record(o Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.outcomes = append(l.outcomes, o)
	if !o.OK {
		l.failed++
	}
}

// Progress returns the requests finished so far and how many failed.
func (l *Load) Progress() (done, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.outcomes), l.failed
}

// Stop ends arrivals, waits for the requests in flight (bounded by the
// request timeout) and returns every outcome and the client-side shed
// count. Idempotent.
func (l *Load) Stop() ([]Outcome, int) {
	l.stop.Do(func() {
		l.cancel()
		l.arrivalsWG.Wait()
		l.wg.Wait()
		l.cancelReqs()
		l.client.CloseIdleConnections()
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Outcome(nil), l.outcomes...), l.shed
}
