package cellagent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// kicker asks for a heartbeat now (non-blocking, coalescing).
type kicker interface {
	kickHeartbeat()
}

var _ kicker = (*streamer)(nil)

// scraper owns what the agent knows of its engine and GPU: it scrapes
// them, watches the engine's port, derives the lifecycle state, and
// applies the controller's commands to it.
//
// Concurrency: scrapeLoop and watchLoop are its goroutines; mu guards st,
// which the streamer reads (report) and writes (applyCommands) from the
// stream's goroutines. It kicks a heartbeat through hb after a change,
// never holding mu.
type scraper struct {
	cfg        Config
	clock      clockwork.Clock
	log        *slog.Logger
	m          *metrics
	fetch      *fetcher
	hw         hardwareSource
	healthURL  string
	modelsURL  string
	engineAddr string
	hb         kicker

	probeSeq atomic.Uint64 // numbers /health probes in the order they start
	watching atomic.Bool

	rearm       chan struct{} // the engine watcher may dial (1-buffered)
	firstScrape chan struct{} // closed after the first scrape

	mu        sync.Mutex
	st        state     // guarded by mu
	startedAt time.Time // guarded by mu; set by start
}

func newScraper(cfg Config, clock clockwork.Clock, log *slog.Logger, m *metrics, f *fetcher, hw hardwareSource) *scraper {
	healthURL, _ := siblingURL(cfg.VLLMURL, "/health")
	modelsURL, _ := siblingURL(cfg.VLLMURL, "/v1/models")
	u, _ := url.Parse(cfg.VLLMURL)
	sc := &scraper{
		cfg: cfg, clock: clock, log: log, m: m, fetch: f, hw: hw,
		healthURL: healthURL, modelsURL: modelsURL, engineAddr: hostPortOf(u),
		rearm: make(chan struct{}, 1), firstScrape: make(chan struct{}),
	}
	sc.st.capStale = true
	sc.st.lifecycle = isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING
	sc.st.reason = "engine not probed yet"
	sc.st.win.span = cfg.Window
	sc.st.vllm = SourceStatus{Error: "not scraped yet"}
	sc.st.dcgm = SourceStatus{Error: "not scraped yet"}
	if hw == nil {
		sc.st.dcgm = SourceStatus{Error: "not configured"}
	}
	return sc
}

// start records the start time (the startup grace runs from it).
func (sc *scraper) start(now time.Time) {
	sc.mu.Lock()
	sc.startedAt = now
	sc.mu.Unlock()
}

// scraped is closed after the first scrape.
func (sc *scraper) scraped() <-chan struct{} { return sc.firstScrape }

// snapshot returns the scraped part of the agent's Snapshot.
func (sc *scraper) snapshot() Snapshot {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return Snapshot{
		State:      sc.st.lifecycle,
		Reason:     sc.st.reason,
		Signals:    sc.st.signals(),
		Capability: sc.st.capability,
		VLLM:       sc.st.vllm,
		DCGM:       sc.st.dcgm,
		Draining:   sc.st.draining,
		LastScrape: sc.st.lastScrape,
	}
}

// cellReport is the state one heartbeat reports.
type cellReport struct {
	capability Capability
	lifecycle  isobarpb.LifecycleState
	reason     string
	signals    Signals
	vllm, dcgm SourceStatus
}

// report returns the state to send; final first marks the agent stopping.
func (sc *scraper) report(final bool) cellReport {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if final && !sc.st.stopping {
		sc.st.stopping = true
		sc.recomputeLocked()
	}
	return cellReport{
		capability: sc.st.capability, lifecycle: sc.st.lifecycle, reason: sc.st.reason,
		signals: sc.st.signals(), vllm: sc.st.vllm, dcgm: sc.st.dcgm,
	}
}

// applyCommands applies a controller's DRAIN and UNDRAIN and kicks a
// heartbeat when the state changed.
func (sc *scraper) applyCommands(cmds []isobarpb.Command) {
	sc.mu.Lock()
	for _, c := range cmds {
		switch c {
		case isobarpb.Command_COMMAND_DRAIN:
			sc.st.draining = true
			sc.m.commands.WithLabelValues("drain").Inc()
		case isobarpb.Command_COMMAND_UNDRAIN:
			sc.st.draining = false
			sc.m.commands.WithLabelValues("undrain").Inc()
		default:
			sc.m.commands.WithLabelValues("unknown").Inc()
			sc.log.Warn("ignoring unknown command from controller", "command", int32(c))
		}
	}
	kick := sc.recomputeLocked()
	sc.mu.Unlock()
	if kick {
		sc.hb.kickHeartbeat()
	}
}

