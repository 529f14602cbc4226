package cellagent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestScrapeOnce(t *testing.T) {
	type env struct {
		eng  *fakeEngine
		dcgm *fakeDCGM
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, e env, c *Config)
		check func(t *testing.T, r OnceReport)
	}{
		{
			name: "fixtures",
			check: func(t *testing.T, r OnceReport) {
				if r.State != "READY" || !r.Sources.VLLM.OK || !r.Sources.DCGM.OK || !r.Sources.Models.OK {
					t.Fatalf("report = %+v", r)
				}
				s := r.Signals
				p95, errRate, reqs := 0.8125, 0.015, 1000.0
				wantVal(t, "TTFTP95Seconds", s.TTFTP95Seconds, &p95)
				wantVal(t, "ErrorRate", s.ErrorRate, &errRate)
				wantVal(t, "WindowRequests", s.WindowRequests, &reqs)
				wantVal(t, "RequestRate", s.RequestRate, nil)
				util, sm := 0.87, 0.802117
				wantVal(t, "GPUUtil", s.GPUUtil, &util)
				wantVal(t, "SMActive", s.SMActive, &sm)
				if r.Capability != (Capability{Model: "meta-llama/Llama-3.1-70B-Instruct", MaxModelLen: 8192}) {
					t.Errorf("capability = %+v", r.Capability)
				}
			},
		},
		{
			name:  "dcgm down",
			setup: func(t *testing.T, e env, c *Config) { e.dcgm.Close() },
			check: func(t *testing.T, r OnceReport) {
				if r.Sources.DCGM.OK || !strings.Contains(r.Sources.DCGM.Error, "refused") {
					t.Errorf("dcgm = %+v, want down with the reason", r.Sources.DCGM)
				}
				if r.Signals.GPUUtil != nil || r.Signals.VRAMUsed != nil {
					t.Errorf("hardware signals with dcgm down: %+v", r.Signals)
				}
				if !r.Sources.VLLM.OK || r.Signals.QueueDepth == nil {
					t.Errorf("vllm affected: %+v", r.Sources.VLLM)
				}
			},
		},
		{
			name:  "no dcgm configured",
			setup: func(t *testing.T, e env, c *Config) { c.DCGMURL = "" },
			check: func(t *testing.T, r OnceReport) {
				if r.Sources.DCGM.OK || r.Sources.DCGM.Error != "not configured" {
					t.Errorf("dcgm = %+v", r.Sources.DCGM)
				}
			},
		},
		{
			name:  "engine down",
			setup: func(t *testing.T, e env, c *Config) { e.eng.Close() },
			check: func(t *testing.T, r OnceReport) {
				if r.State != "FAILED" || !strings.Contains(r.Reason, "unreachable") {
					t.Errorf("state = %s (%s)", r.State, r.Reason)
				}
				if r.Sources.VLLM.OK || r.Sources.Models.OK || r.Signals.QueueDepth != nil {
					t.Errorf("report = %+v", r)
				}
				if !r.Sources.DCGM.OK {
					t.Errorf("dcgm affected: %+v", r.Sources.DCGM)
				}
			},
		},
		{
			name:  "engine loading",
			setup: func(t *testing.T, e env, c *Config) { e.eng.setHealth(http.StatusServiceUnavailable) },
			check: func(t *testing.T, r OnceReport) {
				if r.State != "LOADING" || !strings.Contains(r.Reason, "503") {
					t.Errorf("state = %s (%s)", r.State, r.Reason)
				}
			},
		},
		{
			name:  "body over the cap",
			setup: func(t *testing.T, e env, c *Config) { c.MaxBodyBytes = 4096 },
			check: func(t *testing.T, r OnceReport) {
				if r.Sources.VLLM.OK || !strings.Contains(r.Sources.VLLM.Error, "4096 bytes (MaxBodyBytes)") {
					t.Errorf("vllm = %+v, want the limit named", r.Sources.VLLM)
				}
				if r.Sources.DCGM.OK {
					t.Errorf("dcgm page (14 KiB) passed a 4 KiB cap")
				}
			},
		},
		{
			name:  "ambiguous GPU",
			setup: func(t *testing.T, e env, c *Config) { c.DCGMGPU = "" },
			check: func(t *testing.T, r OnceReport) {
				if r.Sources.DCGM.OK || !strings.Contains(r.Sources.DCGM.Error, "2 GPUs") {
					t.Errorf("dcgm = %+v", r.Sources.DCGM)
				}
			},
		},
		{
			name: "metrics not prometheus",
			setup: func(t *testing.T, e env, c *Config) {
				e.eng.mu.Lock()
				e.eng.raw = []byte("<html>502 Bad Gateway</html>\n")
				e.eng.mu.Unlock()
			},
			check: func(t *testing.T, r OnceReport) {
				if r.Sources.VLLM.OK || !strings.Contains(r.Sources.VLLM.Error, "malformed") {
					t.Errorf("vllm = %+v", r.Sources.VLLM)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := env{eng: newFakeEngine(t), dcgm: newFakeDCGM(t, readFixture(t, "dcgm_2gpu.prom"))}
			e.eng.raw = readFixture(t, "vllm_v1_dp2.prom")
			cfg := Config{VLLMURL: e.eng.metricsURL(), DCGMURL: e.dcgm.metricsURL(), DCGMGPU: "0", ScrapeTimeout: 5 * time.Second}
			if tc.setup != nil {
				tc.setup(t, e, &cfg)
			}
			r, err := ScrapeOnce(context.Background(), cfg, Deps{})
			if err != nil {
				t.Fatal(err)
			}
			checkSignalsInRange(t, r.Signals)
			tc.check(t, r)
			if _, err := json.Marshal(r); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestScrapeOnceHealthTimeout: a /health that hangs marks the engine FAILED
// after ScrapeTimeout.
func TestScrapeOnceHealthTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		_, _ = w.Write(readFixture(t, "vllm_v1_dp2.prom"))
	}))
	defer srv.Close()
	defer close(release)
	r, err := ScrapeOnce(context.Background(), Config{VLLMURL: srv.URL + "/metrics", ScrapeTimeout: 200 * time.Millisecond}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != "FAILED" || !strings.Contains(r.Reason, "timed out after 200ms") {
		t.Fatalf("state = %s (%s), want FAILED on a health timeout", r.State, r.Reason)
	}
}

func TestScrapeOnceConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{},
		{VLLMURL: "ftp://x/metrics"},
		{VLLMURL: "http://127.0.0.1:1/metrics", DCGMURL: "not a url"},
		{VLLMURL: "http://127.0.0.1:1/metrics", DCGMGPU: "third"},
	} {
		if _, err := ScrapeOnce(context.Background(), c, Deps{}); err == nil {
			t.Errorf("ScrapeOnce(%+v) accepted a bad config", c)
		}
	}
}
