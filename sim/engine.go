package sim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/reqclass"
)

// Defaults of EngineConfig.
const (
	// DefaultModel is the served model name: a public 4-bit AWQ build of
	// Llama 3.1 70B Instruct, the model class the default profile simulates.
	DefaultModel = "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
	// DefaultMaxModelLen is the context length the engine serves and
	// advertises in /v1/models.
	DefaultMaxModelLen = 32768
	// DefaultMaxBodyBytes caps request bodies; larger ones get HTTP 413.
	DefaultMaxBodyBytes = 16 << 20
)

// Errors of the engine lifecycle; check with errors.Is.
var (
	// ErrKilled: the engine was killed (returned by RunEngine when
	// EngineProcessConfig.ExitOnKill is set).
	ErrKilled = errors.New("sim: engine killed")
	// ErrStopped: the engine was stopped and cannot be started again.
	ErrStopped = errors.New("sim: engine stopped")
	// ErrAlreadyStarted: Start was called twice.
	ErrAlreadyStarted = errors.New("sim: engine already started")
	// ErrNotStarted: the operation needs a started engine.
	ErrNotStarted = errors.New("sim: engine not started")
)

// EngineConfig holds an engine's values. Zero fields take the documented
// defaults.
type EngineConfig struct {
	// Name identifies the engine in logs and in the const label engine of
	// the isobar_sim_* metrics. Default "gpu<GPUIndex>".
	Name string
	// Model is the served model name. Default DefaultModel.
	Model string
	// MaxModelLen is the context length (prompt + max_tokens) the engine
	// accepts and advertises. Default DefaultMaxModelLen; it must fit the
	// profile's KV cache, as vLLM refuses to start otherwise.
	MaxModelLen int
	// Profile names a built-in timing profile. Default DefaultProfile.
	Profile string
	// CustomProfile, when set, replaces the named profile.
	CustomProfile *Profile
	// TimeScale multiplies every model duration: profile step costs,
	// frontend latency, StartupDelay, slow starts, fault lead times and the
	// GPU's time constants. 0.05 runs 20x faster than real time. Default 1.
	TimeScale float64
	// Seed seeds the engine's random choices (error injection, response
	// ids) and the default GPU UUID. Default 0. A request's frontend
	// latency is drawn from its body instead (see frontendDelay), so it is
	// the same on every engine.
	Seed int64
	// GPUIndex is the simulated GPU's index (dcgm-exporter label gpu).
	GPUIndex int
	// GPUUUID overrides the GPU's UUID (default derived from Name, Seed
	// and GPUIndex).
	GPUUUID string
	// PCIBusID overrides the GPU's PCI bus id.
	PCIBusID string
	// StartupDelay is how long (model time) the engine stays Loading after
	// Start. Default 0: ready at once.
	StartupDelay time.Duration
	// MaxBodyBytes caps request bodies (HTTP 413 beyond). Default
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// DisablePrefixCaching turns automatic prefix caching off (vLLM's
	// --no-enable-prefix-caching): sequences are added without block
	// hashes, so nothing is reused and vllm:prefix_cache_* stay at 0.
	// Default false: on, as in vLLM v1.
	DisablePrefixCaching bool
}

