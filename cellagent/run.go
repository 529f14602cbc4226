package cellagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/internal/promreg"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Run is the composition root of `isobar cellagent`: it builds the agent,
// serves /metrics on cfg.MetricsListen when set, and runs until ctx ends;
// then it stops the agent (final TERMINATED heartbeat) and the metrics
// server. When MetricsListen is set and deps.Registerer is nil, Run creates
// a registry with the Go and process collectors.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	var gatherer prometheus.Gatherer
	if cfg.MetricsListen != "" {
		if deps.Registerer == nil {
			reg, err := promreg.NewRuntime()
			if err != nil {
				return fmt.Errorf("cellagent: register metrics: %w", err)
			}
			deps.Registerer = reg
		}
		g, ok := deps.Registerer.(prometheus.Gatherer)
		if !ok {
			return fieldErr("MetricsListen", "set, but Deps.Registerer is not a prometheus.Gatherer to serve")
		}
		gatherer = g
	}
	a, err := NewAgent(cfg, deps)
	if err != nil {
		return err
	}
	var srv *http.Server
	srvDone := make(chan error, 1)
	if gatherer != nil {
		ln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			a.Stop()
			return fmt.Errorf("cellagent: metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { srvDone <- srv.Serve(ln) }()
		a.log.Info("serving metrics", "addr", ln.Addr().String())
	}
	if err := a.Start(ctx); err != nil {
		if srv != nil {
			_ = srv.Close()
			<-srvDone
		}
		return err
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-srvDone:
	}
	a.Stop()
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if serveErr == nil {
			serveErr = <-srvDone
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("cellagent: metrics server: %w", serveErr)
	}
	return nil
}
