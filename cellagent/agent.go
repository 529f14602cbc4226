package cellagent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/certs"
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
// regional controller. See the package documentation for its goroutines.
type Agent struct {
	cfg         Config
	clock       clockwork.Clock
	log         *slog.Logger
	m           *metrics
	fetch       *fetcher
	hw          hardwareSource
	dialOpts    []grpc.DialOption
	healthURL   string
	modelsURL   string
	engineAddr  string
	incarnation string

	seq      atomic.Uint64
	probeSeq atomic.Uint64 // numbers /health probes in the order they start
	interval atomic.Int64  // time.Duration of the heartbeat interval
	paused   atomic.Bool
	watching atomic.Bool

	kick        chan struct{} // send a heartbeat now (1-buffered, coalescing)
	rearm       chan struct{} // the engine watcher may dial (1-buffered)
	ivChanged   chan struct{} // the heartbeat interval changed (1-buffered)
	firstScrape chan struct{} // closed after the first scrape

	mu sync.Mutex
	st state // guarded by mu

	lifeMu    sync.Mutex
	started   bool
	stopped   bool
	startedAt time.Time
	cancel    context.CancelFunc
	done      chan struct{}
	closeHW   sync.Once
	ownsHTTP  bool
}

// state is what the scrapes and acks have established; guarded by Agent.mu.
type state struct {
	engine      engineProbe
	everUp      bool
	draining    bool
	stopping    bool
	capStale    bool
	modelsAt    time.Time // last successful /v1/models read
	capability  Capability
	modelsErr   string
	win         window
	app         Signals
	hw          HardwareSample
	vllm        SourceStatus
	dcgm        SourceStatus
	lifecycle   isobarpb.LifecycleState
	reason      string
	rearmBudget bool
	// healthTimeouts counts the consecutive /health probes that timed out
	// while the engine was still counted reachable (Config.HealthTimeouts).
	healthTimeouts int
	lastVLLMOK     bool
	lastDCGMOK     bool
	lastScrape     time.Time
}

func (s *state) signals() Signals { return s.app.mergeHardware(s.hw) }

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
		return nil, fmt.Errorf("cellagent: registering metrics: %w", err)
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
	healthURL, _ := siblingURL(cfg.VLLMURL, "/health")
	modelsURL, _ := siblingURL(cfg.VLLMURL, "/v1/models")
	u, _ := url.Parse(cfg.VLLMURL)
	a := &Agent{
		cfg:         cfg,
		clock:       deps.Clock,
		log:         deps.Logger.With("cell", cfg.CellID),
		m:           m,
		fetch:       f,
		hw:          hw,
		dialOpts:    append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, deps.DialOptions...),
		healthURL:   healthURL,
		modelsURL:   modelsURL,
		engineAddr:  hostPortOf(u),
		incarnation: rand.Text(),
		kick:        make(chan struct{}, 1),
		rearm:       make(chan struct{}, 1),
		ivChanged:   make(chan struct{}, 1),
		firstScrape: make(chan struct{}),
		done:        make(chan struct{}),
		ownsHTTP:    ownsHTTP,
	}
	a.interval.Store(int64(cfg.Interval))
	a.st.capStale = true
	a.st.lifecycle = isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING
	a.st.reason = "engine not probed yet"
	a.st.win.span = cfg.Window
	a.st.vllm = SourceStatus{Error: "not scraped yet"}
	a.st.dcgm = SourceStatus{Error: "not scraped yet"}
	if hw == nil {
		a.st.dcgm = SourceStatus{Error: "not configured"}
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
	a.startedAt = a.clock.Now()
	ctx, a.cancel = context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.scrapeLoop(ctx) })
	wg.Go(func() { a.watchLoop(ctx) })
	wg.Go(func() { a.heartbeatLoop(ctx) })
	go func() {
		wg.Wait()
		a.closeHardware()
		close(a.done)
	}()
	a.log.Info("cellagent started", "incarnation", a.incarnation, "controller", a.cfg.ControllerAddr,
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
		if a.hw != nil {
			a.hw.close()
		}
		if a.ownsHTTP {
			a.fetch.client.CloseIdleConnections()
		}
	})
}

// Pause withholds heartbeats (true) or resumes them (false) while scraping
// goes on: the agent goes silent without touching the engine, as a hung
// agent would. Chaos drills use it. Stop still sends TERMINATED.
func (a *Agent) Pause(p bool) {
	if a.paused.Swap(p) == p {
		return
	}
	a.log.Info("heartbeats paused", "paused", p)
	if !p {
		a.kickHeartbeat()
	}
}

