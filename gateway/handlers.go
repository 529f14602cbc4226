package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/isobar-mesh/isobar/internal/promreg"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// modelList is the OpenAI /v1/models shape, with vLLM's max_model_len.
type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

type modelEntry struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen uint32 `json:"max_model_len,omitempty"`
}

// handleModels lists the models the routes serve.
func (g *Gateway) handleModels(w http.ResponseWriter, _ *http.Request) {
	out := modelList{Object: "list", Data: []modelEntry{}}
	if t := g.Table(); t != nil {
		for _, m := range t.Models {
			out.Data = append(out.Data, modelEntry{ID: m.Name, Object: "model", OwnedBy: "isobar", MaxModelLen: m.MaxModelLen})
		}
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// handleHealth answers 200 once routes, clusters and endpoints have been
// received (Table.Ready), 503 before.
func (g *Gateway) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if !g.Table().Ready() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"waiting for configuration"}` + "\n"))
		return
	}
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// Run is the composition root of `isobar gateway`: it serves on
// cfg.Listen (and /metrics on cfg.MetricsListen when set) until ctx ends,
// then stops gracefully. A nil deps.Registerer gets a fresh registry with
// the Go and process collectors, served on /metrics.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if deps.Registerer == nil {
		reg, err := promreg.NewRuntime()
		if err != nil {
			return fmt.Errorf("gateway: register runtime metrics: %w", err)
		}
		deps.Registerer, deps.Gatherer = reg, reg
	}
	g, err := New(cfg, deps)
	if err != nil {
		return err
	}
	cfg = g.cfg
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: listen %s: %w", cfg.Listen, err)
	}
	var msrv *http.Server
	msrvDone := make(chan struct{})
	if cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("gateway: listen %s: %w", cfg.MetricsListen, err)
		}
		mux := http.NewServeMux()
		if deps.Gatherer != nil {
			mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{}))
		}
		msrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			defer close(msrvDone)
			if err := msrv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				g.log.Error("metrics server failed", "err", err)
			}
		}()
	} else {
		close(msrvDone)
	}
	if err := g.Start(ctx, ln); err != nil {
		ln.Close()
		if msrv != nil {
			_ = msrv.Close()
		}
		<-msrvDone
		return err
	}
	<-ctx.Done()
	g.Stop()
	if msrv != nil {
		_ = msrv.Close()
	}
	<-msrvDone
	return nil
}
