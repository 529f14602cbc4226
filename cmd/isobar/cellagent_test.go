package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/cellagent"
)

func cellagentFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "cellagent", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cellagentServers starts an engine and a dcgm-exporter serving the
// cellagent fixtures.
func cellagentServers(t *testing.T) (vllm, dcgm *httptest.Server) {
	t.Helper()
	metrics, models, gpus := cellagentFixture(t, "vllm_v1_dp2.prom"), cellagentFixture(t, "models.json"), cellagentFixture(t, "dcgm_2gpu.prom")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(metrics) })
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(models) })
	vllm = httptest.NewServer(mux)
	dcgm = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(gpus) }))
	t.Cleanup(vllm.Close)
	t.Cleanup(dcgm.Close)
	return vllm, dcgm
}

// cellagentDecodeOne decodes exactly one JSON object from out.
func cellagentDecodeOne(t *testing.T, out []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(out))
	var got map[string]any
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, out)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("more than one JSON value on stdout:\n%s", out)
	}
	return got
}

func cellagentJSONAt(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func TestCellagentOnceJSON(t *testing.T) {
	vllm, dcgm := cellagentServers(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"cellagent", "--once", "--vllm-url", vllm.URL + "/metrics",
		"--dcgm-url", dcgm.URL + "/metrics", "--dcgm-gpu", "1", "--output", "json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	got := cellagentDecodeOne(t, stdout.Bytes())
	for _, tc := range []struct {
		keys []string
		want float64
	}{
		{[]string{"signals", "queue_depth"}, 4},
		{[]string{"signals", "running"}, 22},
		{[]string{"signals", "ttft_p95_seconds"}, 0.8125},
		{[]string{"signals", "error_rate"}, 0.015},
		{[]string{"signals", "window_requests"}, 1000},
		{[]string{"signals", "kv_cache_usage"}, 0.40},
		{[]string{"signals", "gpu_util"}, 0.12},
		{[]string{"signals", "vram_used"}, 2048.0 / (2048 + 78953)},
		{[]string{"signals", "sm_active"}, 0.08},
		{[]string{"signals", "dram_active"}, 0.05},
		{[]string{"signals", "temperature_celsius"}, 38},
		{[]string{"signals", "clock_throttle_reasons"}, 1},
		{[]string{"capability", "max_model_len"}, 8192},
	} {
		v, ok := cellagentJSONAt(got, tc.keys...).(float64)
		if !ok || math.Abs(v-tc.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", strings.Join(tc.keys, "."), cellagentJSONAt(got, tc.keys...), tc.want)
		}
	}
	if m := cellagentJSONAt(got, "capability", "model"); m != "meta-llama/Llama-3.1-70B-Instruct" {
		t.Errorf("capability.model = %v", m)
	}
	for _, src := range []string{"vllm", "dcgm"} {
		if ok := cellagentJSONAt(got, "sources", src, "ok"); ok != true {
			t.Errorf("sources.%s.ok = %v", src, ok)
		}
	}
	if rr := cellagentJSONAt(got, "signals", "request_rate"); rr != nil {
		t.Errorf("request_rate = %v from a single scrape", rr)
	}
}

func TestCellagentOnceSourceDown(t *testing.T) {
	vllm, dcgm := cellagentServers(t)
	dcgm.Close()
	var stdout, stderr bytes.Buffer
	code := run([]string{"cellagent", "--once", "--vllm-url", vllm.URL + "/metrics", "--dcgm-url", dcgm.URL + "/metrics", "--dcgm-gpu", "0"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d with a source down, want 0: %s", code, stderr.String())
	}
	got := cellagentDecodeOne(t, stdout.Bytes())
	if cellagentJSONAt(got, "sources", "dcgm", "ok") != false {
		t.Errorf("sources.dcgm = %v, want ok false", cellagentJSONAt(got, "sources", "dcgm"))
	}
	if e, _ := cellagentJSONAt(got, "sources", "dcgm", "error").(string); e == "" {
		t.Error("sources.dcgm.error empty")
	}
	if cellagentJSONAt(got, "signals", "gpu_util") != nil || cellagentJSONAt(got, "signals", "queue_depth") == nil {
		t.Errorf("signals = %v", cellagentJSONAt(got, "signals"))
	}
}

func TestCellagentOnceText(t *testing.T) {
	vllm, dcgm := cellagentServers(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"cellagent", "--once", "-o", "text", "--vllm-url", vllm.URL + "/metrics", "--dcgm-url", dcgm.URL + "/metrics", "--dcgm-gpu", "0"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"state", "READY", "gpu_util", "0.87", "ttft_p95_seconds", "0.8125", "source dcgm"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, stdout.String())
		}
	}
}

func TestCellagentFlagErrors(t *testing.T) {
	vllm, _ := cellagentServers(t)
	u := vllm.URL + "/metrics"
	plain := []string{"cellagent", "--cell-id", "c1", "--region", "r1", "--controller", "127.0.0.1:1", "--vllm-url", u}
	agent := append(append([]string{}, plain...), "--insecure")
	tests := []struct {
		name string
		args []string
		hint string
	}{
		{"once without vllm url", []string{"cellagent", "--once"}, "--vllm-url"},
		{"agent without cell id", []string{"cellagent", "--vllm-url", u, "--insecure"}, "--cell-id"},
		{"agent without controller", []string{"cellagent", "--cell-id", "c1", "--region", "r1", "--vllm-url", u, "--insecure"}, "--controller"},
		{"bad cell id", append(append([]string{}, agent...), "--cell-id", "a/b"), "--cell-id"},
		{"bad output", []string{"cellagent", "--once", "--vllm-url", u, "--output", "yaml"}, "--output"},
		{"zero interval", append(append([]string{}, agent...), "--interval", "0"), "--interval"},
		{"unparsable interval", append(append([]string{}, agent...), "--interval", "fast"), "interval"},
		{"interval too long", append(append([]string{}, agent...), "--interval", "2h"), "--interval"},
		{"partial tls", append(append([]string{}, plain...), "--tls-cert", "cell.pem"), "--tls-key"},
		{"neither tls nor insecure", plain, "--insecure"},
		{"tls and insecure", append(append([]string{}, agent...), "--tls-cert", "cell.pem"), "exclude"},
		{"bad gpu", []string{"cellagent", "--once", "--vllm-url", u, "--dcgm-gpu", "gpu0"}, "--dcgm-gpu"},
		{"bad vllm url", []string{"cellagent", "--once", "--vllm-url", "localhost:8000/metrics"}, "--vllm-url"},
		{"stray argument", []string{"cellagent", "extra"}, "no arguments"},
	}
	if !cellagent.NVMLSupported {
		tests = append(tests, struct {
			name string
			args []string
			hint string
		}{"nvml without the tag", []string{"cellagent", "--once", "--vllm-url", u, "--nvml"}, "rebuild with -tags nvml"})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.hint) {
				t.Fatalf("exit %d, stderr %q; want 2 and a mention of %q", code, stderr.String(), tc.hint)
			}
		})
	}
}

func TestCellagentHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"cellagent", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, flag := range []string{"--cell-id", "--dcgm-gpu", "--once", "--window", "--tls-ca", "spiffe://isobar/region/<region>/cell/", "--insecure"} {
		if !strings.Contains(stdout.String(), flag) {
			t.Errorf("help lacks %s", flag)
		}
	}
}
