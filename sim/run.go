package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
)

// Defaults of the process configurations.
const (
	// DefaultEngineListen is vLLM's default port, on loopback.
	DefaultEngineListen = "127.0.0.1:8000"
	// DefaultDCGMListen is dcgm-exporter's default port, on loopback.
	DefaultDCGMListen = "127.0.0.1:9400"
	// DefaultShutdownTimeout bounds a graceful shutdown.
	DefaultShutdownTimeout = 10 * time.Second
)

// EngineProcessConfig configures `isobar sim engine`: one engine, its
// exporter and, optionally, the admin API.
type EngineProcessConfig struct {
	// Listen is the engine API address. Default DefaultEngineListen.
	Listen string
	// DCGMListen is the exporter address; "" runs no exporter.
	DCGMListen string
	// AdminListen is the admin API address; "" disables the admin API.
	AdminListen string
	// AdminTokenFile holds the admin bearer token (surrounding whitespace
	// is trimmed). Required with AdminListen.
	AdminTokenFile string
	// ExitOnKill makes a kill end RunEngine with ErrKilled (the command
	// exits with status 137, like a SIGKILLed process).
	ExitOnKill bool
	// ShutdownTimeout bounds the graceful shutdown. Default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Engine and DCGM configure the parts.
	Engine EngineConfig
	DCGM   DCGMConfig
}

// ReadTokenFile reads a bearer token from path, trimming whitespace, and
// checks its length.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("sim: admin token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < MinAdminTokenLen {
		return "", fmt.Errorf("sim: admin token file %s: token must be at least %d characters", path, MinAdminTokenLen)
	}
	return tok, nil
}

func listen(what, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sim: %s listen on %q: %w", what, addr, err)
	}
	return ln, nil
}

