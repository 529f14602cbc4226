package scale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"runtime/debug"
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

// fdsNeeded estimates this process's file descriptors for a point: the
// controllers' end of every heartbeat stream, and the cells' end too when
// they run here (procs 0), each controller's listener and, at worst, a
// full fan-out of probe dials with the sink's accepted ends, the xDS
// client's connection, three pipes per cell process, and a reserve.
func (s pointSpec) fdsNeeded(procs int) uint64 {
	ends := 2
	if procs > 0 {
		ends = 1
	}
	return uint64(ends*s.cells + s.controllers()*(1+2*probeConcurrency) + 2 + 3*procs + 64)
}

// cellProcs is how many child processes hold the point's cells: 0 when
// they run in this process (no Deps.CellProcess), else Config.CellProcs
// (at most one per cell) or, when that is 0, one per maxCellsPerProc.
func (s pointSpec) cellProcs(cfg Config, deps Deps) int {
	switch {
	case deps.CellProcess == nil:
		return 0
	case cfg.CellProcs > 0:
		return min(cfg.CellProcs, s.cells)
	default:
		return (s.cells + maxCellsPerProc - 1) / maxCellsPerProc
	}
}

// childFDsNeeded is what the busiest child needs: its cells' sockets and
// a reserve.
func childFDsNeeded(cells, procs int) uint64 {
	return uint64((cells+procs-1)/procs + childFDReserve)
}

// skipReason says why a point cannot run here, "" when it can (procs:
// the point's cell processes).
func skipReason(cfg Config, fdLimit uint64, s pointSpec, procs int) string {
	switch {
	case s.regions > s.cells:
		return fmt.Sprintf("fewer cells (%d) than regions (%d): every region needs a cell", s.cells, s.regions)
	case cfg.MaxCells > 0 && s.cells > cfg.MaxCells:
		return fmt.Sprintf("above the ceiling of %d cells (--max-cells)", cfg.MaxCells)
	case fdLimit > 0 && s.fdsNeeded(procs) > fdLimit && procs == 0:
		return fmt.Sprintf("needs about %d file descriptors (both ends of each loopback heartbeat stream are in this process, plus probe and xDS sockets); RLIMIT_NOFILE here is %d",
			s.fdsNeeded(procs), fdLimit)
	case fdLimit > 0 && s.fdsNeeded(procs) > fdLimit:
		return fmt.Sprintf("needs about %d file descriptors in the controllers' process (one end of each heartbeat stream, plus probe and xDS sockets); RLIMIT_NOFILE here is %d",
			s.fdsNeeded(procs), fdLimit)
	}
	return ""
}

// childSkipReason says why the children started cannot hold the point's
// cells, "" when they can.
func childSkipReason(s pointSpec, procs int, childLimit uint64) string {
	if need := childFDsNeeded(s.cells, procs); childLimit > 0 && need > childLimit {
		return fmt.Sprintf("each of %d cell processes needs about %d file descriptors (%d cells' sockets and a reserve); a cell process can open %d (its RLIMIT_NOFILE hard limit): give more --cell-procs",
			procs, need, (s.cells+procs-1)/procs, childLimit)
	}
	return ""
}

// region is one controller of a point and its instruments.
type region struct {
	name  string
	ctrl  *regional.Controller
	tap   *metricTap
	sums  *summaryTap // nil in the flat topology
	cells []string    // the ids of its cells
}

// point is everything one point runs. runPoint owns it.
type point struct {
	cfg     Config
	spec    pointSpec
	clock   clockwork.Clock
	log     *slog.Logger
	regions []*region
	fleet   fleet
	procs   int // cell processes (0: cells in this process)
	watcher *xdsclient.Watcher
	// received and sent log when ADS responses cross the wire: read by
	// the watcher, written by region 0's controller (wire.go).
	received, sent *wireLog
	sink           net.Listener
	stops          []func()
	// The process's RSS and goroutines before the cells started.
	baseRSS        uint64
	baseGoroutines int
}

func (p *point) onStop(f func()) { p.stops = append(p.stops, f) }