func (c EngineConfig) withDefaults() EngineConfig {
	if c.Name == "" {
		c.Name = fmt.Sprintf("gpu%d", c.GPUIndex)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = DefaultMaxModelLen
	}
	if c.Profile == "" {
		c.Profile = DefaultProfile
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return c
}

// Validate applies the defaults and reports the first unusable field.
func (c EngineConfig) Validate() error {
	_, err := c.withDefaults().validate()
	return err
}

// validate checks the config (after withDefaults) and resolves the profile.
func (c EngineConfig) validate() (Profile, error) {
	var p Profile
	if c.CustomProfile != nil {
		p = *c.CustomProfile
	} else {
		var err error
		if p, err = LookupProfile(c.Profile); err != nil {
			return Profile{}, fmt.Errorf("sim: EngineConfig.Profile: %w", err)
		}
	}
	if err := p.Validate(); err != nil {
		return Profile{}, fmt.Errorf("sim: EngineConfig profile: %w", err)
	}
	switch {
	case !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0):
		return Profile{}, fmt.Errorf("sim: EngineConfig.TimeScale %v: must be a positive number (1 is real time)", c.TimeScale)
	case c.MaxModelLen < 2:
		return Profile{}, fmt.Errorf("sim: EngineConfig.MaxModelLen %d: must be at least 2", c.MaxModelLen)
	case c.MaxModelLen > p.KVCacheTokens:
		return Profile{}, fmt.Errorf("sim: EngineConfig.MaxModelLen %d exceeds the KV cache of profile %q (%d tokens): lower MaxModelLen", c.MaxModelLen, p.Name, p.KVCacheTokens)
	case c.GPUIndex < 0:
		return Profile{}, fmt.Errorf("sim: EngineConfig.GPUIndex %d: must be >= 0", c.GPUIndex)
	case c.StartupDelay < 0:
		return Profile{}, fmt.Errorf("sim: EngineConfig.StartupDelay %v: must be >= 0", c.StartupDelay)
	case c.MaxBodyBytes < 1024:
		return Profile{}, fmt.Errorf("sim: EngineConfig.MaxBodyBytes %d: must be at least 1024", c.MaxBodyBytes)
	}
	return p, nil
}

// Deps are an engine's (and the exporter's and admin's) collaborators.
type Deps struct {
	// Clock drives every timer and timestamp. Nil: the real clock.
	Clock clockwork.Clock
	// Logger receives structured logs. Nil: logs are discarded.
	Logger *slog.Logger
	// Registerer receives the simulator's own isobar_sim_* metrics (not the
	// vLLM-compatible ones, which each engine serves from a registry of its
	// own). Nil: those metrics are not registered.
	Registerer prometheus.Registerer
}

func (d Deps) withDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return d
}

// EngineState is the lifecycle state of an Engine.
type EngineState int

// Engine states.
const (
	StateNew     EngineState = iota // constructed, not started
	StateRunning                    // serving (possibly Loading or hung)
	StateKilled                     // killed; Restart brings it back
	StateStopped                    // stopped for good
)

func (s EngineState) String() string {
	switch s {
	case StateNew:
		return "new"
	case StateRunning:
		return "running"
	case StateKilled:
		return "killed"
	case StateStopped:
		return "stopped"
	}
	return fmt.Sprintf("EngineState(%d)", int(s))
}

// Engine is a simulated vLLM engine: an OpenAI-compatible HTTP API backed
// by the continuous-batching timing model, vLLM's /metrics, and a simulated
// GPU. See the package documentation for the concurrency model.
type Engine struct {
	cfg   EngineConfig
	prof  Profile
	clock clockwork.Clock
	log   *slog.Logger
	m     *metrics
	gpu   *GPU

	life sync.Mutex // serialises Start, Kill, Restart and Stop

	mu           sync.Mutex // guards the fields below
	state        EngineState
	addr         string
	inst         *instance
	hung         bool
	unhang       chan struct{} // closed when the hang is lifted
	loadingUntil time.Time
	maxLen       int  // enforced max_model_len
	advertise    bool // whether /v1/models reports maxLen (else cfg.MaxModelLen)
	errRate      float64
	errStatus    int
	rng          *rand.Rand
	killed       chan struct{} // closed by the first Kill
	// tenantReqs counts the generate requests that reached the engine by
	// tenant (xdscontract.TenantHeader, bucketed by tenants), across
	// restarts.
	tenantReqs map[string]int64
	tenants    *reqclass.Tenants
}

