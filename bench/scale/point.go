package scale

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/bench"
	"github.com/isobar-mesh/isobar/gateway/xdsclient"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/lifecycle"
)

// pointSpec is one point to run.
type pointSpec struct {
	cells, regions int
	topology       string
}

// controllers is the number of regional controllers the point runs.
func (s pointSpec) controllers() int {
	if s.topology == Flat {
		return 1
	}
	return s.regions
}

// perController is the most cells one controller holds (cells are split
// round-robin, so controller 0 holds the most).
func (s pointSpec) perController() int {
	n := s.controllers()
	return (s.cells + n - 1) / n
}

// probeConcurrency is the regional prober's dial fan-out (regional/probe.go).
const probeConcurrency = 32

// fdsNeeded estimates a point's file descriptors: both ends of every
// heartbeat stream (cells and controllers share this process), each
// controller's listener and, at worst, a full fan-out of probe dials with
// the sink's accepted ends, the xDS client's connection, and a reserve.
func (s pointSpec) fdsNeeded() uint64 {
	return uint64(2*s.cells + s.controllers()*(1+2*probeConcurrency) + 2 + 64)
}

// skipReason says why a point cannot run here, "" when it can.
func skipReason(cfg Config, fdLimit uint64, s pointSpec) string {
	switch {
	case s.regions > s.cells:
		return fmt.Sprintf("fewer cells (%d) than regions (%d): every region needs a cell", s.cells, s.regions)
	case cfg.MaxCells > 0 && s.cells > cfg.MaxCells:
		return fmt.Sprintf("above the ceiling of %d cells (--max-cells)", cfg.MaxCells)
	case fdLimit > 0 && s.fdsNeeded() > fdLimit:
		return fmt.Sprintf("needs about %d file descriptors (both ends of each loopback heartbeat stream are in this process, plus probe and xDS sockets); RLIMIT_NOFILE here is %d",
			s.fdsNeeded(), fdLimit)
	}
	return ""
}

// region is one controller of a point and its instruments.
type region struct {
	name  string
	ctrl  *regional.Controller
	tap   *metricTap
	sums  *summaryTap // nil in the flat topology
	cells []*bench.Cell
}

// point is everything one point runs. runPoint owns it.
type point struct {
	cfg      Config
	spec     pointSpec
	clock    clockwork.Clock
	log      *slog.Logger
	regions  []*region
	counters bench.CellCounters
	watcher  *xdsclient.Watcher
	sink     net.Listener
	stops    []func()
}

func (p *point) onStop(f func()) { p.stops = append(p.stops, f) }

// stop tears everything down in reverse start order.
func (p *point) stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
	p.stops = nil
}

// runPoint runs one point and returns its figures; on error the figures
// measured so far come back with it. Everything it starts has stopped when
// it returns.
func runPoint(ctx context.Context, cfg Config, deps Deps, spec pointSpec) (*Figures, error) {
	p := &point{cfg: cfg, spec: spec, clock: deps.Clock, log: deps.Logger}
	defer p.stop()
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	f := &Figures{OfferedHeartbeatsPerS: float64(spec.cells) / cfg.HeartbeatInterval.Seconds()}
	t0 := p.clock.Now()
	if err := p.waitReady(ctx); err != nil {
		return nil, err
	}
	f.StartS = p.clock.Since(t0).Seconds()
	if err := p.measureWindow(ctx, f); err != nil {
		return f, err
	}
	r0 := p.regions[0]
	cyc, err := cycleCost(ctx, r0.name, r0.ctrl.Registry().View(), cfg.CycleSamples, cfg.CycleBudget, p.clock)
	f.CycleP50Ms, f.CycleP99Ms, f.CycleRuns = quantileNaN(cyc, 0.5), quantileNaN(cyc, 0.99), len(cyc)
	if err != nil {
		return f, err
	}
	if spec.topology == Hierarchical {
		st, err := solveTimes(ctx, cfg.Seed, spec.regions, cfg.SolveSamples, cfg.SolveBudget, p.clock)
		if err != nil {
			return f, err
		}
		f.SolveMs, f.SolveP99Ms = ptr(quantileNaN(st, 0.5)), ptr(quantileNaN(st, 0.99))
	}
	deaths, err := p.timeDeaths(ctx)
	f.DeathToRemovedP50Ms, f.DeathToRemovedP99Ms, f.DeathsTimed = quantileNaN(deaths, 0.5), quantileNaN(deaths, 0.99), len(deaths)
	f.DeathToRemovedMaxMs = quantileNaN(deaths, 1)
	f.StreamErrors = p.counters.StreamErrors()
	return f, err
}