// state is what the scrapes and acks have established; guarded by scraper.mu.
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

// modelsRefresh bounds how long a /v1/models answer is trusted: a restart
// the counters could not reveal (an idle engine) is caught by then.
const modelsRefresh = 30 * time.Second

// armWatch lets the engine watcher dial, unless it is watching already.
func (sc *scraper) armWatch() {
	if sc.watching.Load() {
		return
	}
	select {
	case sc.rearm <- struct{}{}:
	default:
	}
}

// scrapeLoop owns the scrapes: one at start, then one per ScrapeInterval
// after a random phase.
func (sc *scraper) scrapeLoop(ctx context.Context) {
	sc.scrapeAll(ctx)
	close(sc.firstScrape)
	phase := sc.clock.NewTimer(jitter(sc.cfg.ScrapeInterval))
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
				ticker = sc.clock.NewTicker(sc.cfg.ScrapeInterval)
				tick = ticker.Chan()
			}
			sc.scrapeAll(ctx)
		}
	}
}

// scrapeAll probes /health and scrapes vLLM (and /v1/models when the
// capability is not known) and the GPU, concurrently, then folds the
// results into the state.
func (sc *scraper) scrapeAll(ctx context.Context) {
	sc.mu.Lock()
	needModels := sc.st.capStale || sc.clock.Since(sc.st.modelsAt) >= modelsRefresh
	sc.mu.Unlock()
	var (
		hp         engineProbe
		vs         VLLMSample
		verr       error
		ms         ModelsSample
		merr       error
		hw         HardwareSample
		herr       error
		wg         sync.WaitGroup
		scrapeTime = sc.clock.Now()
	)
	wg.Go(func() { hp = sc.probe(ctx) })
	wg.Go(func() {
		vs, verr = sc.scrapeVLLM(ctx)
		if needModels {
			ms, merr = sc.scrapeModels(ctx)
		}
	})
	if sc.hw != nil {
		wg.Go(func() { hw, herr = sc.readHardware(ctx) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // shutting down: failures now are ours, not the sources'
	}
	sc.mu.Lock()
	sc.applyHealthLocked(hp)
	sc.applyVLLMLocked(scrapeTime, vs, verr)
	if needModels {
		sc.applyModelsLocked(ms, merr)
	}
	if sc.hw != nil {
		sc.applyHardwareLocked(scrapeTime, hw, herr)
	}
	sc.st.rearmBudget = true
	sc.st.lastScrape = scrapeTime
	kick := sc.recomputeLocked()
	reachable := sc.st.engine.reachable()
	sc.mu.Unlock()
	if kick {
		sc.hb.kickHeartbeat()
	}
	if reachable {
		sc.armWatch()
	}
}

// probeNow handles an engine-watcher event: probe /health at once and,
// when the state changed, send a heartbeat at once. It reports whether the
// watcher may watch again right away: the engine is reachable and no event
// probe has re-armed it since the last scrape tick (after a spurious close
// the watcher otherwise waits for the next tick).
func (sc *scraper) probeNow(ctx context.Context) (rewatch bool) {
	hp := sc.probe(ctx)
	if ctx.Err() != nil {
		return false
	}
	sc.mu.Lock()
	sc.applyHealthLocked(hp)
	kick := sc.recomputeLocked()
	rewatch = sc.st.engine.reachable() && sc.st.rearmBudget
	if rewatch {
		sc.st.rearmBudget = false
	}
	sc.mu.Unlock()
	if kick {
		sc.hb.kickHeartbeat()
	}
	return rewatch
}

func (sc *scraper) probe(ctx context.Context) engineProbe {
	seq := sc.probeSeq.Add(1)
	start := sc.clock.Now()
	code, _, err := sc.fetch.get(ctx, sc.healthURL, "")
	sc.m.scrapeDuration.WithLabelValues(srcHealth).Observe(sc.clock.Since(start).Seconds())
	p := classifyHealth(code, err, sc.cfg.ScrapeTimeout)
	p.seq = seq
	res := "ok"
	if p.phase != phaseUp {
		res = "error"
	}
	sc.m.scrapes.WithLabelValues(srcHealth, res).Inc()
	return p
}

func (sc *scraper) scrapeVLLM(ctx context.Context) (VLLMSample, error) {
	start := sc.clock.Now()
	body, err := sc.fetch.getOK(ctx, sc.cfg.VLLMURL, acceptText)
	var s VLLMSample
	if err == nil {
		s, err = ParseVLLM(body, VLLMOptions{CompletionHandlers: sc.cfg.CompletionHandlers})
	}
	sc.m.scrapeDuration.WithLabelValues(srcVLLM).Observe(sc.clock.Since(start).Seconds())
	sc.m.scrapes.WithLabelValues(srcVLLM, resultLabel(err)).Inc()
	return s, err
}

func (sc *scraper) scrapeModels(ctx context.Context) (ModelsSample, error) {
	start := sc.clock.Now()
	body, err := sc.fetch.getOK(ctx, sc.modelsURL, "application/json")
	var ms ModelsSample
	if err == nil {
		ms, err = ParseModels(body)
	}
	sc.m.scrapeDuration.WithLabelValues(srcModels).Observe(sc.clock.Since(start).Seconds())
	sc.m.scrapes.WithLabelValues(srcModels, resultLabel(err)).Inc()
	return ms, err
}

func (sc *scraper) readHardware(ctx context.Context) (HardwareSample, error) {
	start := sc.clock.Now()
	hw, err := sc.hw.read(ctx)
	sc.m.scrapeDuration.WithLabelValues(srcDCGM).Observe(sc.clock.Since(start).Seconds())
	sc.m.scrapes.WithLabelValues(srcDCGM, resultLabel(err)).Inc()
	return hw, err
}

// applyHealthLocked records a /health probe, unless a probe that started
// later has been recorded already (a scrape round's probe may finish after
// the watcher's). An engine that is down takes its application signals with
// it: they are never forwarded stale.
func (sc *scraper) applyHealthLocked(hp engineProbe) {
	prev := sc.st.engine
	if hp.seq < prev.seq {
		return
	}
	if !hp.timedOut {
		sc.st.healthTimeouts = 0
	} else if prev.reachable() {
		sc.st.healthTimeouts++
		if sc.st.healthTimeouts < sc.cfg.HealthTimeouts {
			// Tolerated: the engine answered the probe before; keep its
			// phase until HealthTimeouts probes in a row go unanswered.
			sc.log.Warn("engine health probe timed out; the engine still counts as up",
				"reason", hp.reason, "consecutive", sc.st.healthTimeouts, "down_at", sc.cfg.HealthTimeouts)
			sc.m.healthTimeouts.Inc()
			prev.seq = hp.seq
			sc.st.engine = prev
			return
		}
	}
	sc.st.engine = hp
	if hp.reachable() {
		sc.st.everUp = true
	}
	if hp.phase == phaseDown {
		if prev.phase != phaseDown {
			sc.st.capStale = true
		}
		sc.st.win.clear()
		sc.st.app = Signals{}
		sc.setVLLMLocked(SourceStatus{Error: hp.reason, LastSuccess: sc.st.vllm.LastSuccess})
	}
}

func (sc *scraper) setVLLMLocked(s SourceStatus) {
	if sc.st.vllm.OK != s.OK {
		if s.OK {
			sc.log.Info("vllm source recovered")
		} else {
			sc.log.Warn("vllm source failed", "err", s.Error)
		}
	}
	sc.st.vllm = s
	sc.m.sourceUp.WithLabelValues(srcVLLM).Set(boolGauge(s.OK))
}

func (sc *scraper) setDCGMLocked(s SourceStatus) {
	if sc.st.dcgm.OK != s.OK {
		if s.OK {
			sc.log.Info("dcgm source recovered")
		} else {
			sc.log.Warn("dcgm source failed", "err", s.Error)
		}
	}
	sc.st.dcgm = s
	sc.m.sourceUp.WithLabelValues(srcDCGM).Set(boolGauge(s.OK))
}

func (sc *scraper) applyVLLMLocked(now time.Time, s VLLMSample, err error) {
	if sc.st.engine.phase == phaseDown {
		return // applyHealthLocked has cleared the application signals
	}
	if err != nil {
		sc.st.win.clear()
		sc.st.app = Signals{}
		sc.setVLLMLocked(SourceStatus{Error: err.Error(), LastSuccess: sc.st.vllm.LastSuccess})
		return
	}
	if n := len(s.Invalid); n > 0 {
		sc.m.invalidValues.WithLabelValues(srcVLLM).Add(float64(n))
	}
	if sc.st.win.add(now, s) {
		sc.m.windowRestarts.Inc()
		// Counters going backwards mean a new engine process, which may
		// serve another --max-model-len: read /v1/models again.
		sc.st.capStale = true
		sc.log.Info("vllm counters went backwards (engine restarted); signal window restarted")
	}
	sc.st.app = sc.st.win.derive()
	if sc.st.capability.Model == "" && s.Model != "" {
		sc.st.capability.Model = s.Model // until /v1/models answers
	}
	sc.setVLLMLocked(SourceStatus{OK: true, Error: invalids(s.Invalid).String(), LastSuccess: now})
}

func (sc *scraper) applyModelsLocked(ms ModelsSample, err error) {
	if err != nil {
		if msg := err.Error(); msg != sc.st.modelsErr {
			sc.st.modelsErr = msg
			sc.log.Warn("reading /v1/models failed", "err", msg)
		}
		return
	}
	if n := len(ms.Invalid); n > 0 {
		sc.m.invalidValues.WithLabelValues(srcModels).Add(float64(n))
		sc.log.Warn("dropped invalid values from /v1/models", "invalid", invalids(ms.Invalid).String())
	}
	if ms.Capability != sc.st.capability {
		sc.log.Info("engine capability", "model", ms.Model, "max_model_len", ms.MaxModelLen)
	}
	sc.st.modelsErr = ""
	sc.st.capability = ms.Capability
	sc.st.capStale = false
	sc.st.modelsAt = sc.clock.Now()
}

func (sc *scraper) applyHardwareLocked(now time.Time, hw HardwareSample, err error) {
	if err != nil {
		sc.st.hw = HardwareSample{}
		sc.setDCGMLocked(SourceStatus{Error: err.Error(), LastSuccess: sc.st.dcgm.LastSuccess})
		return
	}
	if n := len(hw.Invalid); n > 0 {
		sc.m.invalidValues.WithLabelValues(srcDCGM).Add(float64(n))
	}
	sc.st.hw = hw
	sc.setDCGMLocked(SourceStatus{OK: true, Error: invalids(hw.Invalid).String(), LastSuccess: now})
}

// recomputeLocked derives the lifecycle state and reports whether a
// heartbeat should go out now: the state changed, or a source came or went.
func (sc *scraper) recomputeLocked() (kick bool) {
	inGrace := sc.cfg.StartupGrace > 0 && !sc.st.everUp && sc.clock.Since(sc.startedAt) < sc.cfg.StartupGrace
	st, reason := observedState(sc.st.engine, sc.st.draining, sc.st.stopping, inGrace)
	if st != sc.st.lifecycle {
		sc.log.Info("lifecycle state changed", "from", stateName(sc.st.lifecycle), "to", stateName(st), "reason", reason)
		sc.m.state.WithLabelValues(stateName(sc.st.lifecycle)).Set(0)
		kick = true
	}
	sc.m.state.WithLabelValues(stateName(st)).Set(1)
	sc.st.lifecycle, sc.st.reason = st, reason
	flipped := sc.sourcesFlippedLocked() // always: it records what was seen
	return kick || flipped
}

// sourcesFlippedLocked reports whether a source's ok changed since the last
// call.
func (sc *scraper) sourcesFlippedLocked() bool {
	v, d := sc.st.vllm.OK, sc.st.dcgm.OK
	flipped := v != sc.st.lastVLLMOK || d != sc.st.lastDCGMOK
	sc.st.lastVLLMOK, sc.st.lastDCGMOK = v, d
	return flipped
}

// watchLoop keeps a plain TCP connection open to the engine's port while
// the engine is reachable. vLLM never writes on it, so a read returns only
// when the connection ends: EOF or RST when the engine process dies (the
// kernel closes its sockets), or an idle close by the server. Either way the
// watcher probes /health at once, on its own goroutine so that a slow scrape
// round cannot delay it; the probe tells death from an idle close. Then it
// watches again if probeNow allows, else waits to be re-armed by a scrape
// tick that finds the engine reachable.
func (sc *scraper) watchLoop(ctx context.Context) {
	d := net.Dialer{Timeout: sc.cfg.ScrapeTimeout, KeepAlive: 15 * time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-sc.rearm:
		}
		for rewatch := true; rewatch; {
			sc.watching.Store(true)
			event := sc.watchOnce(ctx, &d)
			sc.watching.Store(false)
			if ctx.Err() != nil {
				return
			}
			sc.m.engineEvents.WithLabelValues(event).Inc()
			sc.log.Debug("engine connection ended; probing health", "event", event)
			rewatch = sc.probeNow(ctx)
		}
	}
}

// watchOnce dials the engine and blocks until the connection ends.
func (sc *scraper) watchOnce(ctx context.Context, d *net.Dialer) string {
	conn, err := d.DialContext(ctx, "tcp", sc.engineAddr)
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

// stateName is the short name of a lifecycle state, e.g. READY.
func stateName(s isobarpb.LifecycleState) string {
	const prefix = "LIFECYCLE_STATE_"
	n := s.String()
	if len(n) > len(prefix) && n[:len(prefix)] == prefix {
		return n[len(prefix):]
	}
	return n
}