// NewEngine validates cfg and returns an engine that is not yet serving.
func NewEngine(cfg EngineConfig, deps Deps) (*Engine, error) {
	cfg = cfg.withDefaults()
	p, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	deps = deps.withDefaults()
	var reg prometheus.Registerer
	if deps.Registerer != nil {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"engine": cfg.Name}, deps.Registerer)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("sim: engine %q: registering metrics: %w", cfg.Name, err)
	}
	// The default UUID depends on the name too, so that engines of one
	// process with equal seeds and GPU indexes differ.
	h := fnv.New64a()
	_, _ = h.Write([]byte(cfg.Name))
	gpu, err := NewGPU(GPUConfig{
		Info:      GPUInfo{Index: cfg.GPUIndex, UUID: cfg.GPUUUID, PCIBusID: cfg.PCIBusID},
		Profile:   p.GPU,
		TimeScale: cfg.TimeScale,
		Seed:      cfg.Seed ^ int64(h.Sum64()),
	}, deps.Clock)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:        cfg,
		prof:       p,
		clock:      deps.Clock,
		log:        deps.Logger.With("engine", cfg.Name),
		m:          m,
		gpu:        gpu,
		maxLen:     cfg.MaxModelLen,
		advertise:  true,
		errStatus:  DefaultErrorStatus,
		rng:        rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed)),
		killed:     make(chan struct{}),
		tenantReqs: map[string]int64{},
		tenants:    reqclass.NewTenants(reqclass.DefaultMaxTenants),
	}
	return e, nil
}

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() EngineConfig { return e.cfg }

// Profile returns the engine's timing profile.
func (e *Engine) Profile() Profile { return e.prof }

// GPU returns the engine's simulated GPU, for a DCGM exporter and for
// hardware faults.
func (e *Engine) GPU() *GPU { return e.gpu }

func (e *Engine) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * e.cfg.TimeScale)
}

// Start serves the API on ln and returns at once. The engine owns ln from
// then on. It fails on a second call.
func (e *Engine) Start(ln net.Listener) error {
	if ln == nil {
		return errors.New("sim: Engine.Start: nil listener")
	}
	e.life.Lock()
	defer e.life.Unlock()
	e.mu.Lock()
	st := e.state
	e.mu.Unlock()
	if st != StateNew {
		if st == StateStopped {
			return ErrStopped
		}
		return ErrAlreadyStarted
	}
	if err := e.startLocked(ln, e.cfg.StartupDelay); err != nil {
		return err
	}
	e.log.Info("engine started", "addr", ln.Addr().String(), "model", e.cfg.Model, "profile", e.prof.Name)
	return nil
}

// startLocked starts a fresh incarnation on ln; the caller holds e.life.
// It fails, closing ln and changing nothing, only if the incarnation's
// metrics do not register.
func (e *Engine) startLocked(ln net.Listener, loading time.Duration) error {
	now := e.clock.Now()
	d := e.scaled(loading)
	inst, err := newInstance(e, ln)
	if err != nil {
		_ = ln.Close()
		return err
	}
	e.mu.Lock()
	e.addr = ln.Addr().String()
	e.loadingUntil = now.Add(d)
	e.hung = false
	e.unhang = nil
	e.state = StateRunning
	e.mu.Unlock()
	e.gpu.SetProcess(ProcessLoading, d)
	e.mu.Lock()
	e.inst = inst
	e.mu.Unlock()
	inst.start()
	return nil
}

// Addr returns the API's host:port ("" before Start).
func (e *Engine) Addr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// State returns the lifecycle state.
func (e *Engine) State() EngineState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// Ready reports whether the engine is running, not Loading and not hung.
func (e *Engine) Ready() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state == StateRunning && !e.hung && !e.clock.Now().Before(e.loadingUntil)
}

// Kill simulates SIGKILL of the engine process: the listener and every open
// connection close at once and all in-flight work and state are dropped. It
// returns when everything the incarnation ran has exited. A no-op unless
// the engine is running.
func (e *Engine) Kill() {
	e.life.Lock()
	defer e.life.Unlock()
	if e.killLocked(true) {
		e.m.kills.Inc()
		e.log.Warn("engine killed")
	}
}

// Killed returns a channel closed by the first Kill (Restart's implicit
// kill of a running engine does not count).
func (e *Engine) Killed() <-chan struct{} { return e.killed }

