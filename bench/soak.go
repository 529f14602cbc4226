package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Soak outcomes other than success; test with errors.Is.
var (
	// ErrSoakFailed: the run completed and at least one check failed; the
	// report says which.
	ErrSoakFailed = errors.New("bench: soak checks failed")
	// ErrInterrupted: ctx ended (Ctrl-C) before the checks ran; the report
	// holds the samples taken so far.
	ErrInterrupted = errors.New("bench: soak interrupted")
)

// maxSoakSamples bounds the series: --duration / --sample.
const maxSoakSamples = 100_000

// RunSoak runs one soak and returns its report. The report is returned
// with every error after the configuration was accepted, so that a failed
// or interrupted run still shows its series. Everything RunSoak starts has
// stopped when it returns.
//
// Phases: start the fleet and wait for every region to route on a plan;
// start the cells and wait until all are Ready (both bounded by
// StartTimeout); churn for Duration, sampling; stop the churn and wait
// (bounded by Settle) until every cell is back and each region's open
// streams equal its live cells; stop the cells and wait (bounded by
// Settle) until the goroutines are back at the baseline; judge.
func RunSoak(ctx context.Context, cfg SoakConfig, deps SoakDeps) (*SoakReport, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Duration/cfg.SampleEvery > maxSoakSamples {
		return nil, fmt.Errorf("%w: --duration %v / --sample %v: more than %d samples", ErrInvalidConfig, cfg.Duration, cfg.SampleEvery, maxSoakSamples)
	}
	deps.withDefaults()
	r := &soakRun{cfg: cfg, deps: deps, clock: deps.Clock,
		rep: &SoakReport{Config: reportConfig(cfg), StartedAt: deps.Clock.Now(), Samples: []Sample{}, Plans: []RegionPlans{}, Checks: []Check{}}}
	err := r.run(ctx)
	r.rep.EndedAt = r.clock.Now()
	r.rep.Churn = r.churnStats()
	if err == nil && ctx.Err() != nil {
		err = ErrInterrupted
	}
	if errors.Is(err, ErrInterrupted) || errors.Is(err, context.Canceled) {
		r.rep.Interrupted, r.rep.Passed = true, false
		return r.rep, fmt.Errorf("%w after %v", ErrInterrupted, r.rep.EndedAt.Sub(r.rep.StartedAt).Round(time.Second))
	}
	if err != nil {
		return r.rep, err
	}
	r.rep.Passed = true
	var failed []string
	for _, c := range r.rep.Checks {
		if !c.Passed {
			r.rep.Passed = false
			failed = append(failed, c.Name+": "+c.Detail)
		}
	}
	if !r.rep.Passed {
		return r.rep, fmt.Errorf("%w: %v", ErrSoakFailed, failed)
	}
	return r.rep, nil
}

// soakRun is one run's state; owned by RunSoak's goroutine.
type soakRun struct {
	cfg   SoakConfig
	deps  SoakDeps
	clock clockwork.Clock
	rep   *SoakReport

	fleet   *soakFleet
	cells   [][]*synthCell // per region
	stats   cellStats
	soakT0  time.Time
	perWant map[string]int
}

func (r *soakRun) progress(format string, a ...any) {
	fmt.Fprintf(r.deps.Progress, "soak: "+format+"\n", a...)
}

func (r *soakRun) run(ctx context.Context) error {
	cfg := r.cfg
	dir, cleanup, err := tempDir(cfg.Dir)
	if err != nil {
		return err
	}
	defer cleanup()
	r.progress("starting embedded etcd, the global pair and %d regional controllers (plaintext gRPC on loopback)", len(cfg.Regions))
	started := r.clock.Now()
	// The fleet outlives ctx until it is stopped in order below: cells
	// first, then the controllers, the globals and etcd.
	fleetCtx, cancelFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelFleet()
	if r.fleet, err = startFleet(fleetCtx, cfg, dir, r.clock, r.deps.Logger); err != nil {
		return err
	}
	defer r.fleet.stop()
	if ok, err := r.waitFor(ctx, cfg.StartTimeout, r.allOnPlan); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("bench: regions not routing on a global plan after %v", cfg.StartTimeout)
	}
	ps := readProcessStats()
	r.rep.BaselineGoroutines, r.rep.RSSSource = ps.goroutines, ps.rssSource
	r.progress("fleet up in %v: %d goroutines, RSS %.1f MiB; starting %d cells", r.clock.Since(started).Round(time.Millisecond),
		ps.goroutines, float64(ps.rss)/mib, cfg.Cells)

	stopCells := r.startCells(ctx)
	defer stopCells()
	started = r.clock.Now()
	if ok, err := r.waitFor(ctx, cfg.StartTimeout, r.allReady); err != nil {
		return err
	} else if !ok {
		s := r.sample(PhaseWarmup)
		return fmt.Errorf("bench: %d of %d cells live and %d Ready after %v", s.LiveCells, cfg.Cells, s.Ready, cfg.StartTimeout)
	}
	r.progress("%d cells Ready in %v; churning %.0f%% every %v for %v (warm-up %v)", cfg.Cells,
		r.clock.Since(started).Round(time.Millisecond), 100*max(cfg.ChurnFraction, 0), cfg.ChurnInterval, cfg.Duration, cfg.Warmup)

	stopWatch, stopChurn := r.startWatchers(ctx)
	defer stopWatch()
	defer stopChurn()
	if err := r.sampleAll(ctx); err != nil {
		return err
	}
	return r.endChecks(ctx, stopChurn, stopWatch, stopCells)
}

