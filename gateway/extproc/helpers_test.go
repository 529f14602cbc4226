package extproc

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// The helpers below are the gateway package's test helpers that the
// picker's tests use, restated here: a regional controller stand-in, the
// test logger and listeners, and a hop proof made from its documented
// wire format (gateway/hop.go).

// testTimeout bounds every wait on a condition.
const testTimeout = 20 * time.Second

// model is the model of the tests' states.
const model = "m"

// tWriter sends log lines to t.Log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

var insecureDial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// dataPlane is the controller's DataPlane service: it acknowledges every
// report.
type dataPlane struct {
	isobarpb.UnimplementedDataPlaneServer
}

func (dataPlane) Report(s grpc.BidiStreamingServer[isobarpb.DataPlaneReport, isobarpb.DataPlaneAck]) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
		if err := s.Send(&isobarpb.DataPlaneAck{}); err != nil {
			return nil
		}
	}
}

// control is a regional controller stand-in: the real xds.Server and a
// DataPlane service on one gRPC server.
type control struct {
	addr string
	xds  *xds.Server
	gs   *grpc.Server
	once sync.Once
	done chan struct{}
}

// startControl serves cfg on addr ("127.0.0.1:0" for a new port) and pushes
// st. It stops with the test.
func startControl(t testing.TB, addr string, cfg xds.Config, st xds.State) *control {
	t.Helper()
	if cfg.Region == "" {
		cfg.Region = "r1"
	}
	ln := listen(t, addr)
	xs, err := xds.NewServer(cfg, xds.Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c := &control{addr: ln.Addr().String(), xds: xs, gs: grpc.NewServer(), done: make(chan struct{})}
	xs.Register(c.gs)
	isobarpb.RegisterDataPlaneServer(c.gs, dataPlane{})
	go func() {
		defer close(c.done)
		_ = c.gs.Serve(ln)
	}()
	if _, err := xs.Push(st); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	return c
}

func (c *control) stop() {
	c.once.Do(func() {
		c.xds.Stop()
		c.gs.Stop()
		<-c.done
	})
}

// endpointOf turns a host:port into an xds endpoint.
func endpointOf(t testing.TB, cell, addr string, weight, maxLen uint32) xds.Endpoint {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var p uint32
	if _, err := fmt.Sscan(port, &p); err != nil {
		t.Fatal(err)
	}
	return xds.Endpoint{CellID: cell, Host: host, Port: p, Weight: weight, MaxModelLen: maxLen}
}

// oneModel is a state with one model whose local locality holds eps.
func oneModel(model string, eps ...xds.Endpoint) xds.State {
	return xds.State{Models: []xds.Model{{Name: model, Localities: []xds.Locality{{Region: "r1", Zone: "z1", Weight: 1000, Endpoints: eps}}}}}
}

// lockedRand is a seeded lb.Rand safe for concurrent use.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(a, b uint64) *lockedRand { return &lockedRand{r: rand.New(rand.NewPCG(a, b))} }

func (l *lockedRand) Uint64() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Uint64()
}

// testHopKey is the hop key of tests whose pickers take forwarded
// requests.
var testHopKey = []byte("0123456789abcdef0123456789abcdef")

// provenHop returns the headers of a request forwarded by region's gateway
// holding testHopKey, proven at the real clock's now: the proof of the
// documented format "v1.<unix seconds>.<base64url(HMAC-SHA256(key,
// "isobar-hop v1\n" + region + "\n" + seconds))>".
func provenHop(t testing.TB, region string) map[string]string {
	t.Helper()
	secs := strconv.FormatInt(time.Now().Unix(), 10)
	m := hmac.New(sha256.New, testHopKey)
	m.Write([]byte("isobar-hop v1\n" + region + "\n" + secs))
	tok := "v1." + secs + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	return map[string]string{xdscontract.DefaultHopHeader: region, xdscontract.HopAuthHeader: tok}
}

// metric sums the samples of a metric family of reg whose labels include
// want.
func metric(t testing.TB, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue next
				}
			}
			sum += metricValue(m)
		}
	}
	return sum
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}
