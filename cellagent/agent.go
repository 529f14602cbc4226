package cellagent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Errors of the Agent lifecycle. Check them with errors.Is.
var (
	// ErrAlreadyStarted: Start was called a second time.
	ErrAlreadyStarted = errors.New("cellagent: agent already started")
	// ErrStopped: Start was called after Stop.
	ErrStopped = errors.New("cellagent: agent stopped")
)

// SourceStatus is the health of one telemetry source.
type SourceStatus struct {
	// OK is true when the last read succeeded.
	OK bool `json:"ok"`
	// Error says why the last read failed when OK is false. When OK is true
	// it lists the values dropped as invalid, if any.
	Error string `json:"error,omitempty"`
	// LastSuccess is the time of the last successful read; zero if never.
	LastSuccess time.Time `json:"-"`
}

func (s SourceStatus) proto() *isobarpb.SourceHealth {
	h := &isobarpb.SourceHealth{Ok: s.OK, Error: s.Error}
	if !s.LastSuccess.IsZero() {
		h.LastSuccess = timestamppb.New(s.LastSuccess)
	}
	return h
}

// Snapshot is what the agent currently reports.
type Snapshot struct {
	State      isobarpb.LifecycleState
	Reason     string
	Signals    Signals
	Capability Capability
	VLLM       SourceStatus
	DCGM       SourceStatus
	// Draining is true between a DRAIN and an UNDRAIN command.
	Draining bool
	// Paused is true while heartbeats are withheld (see Pause).
	Paused bool
	// Interval is the heartbeat interval in force.
	Interval time.Duration
	// Incarnation identifies this agent process in heartbeats.
	Incarnation string
	// LastScrape is when the last completed scrape round (health, vLLM,
	// GPU) began; zero before the first.
	LastScrape time.Time
}

// Agent scrapes one engine and its GPU and streams heartbeats to the
// regional controller. It composes two parts along their locks: the
// scraper (the engine's and GPU's state, under its mutex) and the
// streamer (the heartbeat stream, its sequence and interval, atomics and
// channels); the Agent itself owns only their lifecycle (under lifeMu).
// See the package documentation for its goroutines.
type Agent struct {
	cfg   Config
	clock clockwork.Clock
	log   *slog.Logger
	scr   *scraper
	hb    *streamer

	lifeMu   sync.Mutex
	started  bool
	stopped  bool
	cancel   context.CancelFunc
	done     chan struct{}
	closeHW  sync.Once
	ownsHTTP bool
}

// NewAgent validates cfg, loads the TLS files and builds an Agent. It starts
// nothing.
func NewAgent(cfg Config, deps Deps) (*Agent, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ownsHTTP := deps.HTTPClient == nil
	deps = deps.withDefaults()
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if cfg.TLS.enabled() {
		tc, err := loadTLS(cfg.TLS, cfg.Region)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	f := &fetcher{client: deps.HTTPClient, timeout: cfg.ScrapeTimeout, maxBody: cfg.MaxBodyBytes}
	hw, err := newHardwareSource(cfg, f)
	if err != nil {
		return nil, err
	}
	log := deps.Logger.With("cell", cfg.CellID)
	scr := newScraper(cfg, deps.Clock, log, m, f, hw)
	hb := &streamer{
		cfg: cfg, clock: deps.Clock, log: log, m: m, state: scr,
		// The agent reads only acks: static windows, no BDP pings
		// (grpcbounds.SmallMessagesDial).
		dialOpts:    append(append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, grpcbounds.SmallMessagesDial()...), deps.DialOptions...),
		incarnation: rand.Text(),
		kick:        make(chan struct{}, 1),
		ivChanged:   make(chan struct{}, 1),
	}
	hb.interval.Store(int64(cfg.Interval))
	scr.hb = hb
	a := &Agent{
		cfg: cfg, clock: deps.Clock, log: log, scr: scr, hb: hb,
		done: make(chan struct{}), ownsHTTP: ownsHTTP,
	}
	return a, nil
}

func (d Deps) withDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.HTTPClient == nil {
		d.HTTPClient = newHTTPClient()
	}
	return d
}

// loadTLS loads the agent's mTLS configuration. The handshake fails unless
// the controller's certificate is the identity of region's controller,
// spiffe://isobar/region/<region>: no other certificate of the CA can pose
// as the controller (and send drain commands).
func loadTLS(files TLSFiles, region string) (*tls.Config, error) {
	return certs.ClientConfig(files.Cert, files.Key, files.CA, files.ServerName, certs.WithPeer(func(id certs.Identity) error {
		if id.Kind != certs.KindRegion || id.Name != region {
			return fmt.Errorf("cellagent: the controller must be spiffe://isobar/region/%s", region)
		}
		return nil
	}))
}

// Start launches the agent's goroutines and returns at once. Cancelling ctx
// stops the agent as Stop does (with the final TERMINATED heartbeat). A
// second Start returns ErrAlreadyStarted, a Start after Stop ErrStopped.
func (a *Agent) Start(ctx context.Context) error {
	a.lifeMu.Lock()
	defer a.lifeMu.Unlock()
	switch {
	case a.stopped:
		return ErrStopped
	case a.started:
		return ErrAlreadyStarted
	}
	a.started = true
	a.scr.start(a.clock.Now())
	ctx, a.cancel = context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.scr.scrapeLoop(ctx) })
	wg.Go(func() { a.scr.watchLoop(ctx) })
	wg.Go(func() { a.hb.heartbeatLoop(ctx) })
	go func() {
		wg.Wait()
		a.closeHardware()
		close(a.done)
	}()
	a.log.Info("cellagent started", "incarnation", a.hb.incarnation, "controller", a.cfg.ControllerAddr,
		"vllm_url", a.cfg.VLLMURL, "dcgm_url", a.cfg.DCGMURL, "interval", a.cfg.Interval)
	return nil
}

// Stop sends a final TERMINATED heartbeat (bounded by ShutdownTimeout),
// closes the stream and blocks until every goroutine has exited. It is
// idempotent and safe to call before Start.
func (a *Agent) Stop() {
	a.lifeMu.Lock()
	a.stopped = true
	started, cancel := a.started, a.cancel
	a.lifeMu.Unlock()
	if !started {
		a.closeHardware()
		return
	}
	cancel()
	<-a.done
}

// closeHardware releases the hardware source and the idle connections of
// an HTTP client the agent built itself.
func (a *Agent) closeHardware() {
	a.closeHW.Do(func() {
		if a.scr.hw != nil {
			a.scr.hw.close()
		}
		if a.ownsHTTP {
			a.scr.fetch.client.CloseIdleConnections()
		}
	})
}

// Pause withholds heartbeats (true) or resumes them (false) while scraping
// goes on: the agent goes silent without touching the engine, as a hung
// agent would. Chaos drills use it. Stop still sends TERMINATED.
func (a *Agent) Pause(p bool) { a.hb.pause(p) }

// Snapshot returns what the agent would report now.
func (a *Agent) Snapshot() Snapshot {
	s := a.scr.snapshot()
	s.Paused = a.hb.paused.Load()
	s.Interval = a.hb.currentInterval()
	s.Incarnation = a.hb.incarnation
	return s
}

// jitter returns a random phase in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return mrand.N(d)
}
