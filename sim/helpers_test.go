package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// tWriter sends log lines to t.Log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// tinyConfig is the tiny profile at real-time scale with a 4096 context.
func tinyConfig() EngineConfig {
	return EngineConfig{Profile: ProfileTiny, MaxModelLen: 4096, Seed: 1}
}

func listenLoopback(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startEngine starts an engine on loopback and stops it when the test ends.
func startEngine(t testing.TB, cfg EngineConfig, deps Deps) *Engine {
	t.Helper()
	if deps.Logger == nil {
		deps.Logger = testLogger(t)
	}
	e, err := NewEngine(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(listenLoopback(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return e
}

// newClient returns an HTTP client whose connections close with the test.
func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{DisableKeepAlives: false}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func post(t testing.TB, c *http.Client, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading body: %v", url, err)
	}
	return resp, b
}

func get(t testing.TB, c *http.Client, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

// scrape fetches and parses a Prometheus text endpoint.
func scrape(t testing.TB, c *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, body := get(t, c, url)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d", url, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parsing %s: %v\n%s", url, err, body)
	}
	return mfs
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// metricValue returns the value of the series of family name whose labels
// include want (counter, gauge or histogram sample sum), and whether found.
func metricValue(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		l := labelsOf(m)
		for k, v := range want {
			if l[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return m.GetHistogram().GetSampleSum(), true
		}
	}
	return 0, false
}

// sseEvents reads "data: ..." events from an SSE body into a channel,
// closing it at the end of the stream; a read error is sent as "ERR: ...".
func sseEvents(body io.Reader) <-chan string {
	ch := make(chan string, 1024)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			line := sc.Text()
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				ch <- data
			}
		}
		if err := sc.Err(); err != nil {
			ch <- "ERR: " + err.Error()
		}
	}()
	return ch
}

// pollTimeout bounds every eventually.True of these tests (an upper bound,
// not a synchronisation delay).
const pollTimeout = 10 * time.Second