// Snapshot returns what the agent would report now.
func (a *Agent) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Snapshot{
		State:       a.st.lifecycle,
		Reason:      a.st.reason,
		Signals:     a.st.signals(),
		Capability:  a.st.capability,
		VLLM:        a.st.vllm,
		DCGM:        a.st.dcgm,
		Draining:    a.st.draining,
		Paused:      a.paused.Load(),
		Interval:    a.currentInterval(),
		Incarnation: a.incarnation,
		LastScrape:  a.st.lastScrape,
	}
}

func (a *Agent) currentInterval() time.Duration { return time.Duration(a.interval.Load()) }

func (a *Agent) kickHeartbeat() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// armWatch lets the engine watcher dial, unless it is watching already.
func (a *Agent) armWatch() {
	if a.watching.Load() {
		return
	}
	select {
	case a.rearm <- struct{}{}:
	default:
	}
}

// jitter returns a random phase in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return mrand.N(d)
}

// waitClock waits d on the agent's clock; false if ctx ended first.
func (a *Agent) waitClock(ctx context.Context, d time.Duration) bool {
	t := a.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}

// scrapeLoop owns the scrapes: one at start, then one per ScrapeInterval
// after a random phase.
func (a *Agent) scrapeLoop(ctx context.Context) {
	a.scrapeAll(ctx)
	close(a.firstScrape)
	phase := a.clock.NewTimer(jitter(a.cfg.ScrapeInterval))
	defer phase.Stop()
	tick := phase.Chan()
	var ticker clockwork.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			if ticker == nil {
				ticker = a.clock.NewTicker(a.cfg.ScrapeInterval)
				tick = ticker.Chan()
			}
			a.scrapeAll(ctx)
		}
	}
}

// modelsRefresh bounds how long a /v1/models answer is trusted: a restart
// the counters could not reveal (an idle engine) is caught by then.
const modelsRefresh = 30 * time.Second