// stop tears everything down in reverse start order.
func (p *point) stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
	p.stops = nil
}

// skipError: the point cannot run here (found once it started), and why.
type skipError struct{ reason string }

func (e skipError) Error() string { return "skipped: " + e.reason }

// runPoint runs one point and returns its figures; on error the figures
// measured so far come back with it. A skipError means the point could not
// run here. Everything it starts, child processes included, has stopped
// (and been reaped) when it returns.
func runPoint(ctx context.Context, cfg Config, deps Deps, spec pointSpec) (*Figures, error) {
	p := &point{cfg: cfg, spec: spec, clock: deps.Clock, log: deps.Logger, procs: spec.cellProcs(cfg, deps)}
	defer p.stop()
	if err := p.startFleet(ctx, deps); err != nil {
		return nil, err
	}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	f := &Figures{OfferedHeartbeatsPerS: float64(spec.cells) / cfg.HeartbeatInterval.Seconds(), CellProcs: p.procs}
	t0 := p.clock.Now()
	// A start that does not complete (an overloaded machine: cells failed
	// by their TTL while others register) still has its window, cycle and
	// solve measured, so the report shows how far ingest fell short; its
	// deaths are not timed, and the point keeps the error.
	startErr := p.waitReady(ctx)
	if startErr != nil && ctx.Err() != nil {
		return nil, startErr
	}
	f.StartS = p.clock.Since(t0).Seconds()
	f.StartIncomplete = startErr != nil
	if err := p.measureWindow(ctx, f); err != nil {
		return f, errors.Join(startErr, err)
	}
	r0 := p.regions[0]
	cyc, cpu, err := cycleCost(ctx, r0.name, r0.ctrl.Registry().View(), cfg.CycleSamples, cfg.CycleBudget, p.clock)
	f.CycleP50Ms, f.CycleP99Ms, f.CycleRuns = quantileNaN(cyc, 0.5), quantileNaN(cyc, 0.99), len(cyc)
	if len(cpu) > 0 {
		f.CycleCPUP50Ms, f.CycleCPUP99Ms = ptr(quantileNaN(cpu, 0.5)), ptr(quantileNaN(cpu, 0.99))
	}
	if err != nil {
		return f, errors.Join(startErr, err)
	}
	if spec.topology == Hierarchical {
		st, err := solveTimes(ctx, cfg.Seed, spec.regions, cfg.SolveSamples, cfg.SolveBudget, p.clock)
		if err != nil {
			return f, errors.Join(startErr, err)
		}
		f.SolveMs, f.SolveP99Ms = ptr(quantileNaN(st, 0.5)), ptr(quantileNaN(st, 0.99))
	}
	if startErr == nil {
		// The cycle's timing (and the solve's) leaves a few hundred
		// megabytes of garbage at 10,000 cells (full pushes on a server
		// of its own): collected here rather than by a mark within the
		// deaths' first second or two (gctrace: two collections in the
		// deaths without this, one with it, in two runs of each).
		runtime.GC()
		err = p.timeAllDeaths(ctx, f)
	} else {
		nan := math.NaN() // not timed: null in scale.json, — in the table
		f.DeathToRemovedP50Ms, f.DeathToRemovedP99Ms, f.DeathToRemovedMaxMs = nan, nan, nan
	}
	if st, serr := p.fleet.stats(ctx); serr == nil {
		f.StreamErrors = st.streamErrors
	}
	return f, errors.Join(startErr, err)
}

// startFleet starts the point's cell processes (none when the cells run
// here) and checks they can hold the cells.
func (p *point) startFleet(ctx context.Context, deps Deps) error {
	if p.procs == 0 {
		lf := newLocalFleet(p.cfg.HeartbeatInterval, p.cfg.Seed, p.clock, p.log.With("component", "cell"))
		p.fleet = lf
		p.onStop(lf.stop)
		return nil
	}
	pf, err := startProcFleet(ctx, p.procs, deps.CellProcess, p.cfg.HeartbeatInterval, p.cfg.Seed, p.clock)
	if err != nil {
		return err
	}
	p.fleet = pf
	p.onStop(pf.stop)
	if reason := childSkipReason(p.spec, p.procs, pf.minFDLimit()); reason != "" {
		return skipError{reason}
	}
	return nil
}