// start starts the probe sink, the controllers, the cells and the xDS
// client.
func (p *point) start(ctx context.Context) error {
	var err error
	if p.sink, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return fmt.Errorf("scale: probe sink: %w", err)
	}
	var sinkWG sync.WaitGroup
	sinkWG.Go(func() { bench.ServeProbeSink(p.sink) })
	p.onStop(func() { _ = p.sink.Close(); sinkWG.Wait() })
	sinkAddr := p.sink.Addr().String()

	if err := p.startControllers(ctx, sinkAddr); err != nil {
		return err
	}
	if err := p.startCells(ctx); err != nil {
		return err
	}
	if p.watcher, err = xdsclient.NewWatcher(xdsclient.WatchConfig{Server: p.regions[0].ctrl.Addr(), NodeID: "isobar-bench-scale"},
		xdsclient.WatchDeps{Clock: p.clock, Logger: p.log.With("component", "xds-client"),
			DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}); err != nil {
		return err
	}
	if err := p.watcher.Start(ctx); err != nil {
		return err
	}
	p.onStop(p.watcher.Stop)
	return nil
}

// startControllers starts the point's regional controllers, every RTT
// probe answered by the sink at sinkAddr.
func (p *point) startControllers(ctx context.Context, sinkAddr string) error {
	var err error
	n := p.spec.controllers()
	rtt := regionMap(p.cfg.Seed, n)
	for i := range n {
		name := regionName(i)
		if p.spec.topology == Flat {
			name = "flat"
		}
		rc := regional.DefaultConfig(name)
		rc.Listen, rc.HTTPListen = "127.0.0.1:0", "-"
		rc.HeartbeatInterval, rc.TTLGrace = p.cfg.HeartbeatInterval, p.cfg.TTLGrace
		rc.Global.SummaryInterval = p.cfg.SummaryInterval
		rc.Global.IngressAddress = sinkAddr
		rc.Limits.MaxCells = max(rc.Limits.MaxCells, p.spec.perController()+16)
		r := &region{name: name, tap: newMetricTap()}
		d := regional.Deps{
			Clock: p.clock, Logger: p.log.With("component", "regional", "region", name), Registerer: r.tap,
			// The cells' endpoints are fake: every RTT probe goes to the sink.
			Dialer: func(network, _ string, timeout time.Duration) (net.Conn, error) {
				return net.DialTimeout(network, sinkAddr, timeout)
			},
		}
		if p.spec.topology == Hierarchical {
			r.sums = &summaryTap{rtt: map[string]time.Duration{}}
			for j := range n {
				if j != i {
					r.sums.rtt[regionName(j)] = time.Duration(rtt[i][j] * float64(time.Millisecond))
				}
			}
			d.Gossip = r.sums
		}
		if r.ctrl, err = regional.New(rc, d); err != nil {
			return fmt.Errorf("scale: controller %s: %w", name, err)
		}
		if err := r.ctrl.Start(ctx); err != nil {
			return fmt.Errorf("scale: controller %s: %w", name, err)
		}
		p.onStop(r.ctrl.Stop)
		p.regions = append(p.regions, r)
	}
	return nil
}

// startCells builds the synthetic cells, spread over the controllers, and
// runs each until the point stops.
func (p *point) startCells(ctx context.Context) error {
	n := len(p.regions)
	for k := range p.spec.cells {
		ri := k % n
		r := p.regions[ri]
		c, err := bench.NewCell(bench.CellConfig{
			Region: r.name, RegionIndex: ri, Index: k / n, Controller: r.ctrl.Addr(),
			HeartbeatInterval: p.cfg.HeartbeatInterval, Seed: p.cfg.Seed,
		}, &p.counters, p.clock, p.log.With("component", "cell"))
		if err != nil {
			return err
		}
		r.cells = append(r.cells, c)
	}
	cctx, cancel := context.WithCancel(ctx)
	var cellWG sync.WaitGroup
	p.onStop(func() { cancel(); cellWG.Wait() })
	for _, r := range p.regions {
		for _, c := range r.cells {
			cellWG.Go(func() { c.Run(cctx) })
		}
	}
	return nil
}

// pollEvery is how often waitUntil re-checks a condition that no event
// signals (registry views, cells' stream state).
const pollEvery = 20 * time.Millisecond