func (e *Engine) killLocked(explicit bool) bool {
	e.mu.Lock()
	inst := e.inst
	if e.state != StateRunning || inst == nil {
		e.mu.Unlock()
		return false
	}
	e.state = StateKilled
	e.inst = nil
	// Requests held by a hang end with the incarnation's context, after the
	// connections are closed; the gate itself never opens.
	e.hung, e.unhang = false, nil
	e.mu.Unlock()
	inst.kill()
	e.gpu.SetProcess(ProcessNone, 0)
	if explicit {
		select {
		case <-e.killed:
		default:
			close(e.killed)
		}
	}
	return true
}

// Restart brings a killed engine back on the same address with fresh state
// and fresh metrics, ready at once. A running engine is killed first.
func (e *Engine) Restart() error { return e.RestartLoading(0) }

// RestartLoading is Restart with a slow start: the new incarnation stays
// Loading for d (model time).
func (e *Engine) RestartLoading(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("sim: restart slow start %v: must be >= 0", d)
	}
	e.life.Lock()
	defer e.life.Unlock()
	e.killLocked(false)
	e.mu.Lock()
	st, addr := e.state, e.addr
	e.mu.Unlock()
	switch st {
	case StateNew:
		return ErrNotStarted
	case StateStopped:
		return ErrStopped
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sim: restart on %s: %w", addr, err)
	}
	if err := e.startLocked(ln, d); err != nil {
		return err
	}
	e.m.restarts.Inc()
	e.log.Info("engine restarted", "addr", addr, "slow_start", d)
	return nil
}

// Stop shuts the engine down for good: it stops accepting, lets in-flight
// requests finish until ctx is done, then closes everything and joins every
// goroutine. A hung engine is closed at once (a hung process ignores
// SIGTERM). Idempotent; returns ctx's error if it had to force the close.
func (e *Engine) Stop(ctx context.Context) error {
	e.life.Lock()
	defer e.life.Unlock()
	e.mu.Lock()
	inst, hung := e.inst, e.hung
	prev := e.state
	e.state = StateStopped
	e.inst = nil
	e.hung, e.unhang = false, nil
	e.mu.Unlock()
	if prev == StateStopped || inst == nil {
		return nil
	}
	var err error
	if hung {
		inst.kill()
	} else {
		err = inst.shutdown(ctx)
	}
	e.gpu.SetProcess(ProcessNone, 0)
	e.log.Info("engine stopped")
	return err
}

// EngineStats is a snapshot of the scheduler for tests and status views.
type EngineStats struct {
	Running, Waiting int
	KVUsage          float64
	// GeneratedTokens counts output tokens since the current incarnation
	// started.
	GeneratedTokens int64
	// PrefixQueries and PrefixHits are the current incarnation's
	// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total
	// (prompt tokens looked up in the prefix cache, and found there).
	PrefixQueries, PrefixHits int64
}

// current returns the running incarnation, or nil.
func (e *Engine) current() *instance {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inst
}

// Stats returns the current incarnation's scheduler snapshot (zero when not
// running).
func (e *Engine) Stats() EngineStats {
	inst := e.current()
	if inst == nil {
		return EngineStats{}
	}
	return inst.sched.snapshot()
}

// countTenant counts one generate request that reached the engine for the
// tenant named by header value h (xdscontract.TenantHeader). A request
// naming no tenant, or an unusable one, is not counted; a long name is
// truncated (reqclass.NormalizeTenant) and tenants beyond
// reqclass.DefaultMaxTenants share reqclass.OtherTenant.
func (e *Engine) countTenant(h string) {
	t, _, bad := reqclass.NormalizeTenant(h)
	if bad || t == reqclass.NoTenant {
		return
	}
	b, _ := e.tenants.Bucket(t)
	e.mu.Lock()
	e.tenantReqs[b]++
	e.mu.Unlock()
}

// TenantRequests returns, by tenant, the generate requests that reached
// the engine since it was created (restarts keep counting): every request
// the engine's /v1/completions or /v1/chat/completions received with a
// tenant header, whatever its answer. At most reqclass.DefaultMaxTenants
// tenants and reqclass.OtherTenant.
func (e *Engine) TenantRequests() map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.tenantReqs)
}