// startCells starts the synthetic cells, split round-robin over the
// regions; the returned func stops them and waits (idempotent).
func (r *soakRun) startCells(ctx context.Context) func() {
	cfg := r.cfg
	r.cells = make([][]*synthCell, len(cfg.Regions))
	r.perWant = map[string]int{}
	for i := range cfg.Cells {
		ri := i % len(cfg.Regions)
		reg := r.fleet.regions[ri]
		c := newSynthCell(reg.name, ri, len(r.cells[ri]), reg.ctrl.Addr(), cfg, r.clock, r.deps.Logger, &r.stats)
		r.cells[ri] = append(r.cells[ri], c)
		r.perWant[reg.name]++
	}
	cellsCtx, stopCellsCtx := context.WithCancel(context.WithoutCancel(ctx))
	var cellWG sync.WaitGroup
	for _, rc := range r.cells {
		for _, c := range rc {
			cellWG.Go(func() { c.run(cellsCtx) })
		}
	}
	return sync.OnceFunc(func() { stopCellsCtx(); cellWG.Wait() })
}

// startWatchers starts the plan watcher and the churner; each returned
// func stops one and waits for it (idempotent).
func (r *soakRun) startWatchers(ctx context.Context) (stopWatch, stopChurn func()) {
	watcher := newPlanWatcher(r.fleet.regions, r.cfg.PlanPoll, r.clock)
	watchCtx, stopWatchCtx := context.WithCancel(context.Background())
	plansCh := make(chan []RegionPlans, 1)
	go func() { plansCh <- watcher.run(watchCtx) }()
	stopWatch = sync.OnceFunc(func() { stopWatchCtx(); r.rep.Plans = <-plansCh })
	churnCtx, stopChurnCtx := context.WithCancel(ctx)
	churnDone := make(chan struct{})
	go func() {
		defer close(churnDone)
		r.churn(churnCtx)
	}()
	stopChurn = sync.OnceFunc(func() { stopChurnCtx(); <-churnDone })
	return stopWatch, stopChurn
}

// sampleAll takes the scheduled samples of the churn phase.
func (r *soakRun) sampleAll(ctx context.Context) error {
	r.soakT0 = r.clock.Now()
	WriteSampleHeader(r.deps.Progress)
	for _, at := range schedule(r.cfg.Warmup, r.cfg.Duration, r.cfg.SampleEvery) {
		if wait := at.at - r.clock.Since(r.soakT0); wait > 0 {
			select {
			case <-ctx.Done():
				return ErrInterrupted
			case <-r.clock.After(wait):
			}
		}
		r.sample(at.phase)
	}
	return nil
}

// endChecks stops the churn, waits for the cells to settle, stops them
// and judges the run.
func (r *soakRun) endChecks(ctx context.Context, stopChurn, stopWatch, stopCells func()) error {
	cfg := r.cfg
	stopChurn()
	ch := r.churnStats()
	r.progress("churn stopped (%d kills, %d returns); waiting up to %v for every cell to reconnect", ch.Kills, ch.Returns, cfg.Settle)
	reached, err := r.waitFor(ctx, cfg.Settle, r.settled)
	if err != nil {
		return err
	}
	settled := r.sample(PhaseSettled)
	stopWatch()
	r.rep.Checks = append(r.rep.Checks, flatnessChecks(cfg, r.rep.Samples)...)
	r.rep.Checks = append(r.rep.Checks, streamsCheck(settled, r.perWant, reached))

	r.progress("stopping every cell; waiting up to %v for goroutines to return to %d + %d", cfg.Settle,
		r.rep.BaselineGoroutines, cfg.GoroutineReturnAllowance)
	stopCells()
	if _, err := r.waitFor(ctx, cfg.Settle, r.drained); err != nil {
		return err
	}
	stopped := r.sample(PhaseStopped)
	r.rep.Checks = append(r.rep.Checks,
		goroutinesReturnCheck(stopped, r.rep.BaselineGoroutines, cfg.GoroutineReturnAllowance),
		streamErrorsCheck(r.churnStats(), cfg.MaxStreamErrors))
	r.rep.Checks = append(r.rep.Checks, planChecks(r.rep.Plans, r.rep.Samples, cfg.PlanTTL.Seconds())...)
	return nil
}

// scheduled is one planned sample.
type scheduled struct {
	at    time.Duration
	phase string
}

