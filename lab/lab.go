package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/cellagent"
	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/sim"
)

// Config sets the lab's shape. Zero fields take the defaults noted.
type Config struct {
	// Region name. Default "local".
	Region string
	// Cells per region. Default 3.
	Cells int
	// RPS is the mean request rate of the Poisson traffic. Default 3 (one
	// request per second per cell, the published evaluation's load).
	RPS float64
	// PromptTokens and PromptJitter: prompt length ~ uniform in
	// PromptTokens ± PromptJitter. Defaults 512 and 200 (baseline_mixed).
	PromptTokens, PromptJitter int
	// MaxTokens per request. Default 128.
	MaxTokens int
	// MaxInFlight bounds concurrent requests; arrivals beyond it are
	// counted as shed. Default 256.
	MaxInFlight int
	// Duration: run this long then stop; 0 runs until ctx ends.
	Duration time.Duration
	// Report: write the JSON report here when the run ends ("" = none).
	Report string
	// View: redraw the live status table every ViewEvery. Default on when
	// Duration is 0.
	View      bool
	ViewEvery time.Duration
	// Profile and TimeScale of the simulated engines. Defaults: the
	// 70B-AWQ profile in real time.
	Profile   string
	TimeScale float64
	// HeartbeatInterval of the agents and controller. Default 500 ms.
	HeartbeatInterval time.Duration
	// Seed for the traffic. Default 1.
	Seed uint64
}

func (c *Config) withDefaults() {
	if c.Region == "" {
		c.Region = "local"
	}
	if c.Cells == 0 {
		c.Cells = 3
	}
	if c.RPS == 0 {
		c.RPS = 3
	}
	if c.PromptTokens == 0 {
		c.PromptTokens, c.PromptJitter = 512, 200
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = 128
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 256
	}
	if c.ViewEvery == 0 {
		c.ViewEvery = time.Second
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 500 * time.Millisecond
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("lab: invalid config")

func (c Config) validate() error {
	switch {
	case c.Cells < 1 || c.Cells > 64:
		return fmt.Errorf("%w: --cells %d: want 1..64", ErrInvalidConfig, c.Cells)
	case c.RPS < 0 || c.RPS > 10000:
		return fmt.Errorf("%w: --rps %v: want 0..10000", ErrInvalidConfig, c.RPS)
	case c.Duration < 0:
		return fmt.Errorf("%w: --duration must be >= 0", ErrInvalidConfig)
	case c.PromptTokens < 1 || c.PromptJitter < 0 || c.PromptJitter >= c.PromptTokens:
		return fmt.Errorf("%w: prompt tokens %d ± %d: want jitter < tokens", ErrInvalidConfig, c.PromptTokens, c.PromptJitter)
	case c.MaxTokens < 1:
		return fmt.Errorf("%w: max tokens must be >= 1", ErrInvalidConfig)
	case c.TimeScale <= 0:
		return fmt.Errorf("%w: --time-scale must be > 0", ErrInvalidConfig)
	}
	return nil
}

// Deps are the lab's collaborators.
type Deps struct {
	Logger *slog.Logger
	// Out receives the live view. Default os.Stdout.
	Out   io.Writer
	Clock clockwork.Clock
}

// Lab is a running fleet.
type Lab struct {
	cfg     Config
	log     *slog.Logger
	ctrl    *regional.Controller
	engines []*sim.Engine
	dcgm    *sim.DCGMExporter
	agents  []*cellagent.Agent
	watch   *gateway.Watcher
	traffic *traffic
	stops   []func()
}

// Run starts a lab, drives traffic until the duration elapses or ctx ends,
// writes the report and shuts everything down.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Out == nil {
		deps.Out = os.Stdout
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	l, err := Start(ctx, cfg, deps)
	if err != nil {
		return err
	}
	defer l.Stop()
	runCtx := ctx
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	view := cfg.View || cfg.Duration == 0
	tick := deps.Clock.NewTicker(cfg.ViewEvery)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-runCtx.Done():
			done = true
		case <-tick.Chan():
			if view {
				l.render(deps.Out)
			}
		}
	}
	l.traffic.stop()
	rep := l.Report()
	if view {
		l.render(deps.Out)
	}
	if cfg.Report != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.Report, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("lab: write report: %w", err)
		}
	}
	return nil
}

