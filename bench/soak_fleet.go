package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// soakFleet is the control plane under test: embedded etcd, the global HA
// pair and one regional controller per region, all plaintext on loopback.
// The RTT prober of every controller dials one shared sink listener (the
// cells' endpoints are distinct fake addresses).
type soakFleet struct {
	log     *slog.Logger
	sink    net.Listener
	sinkWG  sync.WaitGroup
	etcd    *election.Embedded
	globals []*global.Server
	regions []*soakRegion
	stops   []func()
}

// soakRegion is one region's controller with the instruments the soak
// reads.
type soakRegion struct {
	name    string
	ctrl    *regional.Controller
	metrics *capturingRegisterer
}

// startFleet starts every component; on error what was started is stopped.
func startFleet(ctx context.Context, cfg SoakConfig, dir string, clock clockwork.Clock, log *slog.Logger) (_ *soakFleet, err error) {
	f := &soakFleet{log: log}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	lc := net.ListenConfig{KeepAlive: -1} // its connections are reset at once
	if f.sink, err = lc.Listen(ctx, "tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("bench: probe sink: %w", err)
	}
	f.sinkWG.Go(func() { ServeProbeSink(f.sink) })
	f.onStop(func() { _ = f.sink.Close(); f.sinkWG.Wait() })

	if f.etcd, err = election.StartEmbedded(ctx, election.EmbeddedConfig{Dir: dir + "/etcd", UnsafeNoFsync: true}); err != nil {
		return nil, err
	}
	f.onStop(f.etcd.Stop)
	for g := range 2 {
		name := fmt.Sprintf("g%d", g+1)
		gc := global.Config{
			Name: name, Listen: "127.0.0.1:0", HTTPListen: "-", Regions: cfg.Regions,
			LeaseTTL: cfg.LeaseTTL, CycleInterval: cfg.PlanInterval, PlanTTL: cfg.PlanTTL,
			RegionTTL: max(3*time.Second, 3*cfg.SummaryInterval),
			Etcd:      f.etcdConfig(), // global.New connects; Stop closes
		}
		srv, err := global.New(gc, global.Deps{Clock: clock, Logger: log.With("component", "global", "global", name),
			Registerer: prometheus.NewRegistry()})
		if err != nil {
			return nil, err
		}
		if err := srv.Start(ctx); err != nil {
			return nil, err
		}
		f.onStop(srv.Stop)
		f.globals = append(f.globals, srv)
	}
	dial, err := regional.ClientDialOptions(regional.TLSFiles{})
	if err != nil {
		return nil, err
	}
	sinkAddr := f.sink.Addr().String()
	for _, name := range cfg.Regions {
		rc := regional.DefaultConfig(name)
		rc.Etcd = f.etcdConfig() // regional.New connects; Stop closes
		rc.Listen, rc.HTTPListen = "127.0.0.1:0", "-"
		rc.HeartbeatInterval, rc.TTLGrace = cfg.HeartbeatInterval, cfg.TTLGrace
		rc.Global.SummaryInterval = cfg.SummaryInterval
		// Plans route to remote regions through their ingress; nothing
		// serves traffic in a soak, so every region advertises the sink.
		rc.Global.IngressAddress = sinkAddr
		// A region's cells, however many the soak puts there, all fit.
		rc.Limits.MaxCells = max(rc.Limits.MaxCells, (cfg.Cells+len(cfg.Regions)-1)/len(cfg.Regions))
		r := &soakRegion{name: name, metrics: newCapturingRegisterer()}
		r.ctrl, err = regional.New(rc, regional.Deps{
			Clock: clock, Logger: log.With("component", "regional", "region", name), Registerer: r.metrics,
			GlobalDialOptions: dial,
			Dialer: func(network, _ string, timeout time.Duration) (net.Conn, error) {
				return regional.ProbeDial(network, sinkAddr, timeout)
			},
		})
		if err != nil {
			return nil, err
		}
		if err := r.ctrl.Start(ctx); err != nil {
			return nil, err
		}
		f.onStop(r.ctrl.Stop)
		f.regions = append(f.regions, r)
	}
	return f, nil
}

// etcdConfig is the embedded etcd's client configuration, from which
// global.New and regional.New connect (the assembly isobar global and
// isobar regional use).
func (f *soakFleet) etcdConfig() election.ClientConfig {
	return election.ClientConfig{Endpoints: f.etcd.Endpoints(), DialTimeout: 10 * time.Second}
}