// schedule plans the samples: every step from 0 (warm-up ones before
// warmup), one at warmup, and one at the end.
func schedule(warmup, duration, step time.Duration) []scheduled {
	var out []scheduled
	for t := time.Duration(0); t < warmup; t += step {
		out = append(out, scheduled{t, PhaseWarmup})
	}
	for t := warmup; t < duration; t += step {
		out = append(out, scheduled{t, PhaseSoak})
	}
	return append(out, scheduled{duration, PhaseSoak})
}

// churn kills ChurnFraction of the live cells every ChurnInterval, the
// first round half an interval in.
func (r *soakRun) churn(ctx context.Context) {
	var all []*synthCell
	for _, rc := range r.cells {
		all = append(all, rc...)
	}
	if r.cfg.ChurnFraction <= 0 || len(all) == 0 {
		return
	}
	k := max(1, int(math.Round(r.cfg.ChurnFraction*float64(len(all)))))
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x5eed))
	// Half an interval out of phase with the samples (both start at the
	// soak's t=0), so that samples see cells down rather than always the
	// instant before a round.
	select {
	case <-ctx.Done():
		return
	case <-r.clock.After(r.cfg.ChurnInterval / 2):
	}
	kill := func() {
		killed := 0
		for _, i := range rng.Perm(len(all)) {
			if killed == k {
				break
			}
			if all[i].Kill() {
				killed++
			}
		}
	}
	kill()
	t := r.clock.NewTicker(r.cfg.ChurnInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
			kill()
		}
	}
}

func (r *soakRun) churnStats() ChurnStats {
	c := ChurnStats{Kills: r.stats.kills.Load(), Returns: r.stats.returns.Load(), Heartbeats: r.stats.heartbeats.Load(),
		StreamErrors: r.stats.streamErrors.Load(), AckErrors: r.stats.ackErrors.Load(), SlowKills: r.stats.slowKills.Load()}
	if e := r.stats.lastError.Load(); e != nil {
		c.LastError = *e
	}
	return c
}

// sample reads the process and the fleet, records the sample and prints
// its row.
func (r *soakRun) sample(phase string) Sample {
	ps := readProcessStats()
	s := Sample{Phase: phase, RSSBytes: ps.rss, HeapInuseBytes: ps.heapInuse, Goroutines: ps.goroutines, Regions: []RegionSample{}}
	if !r.soakT0.IsZero() {
		s.TSeconds = r.clock.Since(r.soakT0).Seconds()
	}
	for i, reg := range r.fleet.regions {
		rs := r.regionSample(i, reg)
		s.Streams += rs.Streams
		s.LiveCells += rs.LiveCells
		s.Ready += rs.Ready
		s.Failed += rs.Failed
		s.Regions = append(s.Regions, rs)
	}
	r.rep.Samples = append(r.rep.Samples, s)
	WriteSample(r.deps.Progress, s)
	return s
}

func (r *soakRun) regionSample(i int, reg *soakRegion) RegionSample {
	cnt := reg.counts()
	rs := RegionSample{Region: reg.name, Streams: reg.streams(), Ready: cnt.ready, Failed: cnt.failed, Source: "none"}
	for _, c := range r.cells[i] {
		if c.up.Load() {
			rs.LiveCells++
		}
	}
	if t := reg.ctrl.Routes(); t != nil {
		rs.Source = t.Source
		rs.Plan = PlanMark{Epoch: t.Epoch, Sequence: t.Sequence}
	}
	return rs
}

func (r *soakRun) allOnPlan() bool {
	for _, reg := range r.fleet.regions {
		if _, ok := applied(reg.ctrl.Routes()); !ok {
			return false
		}
	}
	return true
}

// allReady: every cell is live and Ready at its controller.
func (r *soakRun) allReady() bool {
	for i, reg := range r.fleet.regions {
		for _, c := range r.cells[i] {
			if !c.up.Load() {
				return false
			}
		}
		if reg.counts().ready != len(r.cells[i]) {
			return false
		}
	}
	return true
}

// settled: every cell is back, Ready, and each region's open streams equal
// its live cells.
func (r *soakRun) settled() bool {
	if !r.allReady() {
		return false
	}
	for i, reg := range r.fleet.regions {
		if reg.streams() != len(r.cells[i]) {
			return false
		}
	}
	return true
}

// drained: no stream is open and the goroutines are back near the
// baseline.
func (r *soakRun) drained() bool {
	for _, reg := range r.fleet.regions {
		if reg.streams() != 0 {
			return false
		}
	}
	return readProcessStats().goroutines <= r.rep.BaselineGoroutines+r.cfg.GoroutineReturnAllowance
}

// soakPoll is how often the start and end phases check their condition.
const soakPoll = 100 * time.Millisecond

// waitFor polls cond until it holds (true), timeout passes (false) or ctx
// ends (ErrInterrupted).
func (r *soakRun) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) (bool, error) {
	deadline := r.clock.After(timeout)
	t := r.clock.NewTicker(soakPoll)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false, ErrInterrupted
		case <-deadline:
			return cond(), nil
		case <-t.Chan():
		}
	}
	return true, nil
}