// waitUntil re-checks cond every pollEvery until it holds, ctx ends or
// limit passes.
func waitUntil(ctx context.Context, clock clockwork.Clock, limit time.Duration, what string, cond func() bool) error {
	deadline := clock.Now().Add(limit)
	t := clock.NewTicker(pollEvery)
	defer t.Stop()
	for !cond() {
		if !clock.Now().Before(deadline) {
			return fmt.Errorf("scale: %s: not within %v", what, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.Chan():
		}
	}
	return nil
}

// notReady counts the cells of r's registry that are not Ready, and the
// cells it is missing.
func (r *region) notReady() int {
	v := r.ctrl.Registry().View()
	ready := 0
	for _, c := range v.Cells {
		if c.State == lifecycle.Ready {
			ready++
		}
	}
	return len(r.cells) - ready
}

// waitReady waits until every cell is Ready in its registry and every cell
// of region 0 is in the xDS client's assignment with a weight.
func (p *point) waitReady(ctx context.Context) error {
	err := waitUntil(ctx, p.clock, p.cfg.StartTimeout, fmt.Sprintf("every one of %d cells Ready", p.spec.cells), func() bool {
		for _, r := range p.regions {
			if r.notReady() > 0 {
				return false
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	if _, err := p.watcher.WaitFor(wctx, func(a xdsclient.Assignment) bool {
		ws := a.Weights()
		for _, c := range p.regions[0].cells {
			if ws[c.ID()] == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("scale: the xDS client did not see every cell of %s: %w", p.regions[0].name, err)
	}
	return nil
}

// snapshot is every counter the window reads, at one instant.
type snapshot struct {
	at                        time.Time
	cpu                       time.Duration
	heartbeats                float64
	projSum, projCount        float64
	buildSum, buildCount      float64
	sentHeartbeats, sentBytes uint64
	summaryCount              []int
	summaryBytes              []int64
}

func (p *point) snapshot() snapshot {
	s := snapshot{at: p.clock.Now()}
	s.cpu, _ = cpuTime()
	s.sentHeartbeats, s.sentBytes = p.counters.Heartbeats(), p.counters.HeartbeatBytes()
	for _, r := range p.regions {
		s.heartbeats += r.tap.read(metricHeartbeats).value
		pr, b := r.tap.read(metricProjection), r.tap.read(metricXDSBuild)
		s.projSum, s.projCount = s.projSum+pr.sum, s.projCount+pr.count
		s.buildSum, s.buildCount = s.buildSum+b.sum, s.buildCount+b.count
		if r.sums != nil {
			n, bytes, _ := r.sums.totals()
			s.summaryCount, s.summaryBytes = append(s.summaryCount, n), append(s.summaryBytes, bytes)
		}
	}
	return s
}

// measureWindow waits out the warm-up and measures the window.
func (p *point) measureWindow(ctx context.Context, f *Figures) error {
	if err := sleepCtx(ctx, p.clock, p.cfg.Warmup); err != nil {
		return err
	}
	a := p.snapshot()
	if err := sleepCtx(ctx, p.clock, p.cfg.Window); err != nil {
		return err
	}
	b := p.snapshot()
	secs := b.at.Sub(a.at).Seconds()
	cells := float64(p.spec.cells)
	f.IngestHeartbeatsPerS = (b.heartbeats - a.heartbeats) / secs
	if _, ok := cpuTime(); ok {
		f.CPUSPerS = (b.cpu - a.cpu).Seconds() / secs
		f.CPUSPerSPer1kCells = f.CPUSPerS / (cells / 1000)
	}
	if n := b.projCount - a.projCount; n > 0 {
		f.LiveProjectionMeanMs = 1000 * (b.projSum - a.projSum) / n
	}
	if n := b.buildCount - a.buildCount; n > 0 {
		f.LiveXDSBuildMeanMs = 1000 * (b.buildSum - a.buildSum) / n
	}
	f.LivePushesPerS = (b.buildCount - a.buildCount) / secs
	if n := b.sentHeartbeats - a.sentHeartbeats; n > 0 {
		f.HeartbeatBytes = float64(b.sentBytes-a.sentBytes) / float64(n)
	}
	heartbeatBytesPerS := float64(b.sentBytes-a.sentBytes) / secs
	if p.spec.topology == Flat {
		// The one controller is the top of the control plane: it takes in
		// every heartbeat.
		f.GlobalInboundBytesPerS = heartbeatBytesPerS
	} else {
		// The global takes in one summary per region per interval; their
		// size is what the controllers built over the window (a window
		// shorter than the interval waits for each region's next one, so
		// that every size is of a summary built with every cell Ready).
		sizes := make([]float64, len(p.regions))
		for i, r := range p.regions {
			var n int
			var bytes int64
			err := waitUntil(ctx, p.clock, 3*p.cfg.SummaryInterval, "a summary from "+r.name, func() bool {
				n, bytes, _ = r.sums.totals()
				return n > a.summaryCount[i]
			})
			if err != nil {
				return err
			}
			sizes[i] = float64(bytes-a.summaryBytes[i]) / float64(n-a.summaryCount[i])
		}
		per := mean(sizes)
		f.SummaryBytesPerRegion = ptr(per)
		f.GlobalInboundBytesPerS = per * float64(len(p.regions)) / p.cfg.SummaryInterval.Seconds()
	}
	for _, r := range p.regions {
		f.NotReadyAfterWindow += r.notReady()
	}
	f.RSSMiB = float64(rssBytes()) / (1 << 20)
	f.Goroutines = runtime.NumGoroutine()
	return nil
}

// sleepCtx waits d (a measurement interval, not a synchronisation).
func sleepCtx(ctx context.Context, clock clockwork.Clock, d time.Duration) error {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.Chan():
		return nil
	}
}
