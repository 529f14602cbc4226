package sim

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/internal/eventually"
)

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln := listenLoopback(t)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func writeToken(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunEngineExitOnKill(t *testing.T) {
	t.Parallel()
	cfg := EngineProcessConfig{
		Listen:         freeAddr(t),
		DCGMListen:     freeAddr(t),
		AdminListen:    freeAddr(t),
		AdminTokenFile: writeToken(t, testToken),
		ExitOnKill:     true,
		Engine:         tinyConfig(),
	}
	errc := make(chan error, 1)
	go func() { errc <- RunEngine(context.Background(), cfg, Deps{Logger: testLogger(t)}) }()
	c := newClient(t)
	eventually.True(t, pollTimeout, "engine healthy", func() bool {
		r, err := c.Get("http://" + cfg.Listen + "/health")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	})
	mfs := scrape(t, c, "http://"+cfg.DCGMListen+"/metrics")
	if _, ok := mfs["DCGM_FI_DEV_GPU_UTIL"]; !ok {
		t.Fatal("exporter serves no GPU")
	}
	// A restart is not a kill; the kill after it ends the process.
	for _, f := range []string{`{"fault":"restart"}`, `{"fault":"kill"}`} {
		resp, body := adminDo(t, c, "http://"+cfg.AdminListen, http.MethodPost, testToken, f)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", f, resp.StatusCode, body)
		}
		if f == `{"fault":"restart"}` {
			if resp, _ := get(t, c, "http://"+cfg.Listen+"/health"); resp.StatusCode != 200 {
				t.Fatalf("health after restart: %d", resp.StatusCode)
			}
			select {
			case err := <-errc:
				t.Fatalf("RunEngine returned %v after a restart", err)
			default:
			}
		}
	}
	if err := <-errc; !errors.Is(err, ErrKilled) {
		t.Fatalf("RunEngine = %v, want ErrKilled", err)
	}
}

func TestRunEngineKillThenRestartThenSignal(t *testing.T) {
	t.Parallel()
	cfg := EngineProcessConfig{
		Listen:         freeAddr(t),
		AdminListen:    freeAddr(t),
		AdminTokenFile: writeToken(t, testToken),
		Engine:         tinyConfig(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- RunEngine(ctx, cfg, Deps{Logger: testLogger(t)}) }()
	c := newClient(t)
	admin := "http://" + cfg.AdminListen
	eventually.True(t, pollTimeout, "admin up", func() bool {
		r, err := c.Get(admin + "/admin/faults")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusUnauthorized
	})
	for _, f := range []string{`{"fault":"kill"}`, `{"fault":"restart"}`} {
		if resp, body := adminDo(t, c, admin, http.MethodPost, testToken, f); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", f, resp.StatusCode, body)
		}
	}
	if resp, _ := get(t, c, "http://"+cfg.Listen+"/health"); resp.StatusCode != 200 {
		t.Fatalf("health after restart: %d", resp.StatusCode)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("RunEngine after cancel = %v", err)
	}
}

func TestRunEngineConfigErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := RunEngine(ctx, EngineProcessConfig{AdminListen: "127.0.0.1:0"}, Deps{}); err == nil || !strings.Contains(err.Error(), "token file") {
		t.Fatalf("admin without token file: %v", err)
	}
	short := writeToken(t, "short")
	if err := RunEngine(ctx, EngineProcessConfig{AdminListen: "127.0.0.1:0", AdminTokenFile: short}, Deps{}); err == nil || !strings.Contains(err.Error(), "at least") {
		t.Fatalf("short token: %v", err)
	}
	if err := RunEngine(ctx, EngineProcessConfig{Listen: "127.0.0.1:0", Engine: EngineConfig{Profile: "x"}}, Deps{}); !errors.Is(err, ErrUnknownProfile) {
		t.Fatalf("bad profile: %v", err)
	}
	if err := RunEngine(ctx, EngineProcessConfig{Listen: "256.0.0.1:1"}, Deps{}); err == nil || !strings.Contains(err.Error(), "engine listen") {
		t.Fatalf("bad listen address: %v", err)
	}
	if _, err := ReadTokenFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing token file read")
	}
}

func TestRunDCGM(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- RunDCGM(ctx, DCGMProcessConfig{Listen: addr, GPUs: 4, DCGM: DCGMConfig{Hostname: "n1"}}, Deps{Logger: testLogger(t)})
	}()
	c := newClient(t)
	eventually.True(t, pollTimeout, "exporter up", func() bool {
		r, err := c.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		r.Body.Close()
		return true
	})
	mfs := scrape(t, c, "http://"+addr+"/metrics")
	if n := len(mfs["DCGM_FI_DEV_FB_USED"].GetMetric()); n != 4 {
		t.Fatalf("%d GPUs served, want 4", n)
	}
	if v, _ := metricValue(mfs, "DCGM_FI_DEV_GPU_UTIL", map[string]string{"gpu": "3", "Hostname": "n1"}); v != 0 {
		t.Fatalf("idle GPU util %v", v)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := RunDCGM(context.Background(), DCGMProcessConfig{GPUs: 65}, Deps{}); err == nil {
		t.Fatal("65 GPUs accepted")
	}
}