// scrapeAll probes /health and scrapes vLLM (and /v1/models when the
// capability is not known) and the GPU, concurrently, then folds the
// results into the state.
func (a *Agent) scrapeAll(ctx context.Context) {
	a.mu.Lock()
	needModels := a.st.capStale || a.clock.Since(a.st.modelsAt) >= modelsRefresh
	a.mu.Unlock()
	var (
		hp         engineProbe
		vs         VLLMSample
		verr       error
		ms         ModelsSample
		merr       error
		hw         HardwareSample
		herr       error
		wg         sync.WaitGroup
		scrapeTime = a.clock.Now()
	)
	wg.Go(func() { hp = a.probe(ctx) })
	wg.Go(func() {
		vs, verr = a.scrapeVLLM(ctx)
		if needModels {
			ms, merr = a.scrapeModels(ctx)
		}
	})
	if a.hw != nil {
		wg.Go(func() { hw, herr = a.readHardware(ctx) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // shutting down: failures now are ours, not the sources'
	}
	a.mu.Lock()
	a.applyHealthLocked(hp)
	a.applyVLLMLocked(scrapeTime, vs, verr)
	if needModels {
		a.applyModelsLocked(ms, merr)
	}
	if a.hw != nil {
		a.applyHardwareLocked(scrapeTime, hw, herr)
	}
	a.st.rearmBudget = true
	a.st.lastScrape = scrapeTime
	kick := a.recomputeLocked()
	reachable := a.st.engine.reachable()
	a.mu.Unlock()
	if kick {
		a.kickHeartbeat()
	}
	if reachable {
		a.armWatch()
	}
}

// probeNow handles an engine-watcher event: probe /health at once and,
// when the state changed, send a heartbeat at once. It reports whether the
// watcher may watch again right away: the engine is reachable and no event
// probe has re-armed it since the last scrape tick (after a spurious close
// the watcher otherwise waits for the next tick).
func (a *Agent) probeNow(ctx context.Context) (rewatch bool) {
	hp := a.probe(ctx)
	if ctx.Err() != nil {
		return false
	}
	a.mu.Lock()
	a.applyHealthLocked(hp)
	kick := a.recomputeLocked()
	rewatch = a.st.engine.reachable() && a.st.rearmBudget
	if rewatch {
		a.st.rearmBudget = false
	}
	a.mu.Unlock()
	if kick {
		a.kickHeartbeat()
	}
	return rewatch
}

func (a *Agent) probe(ctx context.Context) engineProbe {
	seq := a.probeSeq.Add(1)
	start := a.clock.Now()
	code, _, err := a.fetch.get(ctx, a.healthURL, "")
	a.m.scrapeDuration.WithLabelValues(srcHealth).Observe(a.clock.Since(start).Seconds())
	p := classifyHealth(code, err, a.cfg.ScrapeTimeout)
	p.seq = seq
	res := "ok"
	if p.phase != phaseUp {
		res = "error"
	}
	a.m.scrapes.WithLabelValues(srcHealth, res).Inc()
	return p
}

func (a *Agent) scrapeVLLM(ctx context.Context) (VLLMSample, error) {
	start := a.clock.Now()
	body, err := a.fetch.getOK(ctx, a.cfg.VLLMURL, acceptText)
	var s VLLMSample
	if err == nil {
		s, err = ParseVLLM(body, VLLMOptions{CompletionHandlers: a.cfg.CompletionHandlers})
	}
	a.m.scrapeDuration.WithLabelValues(srcVLLM).Observe(a.clock.Since(start).Seconds())
	a.m.scrapes.WithLabelValues(srcVLLM, resultLabel(err)).Inc()
	return s, err
}

func (a *Agent) scrapeModels(ctx context.Context) (ModelsSample, error) {
	start := a.clock.Now()
	body, err := a.fetch.getOK(ctx, a.modelsURL, "application/json")
	var ms ModelsSample
	if err == nil {
		ms, err = ParseModels(body)
	}
	a.m.scrapeDuration.WithLabelValues(srcModels).Observe(a.clock.Since(start).Seconds())
	a.m.scrapes.WithLabelValues(srcModels, resultLabel(err)).Inc()
	return ms, err
}

func (a *Agent) readHardware(ctx context.Context) (HardwareSample, error) {
	start := a.clock.Now()
	hw, err := a.hw.read(ctx)
	a.m.scrapeDuration.WithLabelValues(srcDCGM).Observe(a.clock.Since(start).Seconds())
	a.m.scrapes.WithLabelValues(srcDCGM, resultLabel(err)).Inc()
	return hw, err
}

// applyHealthLocked records a /health probe, unless a probe that started
// later has been recorded already (a scrape round's probe may finish after
// the watcher's). An engine that is down takes its application signals with
// it: they are never forwarded stale.
func (a *Agent) applyHealthLocked(hp engineProbe) {
	prev := a.st.engine
	if hp.seq < prev.seq {
		return
	}
	if !hp.timedOut {
		a.st.healthTimeouts = 0
	} else if prev.reachable() {
		a.st.healthTimeouts++
		if a.st.healthTimeouts < a.cfg.HealthTimeouts {
			// Tolerated: the engine answered the probe before; keep its
			// phase until HealthTimeouts probes in a row go unanswered.
			a.log.Warn("engine health probe timed out; the engine still counts as up",
				"reason", hp.reason, "consecutive", a.st.healthTimeouts, "down_at", a.cfg.HealthTimeouts)
			a.m.healthTimeouts.Inc()
			prev.seq = hp.seq
			a.st.engine = prev
			return
		}
	}
	a.st.engine = hp
	if hp.reachable() {
		a.st.everUp = true
	}
	if hp.phase == phaseDown {
		if prev.phase != phaseDown {
			a.st.capStale = true
		}
		a.st.win.clear()
		a.st.app = Signals{}
		a.setVLLMLocked(SourceStatus{Error: hp.reason, LastSuccess: a.st.vllm.LastSuccess})
	}
}

func (a *Agent) setVLLMLocked(s SourceStatus) {
	if a.st.vllm.OK != s.OK {
		if s.OK {
			a.log.Info("vllm source recovered")
		} else {
			a.log.Warn("vllm source failed", "err", s.Error)
		}
	}
	a.st.vllm = s
	a.m.sourceUp.WithLabelValues(srcVLLM).Set(boolGauge(s.OK))
}

func (a *Agent) setDCGMLocked(s SourceStatus) {
	if a.st.dcgm.OK != s.OK {
		if s.OK {
			a.log.Info("dcgm source recovered")
		} else {
			a.log.Warn("dcgm source failed", "err", s.Error)
		}
	}
	a.st.dcgm = s
	a.m.sourceUp.WithLabelValues(srcDCGM).Set(boolGauge(s.OK))
}

func (a *Agent) applyVLLMLocked(now time.Time, s VLLMSample, err error) {
	if a.st.engine.phase == phaseDown {
		return // applyHealthLocked has cleared the application signals
	}
	if err != nil {
		a.st.win.clear()
		a.st.app = Signals{}
		a.setVLLMLocked(SourceStatus{Error: err.Error(), LastSuccess: a.st.vllm.LastSuccess})
		return
	}
	if n := len(s.Invalid); n > 0 {
		a.m.invalidValues.WithLabelValues(srcVLLM).Add(float64(n))
	}
	if a.st.win.add(now, s) {
		a.m.windowRestarts.Inc()
		// Counters going backwards mean a new engine process, which may
		// serve another --max-model-len: read /v1/models again.
		a.st.capStale = true
		a.log.Info("vllm counters went backwards (engine restarted); signal window restarted")
	}
	a.st.app = a.st.win.derive()
	if a.st.capability.Model == "" && s.Model != "" {
		a.st.capability.Model = s.Model // until /v1/models answers
	}
	a.setVLLMLocked(SourceStatus{OK: true, Error: invalids(s.Invalid).String(), LastSuccess: now})
}

func (a *Agent) applyModelsLocked(ms ModelsSample, err error) {
	if err != nil {
		if msg := err.Error(); msg != a.st.modelsErr {
			a.st.modelsErr = msg
			a.log.Warn("reading /v1/models failed", "err", msg)
		}
		return
	}
	if n := len(ms.Invalid); n > 0 {
		a.m.invalidValues.WithLabelValues(srcModels).Add(float64(n))
		a.log.Warn("dropped invalid values from /v1/models", "invalid", invalids(ms.Invalid).String())
	}
	if ms.Capability != a.st.capability {
		a.log.Info("engine capability", "model", ms.Model, "max_model_len", ms.MaxModelLen)
	}
	a.st.modelsErr = ""
	a.st.capability = ms.Capability
	a.st.capStale = false
	a.st.modelsAt = a.clock.Now()
}

func (a *Agent) applyHardwareLocked(now time.Time, hw HardwareSample, err error) {
	if err != nil {
		a.st.hw = HardwareSample{}
		a.setDCGMLocked(SourceStatus{Error: err.Error(), LastSuccess: a.st.dcgm.LastSuccess})
		return
	}
	if n := len(hw.Invalid); n > 0 {
		a.m.invalidValues.WithLabelValues(srcDCGM).Add(float64(n))
	}
	a.st.hw = hw
	a.setDCGMLocked(SourceStatus{OK: true, Error: invalids(hw.Invalid).String(), LastSuccess: now})
}

// recomputeLocked derives the lifecycle state and reports whether a
// heartbeat should go out now: the state changed, or a source came or went.
func (a *Agent) recomputeLocked() (kick bool) {
	inGrace := a.cfg.StartupGrace > 0 && !a.st.everUp && a.clock.Since(a.startedAt) < a.cfg.StartupGrace
	st, reason := observedState(a.st.engine, a.st.draining, a.st.stopping, inGrace)
	if st != a.st.lifecycle {
		a.log.Info("lifecycle state changed", "from", stateName(a.st.lifecycle), "to", stateName(st), "reason", reason)
		a.m.state.WithLabelValues(stateName(a.st.lifecycle)).Set(0)
		kick = true
	}
	a.m.state.WithLabelValues(stateName(st)).Set(1)
	a.st.lifecycle, a.st.reason = st, reason
	flipped := a.sourcesFlippedLocked() // always: it records what was seen
	return kick || flipped
}

// sourcesFlippedLocked reports whether a source's ok changed since the last
// call.
func (a *Agent) sourcesFlippedLocked() bool {
	v, d := a.st.vllm.OK, a.st.dcgm.OK
	flipped := v != a.st.lastVLLMOK || d != a.st.lastDCGMOK
	a.st.lastVLLMOK, a.st.lastDCGMOK = v, d
	return flipped
}

// stateName is the short name of a lifecycle state, e.g. READY.
func stateName(s isobarpb.LifecycleState) string {
	const prefix = "LIFECYCLE_STATE_"
	n := s.String()
	if len(n) > len(prefix) && n[:len(prefix)] == prefix {
		return n[len(prefix):]
	}
	return n
}

// watchLoop keeps a plain TCP connection open to the engine's port while
// the engine is reachable. vLLM never writes on it, so a read returns only
// when the connection ends: EOF or RST when the engine process dies (the
// kernel closes its sockets), or an idle close by the server. Either way the
// watcher probes /health at once, on its own goroutine so that a slow scrape
// round cannot delay it; the probe tells death from an idle close. Then it
// watches again if probeNow allows, else waits to be re-armed by a scrape
// tick that finds the engine reachable.
func (a *Agent) watchLoop(ctx context.Context) {
	d := net.Dialer{Timeout: a.cfg.ScrapeTimeout, KeepAlive: 15 * time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.rearm:
		}
		for rewatch := true; rewatch; {
			a.watching.Store(true)
			event := a.watchOnce(ctx, &d)
			a.watching.Store(false)
			if ctx.Err() != nil {
				return
			}
			a.m.engineEvents.WithLabelValues(event).Inc()
			a.log.Debug("engine connection ended; probing health", "event", event)
			rewatch = a.probeNow(ctx)
		}
	}
}

// watchOnce dials the engine and blocks until the connection ends.
func (a *Agent) watchOnce(ctx context.Context, d *net.Dialer) string {
	conn, err := d.DialContext(ctx, "tcp", a.engineAddr)
	if err != nil {
		return "dial_failed"
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	buf := make([]byte, 512)
	for {
		if _, err := conn.Read(buf); err != nil {
			if errors.Is(err, io.EOF) {
				return "closed"
			}
			return "reset"
		}
	}
}