// start starts the probe sink, the controllers, the xDS client and then
// the cells, taking the process's RSS and goroutines just before them.
func (p *point) start(ctx context.Context) error {
	var err error
	lc := net.ListenConfig{KeepAlive: -1} // its connections are reset at once
	if p.sink, err = lc.Listen(ctx, "tcp", "127.0.0.1:0"); err != nil {
		return fmt.Errorf("scale: probe sink: %w", err)
	}
	var sinkWG sync.WaitGroup
	sinkWG.Go(func() { bench.ServeProbeSink(p.sink) })
	p.onStop(func() { _ = p.sink.Close(); sinkWG.Wait() })
	sinkAddr := p.sink.Addr().String()

	p.received, p.sent = newWireLog(p.clock, true), newWireLog(p.clock, false)
	if err := p.startControllers(ctx, sinkAddr); err != nil {
		return err
	}
	if p.watcher, err = xdsclient.NewWatcher(xdsclient.WatchConfig{Server: p.regions[0].ctrl.Addr(), NodeID: "isobar-bench-scale", Delta: p.cfg.DeltaXDS},
		xdsclient.WatchDeps{Clock: p.clock, Logger: p.log.With("component", "xds-client"),
			DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(p.received)}}); err != nil {
		return err
	}
	if err := p.watcher.Start(ctx); err != nil {
		return err
	}
	p.onStop(p.watcher.Stop)
	debug.FreeOSMemory() // the last point's garbage is not this one's RSS
	p.baseRSS, p.baseGoroutines = rssBytes(), runtime.NumGoroutine()
	return p.startCells(ctx)
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
		rc.XDS.LEDS = p.cfg.DeltaXDS
		r := &region{name: name, tap: newMetricTap()}
		d := regional.Deps{
			Clock: p.clock, Logger: p.log.With("component", "regional", "region", name), Registerer: r.tap,
			// The cells' endpoints are fake: an RTT probe goes to the sink
			// of the process that runs the cell (its accept is the cell's
			// side), this process's own when the cells run here.
			Dialer: func(network, ep string, timeout time.Duration) (net.Conn, error) {
				addr, ok := p.fleet.probeSink(ep)
				if !ok {
					addr = sinkAddr
				}
				return regional.ProbeDial(network, addr, timeout)
			},
		}
		if i == 0 {
			d.GRPCServerOptions = []grpc.ServerOption{grpc.StatsHandler(p.sent)}
		}
		if p.spec.topology == Hierarchical {
			r.sums = &summaryTap{rtt: map[string]time.Duration{}, coord: tapCoordinate(i)}
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

// startCells deals the cells over the controllers (round-robin) and
// starts them in the fleet.
func (p *point) startCells(ctx context.Context) error {
	n := len(p.regions)
	specs := make([]cellSpec, p.spec.cells)
	for k := range specs {
		ri := k % n
		specs[k] = cellSpec{Region: p.regions[ri].name, RegionIndex: ri, Index: k / n, Controller: p.regions[ri].ctrl.Addr()}
	}
	// The cells stop before the controllers (whose graceful stop would
	// wait on their streams); stopping the fleet again at the end is a
	// no-op.
	p.onStop(p.fleet.stop)
	ids, err := p.fleet.start(ctx, specs)
	if err != nil {
		return err
	}
	for k, id := range ids {
		r := p.regions[k%n]
		r.cells = append(r.cells, id)
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
	notReady := 0
	err := waitUntil(ctx, p.clock, p.cfg.StartTimeout, fmt.Sprintf("every one of %d cells Ready", p.spec.cells), func() bool {
		notReady = 0
		for _, r := range p.regions {
			notReady += r.notReady()
		}
		return notReady == 0
	})
	if err != nil {
		if st, serr := p.fleet.stats(ctx); serr == nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (%d not Ready; the cells sent %d heartbeats, %d streams failed, last error %q)",
				err, notReady, st.heartbeats, st.streamErrors, st.lastError)
		}
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	if _, err := p.watcher.WaitFor(wctx, func(a xdsclient.Assignment) bool {
		ws := a.Weights()
		for _, id := range p.regions[0].cells {
			if ws[id] == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("scale: the xDS client did not see every cell of %s: %w", p.regions[0].name, err)
	}
	return nil
}

// snapshot is every counter the window reads. This process's counters
// are read at at; the cells' (over their processes' control pipes, which
// take seconds when the machine is saturated) after them, at fleetAt.
// Each rate divides by the time between its own two reads: dividing what
// was read late by the time of what was read early put catch-up into
// ingest (above 100 % of the offered at saturated points).
type snapshot struct {
	at                   time.Time
	cpu                  time.Duration
	heartbeats           float64
	probes               float64
	ttlFailed            float64
	lagMax               float64 // the greatest read lag among the controllers, seconds
	projSum, projCount   float64
	buildSum, buildCount float64
	summaryCount         []int
	summaryBytes         []int64
	fleet                fleetStats
	fleetAt              time.Time
	// marks is each cell's last applied heartbeat in its registry's view
	// (IngestAlignedFraction), rejected the heartbeats refused so far.
	marks    map[string]heartbeatMark
	rejected float64
}

// heartbeatMark is the last heartbeat a registry applied of a cell: its
// incarnation, sequence and sent_at.
type heartbeatMark struct {
	incarnation string
	sequence    uint64
	sentAt      time.Time
}

// marks adds the last applied heartbeat of each of r's cells that carried
// sent_at, from its registry's view, to m.
func (r *region) marks(m map[string]heartbeatMark) {
	for _, c := range r.ctrl.Registry().View().Cells {
		if c.ClockSkewKnown {
			m[c.ID] = heartbeatMark{c.Incarnation, c.Sequence, c.LastSeen.Add(c.ClockSkew)}
		}
	}
}

// alignedIngest is IngestAlignedFraction between a and b at interval: the
// heartbeats the cells numbered between their two marks, less the
// refused, over what they should have sent between the marks' sent_at.
// Cells that restarted, or lack a mark in either, are left out.
func alignedIngest(a, b snapshot, interval time.Duration) *float64 {
	var numbered float64
	var span time.Duration
	for id, m := range b.marks {
		was, ok := a.marks[id]
		if !ok || was.incarnation != m.incarnation || m.sequence < was.sequence {
			continue
		}
		numbered += float64(m.sequence - was.sequence)
		span += m.sentAt.Sub(was.sentAt)
	}
	if span <= 0 {
		return nil
	}
	return ptr((numbered - (b.rejected - a.rejected)) / (span.Seconds() / interval.Seconds()))
}

func (p *point) snapshot(ctx context.Context) (snapshot, error) {
	s := snapshot{at: p.clock.Now(), marks: make(map[string]heartbeatMark, p.spec.cells)}
	s.cpu, _ = cpuTime()
	for _, r := range p.regions {
		r.marks(s.marks)
		s.rejected += r.tap.read(metricRejected).value
		s.heartbeats += r.tap.read(metricHeartbeats).value
		s.probes += r.tap.read(metricProbes).value
		s.ttlFailed += r.tap.read(metricTTLFailed).value
		s.lagMax = max(s.lagMax, r.tap.read(metricIngestLag).value)
		pr, b := r.tap.read(metricProjection), r.tap.read(metricXDSBuild)
		s.projSum, s.projCount = s.projSum+pr.sum, s.projCount+pr.count
		s.buildSum, s.buildCount = s.buildSum+b.sum, s.buildCount+b.count
		if r.sums != nil {
			n, bytes, _ := r.sums.totals()
			s.summaryCount, s.summaryBytes = append(s.summaryCount, n), append(s.summaryBytes, bytes)
		}
	}
	var err error
	if s.fleet, err = p.fleet.stats(ctx); err != nil {
		return s, err
	}
	s.fleetAt = p.clock.Now()
	return s, nil
}

// measureWindow waits out the warm-up and measures the window.
func (p *point) measureWindow(ctx context.Context, f *Figures) error {
	if err := sleepCtx(ctx, p.clock, p.cfg.Warmup); err != nil {
		return err
	}
	a, err := p.snapshot(ctx)
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, p.clock, p.cfg.Window); err != nil {
		return err
	}
	b, err := p.snapshot(ctx)
	if err != nil {
		return err
	}
	p.windowRates(f, a, b)
	if err := p.inbound(ctx, f, a, b); err != nil {
		return err
	}
	for _, r := range p.regions {
		f.NotReadyAfterWindow += r.notReady()
	}
	p.footprint(f, b)
	return nil
}

// windowRates are the window's ingest, CPU and live cycle figures.
func (p *point) windowRates(f *Figures, a, b snapshot) {
	secs := b.at.Sub(a.at).Seconds()
	cells := float64(p.spec.cells)
	f.IngestHeartbeatsPerS = (b.heartbeats - a.heartbeats) / secs
	fleetSecs := b.fleetAt.Sub(a.fleetAt).Seconds()
	f.SentHeartbeatsPerS = float64(b.fleet.heartbeats-a.fleet.heartbeats) / fleetSecs
	f.IngestFraction = f.IngestHeartbeatsPerS / f.OfferedHeartbeatsPerS
	f.IngestAlignedFraction = alignedIngest(a, b, p.cfg.HeartbeatInterval)
	if _, ok := cpuTime(); ok {
		f.CPUSPerS = (b.cpu - a.cpu).Seconds() / secs
		f.CPUSPerSPer1kCells = f.CPUSPerS / (cells / 1000)
	}
	if p.procs > 0 {
		f.SenderCPUSPerS = ptr((b.fleet.cpu - a.fleet.cpu).Seconds() / fleetSecs)
	}
	if n := b.projCount - a.projCount; n > 0 {
		f.LiveProjectionMeanMs = 1000 * (b.projSum - a.projSum) / n
	}
	if n := b.buildCount - a.buildCount; n > 0 {
		f.LiveXDSBuildMeanMs = 1000 * (b.buildSum - a.buildSum) / n
	}
	f.LivePushesPerS = (b.buildCount - a.buildCount) / secs
	f.ProbesPerS = (b.probes - a.probes) / secs
	f.TTLFailuresPerS = (b.ttlFailed - a.ttlFailed) / secs
	f.IngestLagMaxMs = 1000 * b.lagMax
	if n := b.fleet.heartbeats - a.fleet.heartbeats; n > 0 {
		f.HeartbeatBytes = float64(b.fleet.bytes-a.fleet.bytes) / float64(n)
	}
}

// inbound is what the top of the control plane takes in over the window.
func (p *point) inbound(ctx context.Context, f *Figures, a, b snapshot) error {
	if p.spec.topology == Flat {
		// The one controller is the top of the control plane: it takes in
		// every heartbeat.
		f.GlobalInboundBytesPerS = float64(b.fleet.bytes-a.fleet.bytes) / b.at.Sub(a.at).Seconds()
		return nil
	}
	// The global takes in one summary per region per interval; their size
	// is what the controllers built over the window (a window shorter than
	// the interval waits for each region's next one, so that every size is
	// of a summary built with every cell Ready).
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
	return nil
}

// footprint is this process's RSS and goroutines at the window's end, and
// what the cells added to them since just before they started.
func (p *point) footprint(f *Figures, b snapshot) {
	rss := rssBytes()
	g := runtime.NumGoroutine()
	cells := float64(p.spec.cells)
	f.RSSMiB = float64(rss) / (1 << 20)
	f.RSSPer1kCellsMiB = (float64(rss) - float64(p.baseRSS)) / (1 << 20) / (cells / 1000)
	f.Goroutines = g
	f.GoroutinesPerCell = float64(g-p.baseGoroutines) / cells
	if p.procs > 0 {
		f.SenderRSSMiB = ptr(float64(b.fleet.rss) / (1 << 20))
	}
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