func (f *soakFleet) onStop(fn func()) { f.stops = append(f.stops, fn) }

// stop tears everything down in reverse start order. Idempotent.
func (f *soakFleet) stop() {
	for i := len(f.stops) - 1; i >= 0; i-- {
		f.stops[i]()
	}
	f.stops = nil
}

// ServeProbeSink accepts a regional controller's RTT-probe TCP connects
// (the synthetic cells' endpoints point at ln) until the listener closes,
// then returns once every connection it took is closed. It blocks; run it
// in a goroutine the caller joins after closing ln.
//
// A probe connects and closes. The sink waits for that close (the
// client's FIN, bounded by probeSinkHold) and only then resets the
// connection, so neither side keeps TIME_WAIT. Resetting at accept, as it
// did, raced the prober's connect: a reset that arrived before Go read
// the connect's result failed the probe ("connection reset by peer"),
// about one probe in five on loopback.
func ServeProbeSink(ln net.Listener) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		conns.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(probeSinkHold))
			_, _ = io.Copy(io.Discard, c)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		})
	}
}

// probeSinkHold bounds how long the probe sink waits for a probe to close
// its connection.
const probeSinkHold = 5 * time.Second

// regionCounts is one region's registry by state.
type regionCounts struct {
	ready, failed, loading, other, total int
}

func (r *soakRegion) counts() regionCounts {
	var c regionCounts
	for _, cv := range r.ctrl.Registry().View().Cells {
		c.total++
		switch cv.State {
		case lifecycle.Ready:
			c.ready++
		case lifecycle.Failed:
			c.failed++
		case lifecycle.Loading:
			c.loading++
		default:
			c.other++
		}
	}
	return c
}

// Metric names the soak reads from each controller.
const (
	metricStreams = "isobar_regional_heartbeat_streams"
	metricPlans   = "isobar_regional_plans_total"
)

// capturingRegisterer is a prometheus.Registry that also keeps the
// collectors of the few metrics the soak reads, so that a sample collects
// those alone rather than gathering every per-cell series.
type capturingRegisterer struct {
	*prometheus.Registry
	mu       sync.Mutex
	captured map[string]prometheus.Collector
}

func newCapturingRegisterer() *capturingRegisterer {
	return &capturingRegisterer{Registry: prometheus.NewRegistry(), captured: map[string]prometheus.Collector{}}
}

// Register registers c and captures it when it describes a metric the
// soak reads.
func (r *capturingRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	descs := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(descs); close(descs) }()
	for d := range descs {
		for _, name := range []string{metricStreams, metricPlans} {
			if strings.Contains(d.String(), `fqName: "`+name+`"`) {
				r.mu.Lock()
				r.captured[name] = c
				r.mu.Unlock()
			}
		}
	}
	return nil
}

// MustRegister registers every collector and panics on the first error,
// as prometheus.Registry.MustRegister does.
func (r *capturingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var _ prometheus.Registerer = (*capturingRegisterer)(nil)

// values collects the named metric: its value per the given label's value
// ("" for an unlabelled metric). ok is false when the metric was never
// registered.
func (r *capturingRegisterer) values(name, label string) (map[string]float64, bool) {
	r.mu.Lock()
	c := r.captured[name]
	r.mu.Unlock()
	if c == nil {
		return nil, false
	}
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	out := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		key := ""
		for _, lp := range pb.GetLabel() {
			if lp.GetName() == label {
				key = lp.GetValue()
			}
		}
		switch {
		case pb.Gauge != nil:
			out[key] += pb.GetGauge().GetValue()
		case pb.Counter != nil:
			out[key] += pb.GetCounter().GetValue()
		}
	}
	return out, true
}

// streams is the controller's open heartbeat stream gauge.
func (r *soakRegion) streams() int {
	v, _ := r.metrics.values(metricStreams, "")
	return int(v[""])
}

// plansByResult is the controller's plan counter by result.
func (r *soakRegion) plansByResult() map[string]float64 {
	v, _ := r.metrics.values(metricPlans, "result")
	return v
}

// tempDir makes the run's directory when none is given.
func tempDir(dir string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	d, err := os.MkdirTemp("", "isobar-soak-")
	if err != nil {
		return "", nil, fmt.Errorf("bench: %w", err)
	}
	return d, func() { _ = os.RemoveAll(d) }, nil
}