// RunEngine runs one engine (plus exporter and admin API as configured)
// until ctx is done, then shuts down gracefully. With ExitOnKill it returns
// ErrKilled as soon as the engine is killed.
func RunEngine(ctx context.Context, cfg EngineProcessConfig, deps Deps) error {
	deps = deps.withDefaults()
	if cfg.Listen == "" {
		cfg.Listen = DefaultEngineListen
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	p, err := openEngineProcess(cfg, deps)
	if err != nil {
		return err
	}
	if err := p.eng.Start(p.engLn); err != nil {
		p.closeListeners()
		return err
	}
	if p.dcgm != nil {
		if err := p.dcgm.Start(p.dcgmLn); err != nil {
			p.closeListeners()
			_ = p.eng.Stop(ctx)
			return err
		}
	}
	deps.Logger.Info("sim engine process running", "engine", cfg.Listen, "dcgm", cfg.DCGMListen, "admin", cfg.AdminListen)
	runErr := p.serve(ctx, cfg)
	stopErr := p.stop(cfg, errors.Is(runErr, ErrKilled))
	if runErr != nil {
		return runErr
	}
	return stopErr
}

// engineProcess is what RunEngine opens: the engine, the exporter and the
// admin server, each with its listener (nil when not configured).
type engineProcess struct {
	lns      []net.Listener
	eng      *Engine
	engLn    net.Listener
	dcgm     *DCGMExporter
	dcgmLn   net.Listener
	adminSrv *http.Server
	adminLn  net.Listener
}

func (p *engineProcess) closeListeners() {
	for _, l := range p.lns {
		_ = l.Close()
	}
}

// openEngineProcess builds the parts and opens their listeners; on error
// it closes what it opened.
func openEngineProcess(cfg EngineProcessConfig, deps Deps) (*engineProcess, error) {
	var token string
	if cfg.AdminListen != "" {
		if cfg.AdminTokenFile == "" {
			return nil, errors.New("sim: an admin listen address needs an admin token file")
		}
		var err error
		if token, err = ReadTokenFile(cfg.AdminTokenFile); err != nil {
			return nil, err
		}
	}
	eng, err := NewEngine(cfg.Engine, deps)
	if err != nil {
		return nil, err
	}
	p := &engineProcess{eng: eng}
	if p.engLn, err = listen("engine", cfg.Listen); err != nil {
		return nil, err
	}
	p.lns = append(p.lns, p.engLn)
	if cfg.DCGMListen != "" {
		if p.dcgmLn, err = listen("dcgm exporter", cfg.DCGMListen); err != nil {
			p.closeListeners()
			return nil, err
		}
		p.lns = append(p.lns, p.dcgmLn)
		p.dcgm = NewDCGMExporter(cfg.DCGM, deps, eng.GPU())
	}
	if cfg.AdminListen != "" {
		admin, err := NewAdminHandler(AdminConfig{Token: token}, deps, eng, p.dcgm)
		if err != nil {
			p.closeListeners()
			return nil, err
		}
		if p.adminLn, err = listen("admin", cfg.AdminListen); err != nil {
			p.closeListeners()
			return nil, err
		}
		p.adminSrv = &http.Server{Handler: admin, ReadHeaderTimeout: 30 * time.Second,
			ErrorLog: slog.NewLogLogger(deps.Logger.Handler(), slog.LevelDebug)}
	}
	return p, nil
}

// serve runs until ctx is done or, with ExitOnKill, the engine is killed
// (ErrKilled); the admin server shuts down with it.
func (p *engineProcess) serve(ctx context.Context, cfg EngineProcessConfig) error {
	g, gctx := errgroup.WithContext(ctx)
	killed := p.eng.Killed()
	g.Go(func() error {
		if !cfg.ExitOnKill {
			killed = nil // a kill leaves the process up for a restart
		}
		select {
		case <-killed:
			return ErrKilled
		case <-gctx.Done():
			return nil
		}
	})
	if p.adminSrv != nil {
		g.Go(func() error {
			if err := p.adminSrv.Serve(p.adminLn); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("sim: admin server: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, scancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
			defer scancel()
			if p.adminSrv.Shutdown(sctx) != nil {
				_ = p.adminSrv.Close()
			}
			return nil
		})
	}
	return g.Wait()
}

// stop shuts the engine and the exporter down within the shutdown timeout,
// or at once after a kill, and returns the first shutdown error.
func (p *engineProcess) stop(cfg EngineProcessConfig, killed bool) error {
	sctx, scancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer scancel()
	if killed {
		var cancel context.CancelFunc
		sctx, cancel = context.WithCancel(context.Background())
		cancel() // a killed process does not linger: close at once
	}
	var stopErr error
	if err := p.eng.Stop(sctx); err != nil && !errors.Is(err, context.Canceled) {
		stopErr = fmt.Errorf("sim: engine shutdown: %w", err)
	}
	if p.dcgm != nil {
		if err := p.dcgm.Stop(sctx); err != nil && !errors.Is(err, context.Canceled) && stopErr == nil {
			stopErr = fmt.Errorf("sim: dcgm exporter shutdown: %w", err)
		}
	}
	return stopErr
}

// DCGMProcessConfig configures `isobar sim dcgm`: an exporter of idle
// synthetic GPUs.
type DCGMProcessConfig struct {
	// Listen is the exporter address. Default DefaultDCGMListen.
	Listen string
	// GPUs is the number of GPUs served, 1–64. Default 1.
	GPUs int
	// Seed makes the GPUs' UUIDs distinct between nodes.
	Seed int64
	// ShutdownTimeout bounds the graceful shutdown.
	ShutdownTimeout time.Duration
	DCGM            DCGMConfig
}

// RunDCGM serves idle synthetic GPUs until ctx is done.
func RunDCGM(ctx context.Context, cfg DCGMProcessConfig, deps Deps) error {
	deps = deps.withDefaults()
	if cfg.Listen == "" {
		cfg.Listen = DefaultDCGMListen
	}
	if cfg.GPUs == 0 {
		cfg.GPUs = 1
	}
	if cfg.GPUs < 1 || cfg.GPUs > 64 {
		return fmt.Errorf("sim: DCGMProcessConfig.GPUs %d: want 1-64", cfg.GPUs)
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	x := NewDCGMExporter(cfg.DCGM, deps)
	for i := 0; i < cfg.GPUs; i++ {
		g, err := NewGPU(GPUConfig{Info: GPUInfo{Index: i}, Seed: cfg.Seed}, deps.Clock)
		if err != nil {
			return err
		}
		x.AddGPU(g)
	}
	ln, err := listen("dcgm exporter", cfg.Listen)
	if err != nil {
		return err
	}
	if err := x.Start(ln); err != nil {
		_ = ln.Close()
		return err
	}
	deps.Logger.Info("sim dcgm exporter running", "addr", x.Addr(), "gpus", cfg.GPUs)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return x.Stop(sctx)
}