// Start builds and starts every component and the traffic driver; the
// caller must Stop it.
func Start(ctx context.Context, cfg Config, deps Deps) (_ *Lab, err error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	l := &Lab{cfg: cfg, log: deps.Logger}
	defer func() {
		if err != nil {
			l.Stop()
		}
	}()
	insecureDial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}

	rcfg := regional.DefaultConfig(cfg.Region)
	rcfg.HeartbeatInterval = cfg.HeartbeatInterval
	rcfg.TTLGrace = cfg.HeartbeatInterval
	rcfg.HTTPListen = "127.0.0.1:0"
	rcfg.Listen = "127.0.0.1:0"
	l.ctrl, err = regional.New(rcfg, regional.Deps{Logger: deps.Logger.With("component", "regional")})
	if err != nil {
		return nil, err
	}
	if err := l.ctrl.Start(ctx); err != nil {
		return nil, err
	}
	l.stops = append(l.stops, l.ctrl.Stop)

	l.dcgm = sim.NewDCGMExporter(sim.DCGMConfig{Hostname: cfg.Region + "-node"}, sim.Deps{})
	for i := range cfg.Cells {
		name := fmt.Sprintf("%s-cell-%d", cfg.Region, i)
		eng, err := sim.NewEngine(sim.EngineConfig{
			Name: name, Profile: cfg.Profile, TimeScale: cfg.TimeScale, GPUIndex: i, Seed: int64(i),
		}, sim.Deps{Logger: deps.Logger.With("component", "sim", "cell", name)})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		if err := eng.Start(ln); err != nil {
			return nil, err
		}
		l.stops = append(l.stops, func() { stopCtx(eng.Stop) })
		l.engines = append(l.engines, eng)
		l.dcgm.AddGPU(eng.GPU())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	if err := l.dcgm.Start(ln); err != nil {
		return nil, err
	}
	l.stops = append(l.stops, func() { stopCtx(l.dcgm.Stop) })

	for i, eng := range l.engines {
		ag, err := cellagent.NewAgent(cellagent.Config{
			CellID: eng.Config().Name, Region: cfg.Region, ControllerAddr: l.ctrl.Addr(),
			VLLMURL: "http://" + eng.Addr() + "/metrics", DCGMURL: "http://" + l.dcgm.Addr() + "/metrics",
			DCGMGPU: fmt.Sprint(i), Interval: cfg.HeartbeatInterval,
		}, cellagent.Deps{Logger: deps.Logger.With("component", "cellagent"), DialOptions: insecureDial})
		if err != nil {
			return nil, err
		}
		if err := ag.Start(ctx); err != nil {
			return nil, err
		}
		l.stops = append(l.stops, ag.Stop)
		l.agents = append(l.agents, ag)
	}

	l.watch, err = gateway.NewWatcher(gateway.WatchConfig{Server: l.ctrl.Addr(), NodeID: "lab-traffic"},
		gateway.WatchDeps{Logger: deps.Logger.With("component", "watch"), DialOptions: insecureDial})
	if err != nil {
		return nil, err
	}
	if err := l.watch.Start(ctx); err != nil {
		return nil, err
	}
	l.stops = append(l.stops, l.watch.Stop)

	l.traffic = newTraffic(cfg, l.watch, deps.Clock, deps.Logger)
	l.traffic.start(ctx)
	l.stops = append(l.stops, l.traffic.stop)
	return l, nil
}

// Stop shuts everything down in reverse start order. Idempotent.
func (l *Lab) Stop() {
	for i := len(l.stops) - 1; i >= 0; i-- {
		l.stops[i]()
	}
	l.stops = nil
}

// Controller is the lab's regional controller (tests, chaos).
func (l *Lab) Controller() *regional.Controller { return l.ctrl }

// Engines are the simulated engines, in cell order.
func (l *Lab) Engines() []*sim.Engine { return l.engines }

func stopCtx(stop func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = stop(ctx)
}
