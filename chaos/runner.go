package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/adminapi"
	"github.com/isobar-mesh/isobar/internal/truncate"
)

// Options time a drill. Zero fields take the defaults noted.
type Options struct {
	// Before: load before the injection (default 5 s). During: how long
	// the fault stays in (default 10 s), extended until detection and
	// reroute are seen or MaxWait passes. After: load once the fleet is
	// healthy again (default 5 s).
	Before, During, After time.Duration
	// MaxWait bounds the wait for detection and reroute (default 30 s).
	MaxWait time.Duration
	// Settle bounds the waits for a healthy fleet, before the drill and
	// after the heal (default 60 s).
	Settle time.Duration
	// Poll is the state polling period (default 20 ms): the resolution of
	// detect and reroute times.
	Poll time.Duration
	// Load shapes the requests.
	Load LoadConfig
	// Thresholds that fail the drill.
	Thresholds Thresholds
	// Progress receives a line per phase and a status line per second;
	// nil is quiet.
	Progress io.Writer
}

func (o *Options) withDefaults() {
	if o.Before == 0 {
		o.Before = 5 * time.Second
	}
	if o.During == 0 {
		o.During = 10 * time.Second
	}
	if o.After == 0 {
		o.After = 5 * time.Second
	}
	if o.MaxWait == 0 {
		o.MaxWait = 30 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = 60 * time.Second
	}
	if o.Poll == 0 {
		o.Poll = 20 * time.Millisecond
	}
}

// ErrUnhealthy: the fleet was not healthy before the drill (nothing was
// injected).
var ErrUnhealthy = errors.New("chaos: fleet not healthy")

// maxErrorKinds bounds Report.Errors per phase: a phase with many kinds
// of failure (a staged drill's "during") must not hide the kinds of
// another (its "after").
const maxErrorKinds = 8

// minRerouteWindow is the shortest window whose requests reroute_ms
// describes.
const minRerouteWindow = 2 * time.Second

// Runner runs drills against one fleet.
type Runner struct {
	Fleet Fleet
	Clock clockwork.Clock
}

func (r *Runner) clock() clockwork.Clock {
	if r.Clock == nil {
		return clockwork.NewRealClock()
	}
	return r.Clock
}

func (r *Runner) say(o Options, format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// waitHealthy polls until the fleet is healthy or settle passes.
func (r *Runner) waitHealthy(ctx context.Context, o Options) (*adminapi.FleetState, error) {
	return r.waitUntil(ctx, o, (*adminapi.FleetState).Unhealthy)
}

// waitUntil polls until why(state) is "" or settle passes (ErrUnhealthy
// with the last why).
func (r *Runner) waitUntil(ctx context.Context, o Options, why func(*adminapi.FleetState) string) (*adminapi.FleetState, error) {
	clock := r.clock()
	deadline := clock.Now().Add(o.Settle)
	for {
		st, err := r.Fleet.State(ctx)
		if err != nil {
			return nil, err
		}
		why := why(st)
		if why == "" {
			return st, nil
		}
		if !clock.Now().Before(deadline) {
			return st, fmt.Errorf("%w after %v: %s", ErrUnhealthy, o.Settle, why)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-clock.After(100 * time.Millisecond):
		}
	}
}

// waitBaseline polls until d has the baseline it measures against, or
// settle passes (ErrUnhealthy naming what is missing).
func (r *Runner) waitBaseline(ctx context.Context, o Options, d *Drill, t *target, st *adminapi.FleetState) (*adminapi.FleetState, error) {
	clock := r.clock()
	deadline := clock.Now().Add(o.Settle)
	for {
		why := d.baseline(t, st)
		if why == "" {
			return st, nil
		}
		if !clock.Now().Before(deadline) {
			return st, fmt.Errorf("%w after %v: %s", ErrUnhealthy, o.Settle, why)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-clock.After(100 * time.Millisecond):
		}
		next, err := r.Fleet.State(ctx)
		if err == nil {
			st = next
		}
	}
}

// Run runs drill d with params p. It returns an error, having injected
// nothing, when the drill is unavailable on the fleet, its parameters do
// not fit, or the fleet is not healthy; otherwise the report, passed or
// not (a heal that fails is a failure in the report, with the error).
func (r *Runner) Run(ctx context.Context, d *Drill, p Params, o Options) (*Report, error) {
	if o.During == 0 && d.during > 0 {
		o.During = d.during
	}
	o.withDefaults()
	clock := r.clock()
	t, err := r.prepare(ctx, d, p, o)
	if err != nil {
		return nil, err
	}
	st := t.before
	lc := o.Load
	if lc.Model == "" {
		lc.Model = st.Model
	}
	if d.load != nil {
		d.load(&lc, t)
	}
	var ingresses []Ingress
	for _, rs := range st.Regions {
		ingresses = append(ingresses, Ingress{Region: rs.Name, Addr: rs.Ingress})
	}
	load := StartLoad(ctx, lc, ingresses, clock)
	defer load.Stop()
	rep := &Report{Drill: d.Name, Detects: d.Detects, Reroutes: d.Reroutes}

	r.say(o, "  load running through %d ingresses; %v before the injection", len(ingresses), d.warmup+o.Before)
	early, _ := r.Fleet.State(ctx)
	if d.warmup > 0 && !r.wait(ctx, o, load, d.warmup, "warm-up") {
		return nil, ctx.Err()
	}
	t.from = clock.Now()
	if !r.wait(ctx, o, load, o.Before, "before") || !r.waitFirstOutcome(ctx, o, load) {
		return nil, ctx.Err()
	}

	// The baseline is the state just before the injection, with each
	// region's gossip RTTs the lower of then and the start of the load: one
	// smoothed sample can carry a scheduling spike of a loaded machine.
	if st, err := r.Fleet.State(ctx); err == nil {
		t.before = st
		minRTT(t.before, early)
	}
	// Inject.
	t0 := clock.Now()
	rep.InjectedAt = t0
	var cells *cellTracker
	if d.static {
		cells = r.trackCells(ctx, o, t.before)
		defer cells.stop()
	}
	if d.rolling {
		return r.runRolling(ctx, d, t, o, load, rep, cells)
	}
	if d.staged {
		return r.runStaged(ctx, d, t, o, load, rep, st)
	}
	applied, err := r.inject(ctx, d, t, o, rep)
	if err != nil {
		return nil, err
	}
	rep.Faults = applied
	ob, err := r.observe(ctx, d, t, o, load, t0)
	if err != nil {
		r.heal(context.WithoutCancel(ctx), o, applied, rep)
		return nil, err
	}
	return r.conclude(ctx, d, t, o, load, rep, cells, applied, ob)
}

// prepare waits for a healthy fleet, checks that d is available on it and
// plans its target (waiting for its baseline when it has one). It injects
// nothing.
func (r *Runner) prepare(ctx context.Context, d *Drill, p Params, o Options) (*target, error) {
	r.say(o, "▶ %s: waiting for a healthy fleet", d.Name)
	st, err := r.waitHealthy(ctx, o)
	if err != nil {
		return nil, err
	}
	if why := d.Available(st); why != "" {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, why)
	}
	if d.requires != nil {
		if why := d.requires(p, st); why != "" {
			return nil, fmt.Errorf("%w: %s: %s", ErrUnavailable, d.Name, why)
		}
	}
	t := &target{params: p, before: st, epochs: map[string]uint64{}}
	if ld, ok := st.Leader(); ok {
		t.leader = ld.Name
	}
	for _, rs := range st.Regions {
		t.epochs[rs.Name] = rs.PlanEpoch
	}
	if err := d.plan(p, st, t); err != nil {
		return nil, err
	}
	if d.baseline != nil {
		if st, err = r.waitBaseline(ctx, o, d, t, st); err != nil {
			return nil, err
		}
		t.before = st
	}
	for _, f := range t.faults {
		if !st.Supports(f.Kind) {
			return nil, fmt.Errorf("%w: %s needs %s", ErrUnavailable, d.Name, f.Kind)
		}
	}
	return t, nil
}

// inject applies t's faults in order; when one fails it heals those
// applied and returns the error.
func (r *Runner) inject(ctx context.Context, d *Drill, t *target, o Options, rep *Report) ([]adminapi.Fault, error) {
	var applied []adminapi.Fault
	for _, f := range t.faults {
		res, err := r.Fleet.Inject(ctx, f)
		if err != nil && f.Kind == adminapi.FaultKillLeader && r.waitLeader(ctx, o) {
			// No member led at that instant (an election under way, a
			// lease renewed late on a loaded machine): kill the next one.
			res, err = r.Fleet.Inject(ctx, f)
		}
		if err != nil {
			r.heal(context.WithoutCancel(ctx), o, applied, rep)
			return nil, fmt.Errorf("chaos: %s: inject %s: %w (healed what was injected)", d.Name, f, err)
		}
		applied = append(applied, res.Fault)
		r.say(o, "  ⚡ injected %s", res.Fault)
	}
	return applied, nil
}

// observation is when a drill saw its fault detected and rerouted around
// (zero: not seen), from the injection at t0.
type observation struct {
	t0, detectAt, rerouteAt time.Time
}

// observe polls the fleet until the fault is detected and rerouted around
// (bounded by MaxWait), and for at least During. It returns ctx's error
// when ctx ends first.
func (r *Runner) observe(ctx context.Context, d *Drill, t *target, o Options, load *Load, t0 time.Time) (observation, error) {
	clock := r.clock()
	var detectAt, rerouteAt time.Time
	tick := clock.NewTicker(o.Poll)
	lastSay := t0
	for {
		now := clock.Now()
		st, err := r.Fleet.State(ctx)
		if err == nil {
			// Stamped once the state is read: every request that starts
			// later met the data plane as read, or a newer one.
			seen := clock.Now()
			if d.detected != nil && detectAt.IsZero() && d.detected(t, st) {
				detectAt = seen
				r.say(o, "  ✓ detected after %.0f ms: %s", float64(seen.Sub(t0))/1e6, d.Detects)
			}
			if d.rerouted != nil && rerouteAt.IsZero() && d.rerouted(t, st) {
				rerouteAt = seen
				r.say(o, "  ✓ rerouted after %.0f ms: %s", float64(seen.Sub(t0))/1e6, d.Reroutes)
			}
		}
		seen := (d.detected == nil || !detectAt.IsZero()) && (d.rerouted == nil || !rerouteAt.IsZero())
		el := now.Sub(t0)
		if (seen && el >= o.During) || el >= max(o.During, o.MaxWait) {
			break
		}
		if now.Sub(lastSay) >= time.Second {
			lastSay = now
			r.status(o, load, "during", el)
		}
		select {
		case <-ctx.Done():
			tick.Stop()
			return observation{}, ctx.Err()
		case <-tick.Chan():
		}
	}
	tick.Stop()

	return observation{t0: t0, detectAt: detectAt, rerouteAt: rerouteAt}, nil
}

// conclude heals, waits for health, lets the load run After and measures
// the drill into rep.
func (r *Runner) conclude(ctx context.Context, d *Drill, t *target, o Options, load *Load, rep *Report, cells *cellTracker,
	applied []adminapi.Fault, ob observation) (*Report, error) {
	clock := r.clock()
	t0, detectAt, rerouteAt := ob.t0, ob.detectAt, ob.rerouteAt
	// Heal and wait for health.
	t1 := clock.Now()
	r.heal(ctx, o, applied, rep)
	r.say(o, "  waiting for the fleet to be healthy again")
	var recovered time.Time
	if _, err := r.waitHealthy(ctx, o); err != nil {
		rep.Failures = append(rep.Failures, "not healthy after the heal: "+err.Error())
	} else {
		recovered = clock.Now()
		rep.HealedMS = durMS(recovered.Sub(t1))
	}
	if !recovered.IsZero() && !r.wait(ctx, o, load, o.After, "after") {
		return nil, ctx.Err()
	}
	end := clock.Now()
	outcomes, shed := load.Stop()

	if !detectAt.IsZero() {
		rep.DetectMS = durMS(detectAt.Sub(t0))
	} else if d.detected != nil {
		rep.Failures = append(rep.Failures, fmt.Sprintf("not detected within %v (%s)", max(o.During, o.MaxWait), d.Detects))
	}
	if !rerouteAt.IsZero() {
		rep.RerouteAtMS = durMS(rerouteAt.Sub(t0))
	} else if d.rerouted != nil {
		rep.Failures = append(rep.Failures, fmt.Sprintf("not rerouted within %v (%s)", max(o.During, o.MaxWait), d.Reroutes))
	}
	windowEnd := t0.Add(minRerouteWindow)
	if rerouteAt.After(windowEnd) {
		windowEnd = rerouteAt
	}
	r.measure(rep, d, t, outcomes, marks{t0: t0, t1: t1, recovered: recovered, end: end, windowEnd: windowEnd, rerouteAt: rerouteAt})
	rep.Requests.ClientShed = shed
	r.finish(o, d, rep, cells)
	return rep, nil
}

// finish applies the static-stability checks and the thresholds and
// settles the verdict.
func (r *Runner) finish(o Options, d *Drill, rep *Report, cells *cellTracker) {
	if cells != nil {
		rep.Cells = cells.stop()
		staticChecks(rep)
	}
	o.Thresholds.check(rep)
	rep.Passed = len(rep.Failures) == 0
	if rep.Passed {
		r.say(o, "  ✔ %s passed", d.Name)
	} else {
		r.say(o, "  ✘ %s failed", d.Name)
	}
}

// heal undoes faults in reverse order; failures go into the report.
func (r *Runner) heal(ctx context.Context, o Options, faults []adminapi.Fault, rep *Report) {
	for i := len(faults) - 1; i >= 0; i-- {
		if _, err := r.Fleet.Heal(ctx, faults[i]); err != nil {
			rep.Failures = append(rep.Failures, fmt.Sprintf("heal %s: %v", faults[i], err))
			continue
		}
		r.say(o, "  ✚ healed %s", faults[i])
	}
}

// wait lets the load run for d, with a status line per second.
// minRTT lowers each region's gossip RTT in st to the one in other, where
// other has it.
func minRTT(st, other *adminapi.FleetState) {
	if other == nil {
		return
	}
	for i := range st.Regions {
		rs := &st.Regions[i]
		o, ok := other.Region(rs.Name)
		if !ok {
			continue
		}
		for peer, v := range rs.RTTms {
			if w, ok := o.RTTms[peer]; ok && w < v {
				rs.RTTms[peer] = w
			}
		}
	}
}

func (r *Runner) wait(ctx context.Context, o Options, load *Load, d time.Duration, phase string) bool {
	clock := r.clock()
	end := clock.Now().Add(d)
	for {
		left := end.Sub(clock.Now())
		if left <= 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-clock.After(min(left, time.Second)):
			r.status(o, load, phase, d-max(0, end.Sub(clock.Now())))
		}
	}
}

// waitLeader polls until a global member leads, bounded by MaxWait;
// false when none does by then or ctx ends.
func (r *Runner) waitLeader(ctx context.Context, o Options) bool {
	clock := r.clock()
	end := clock.Now().Add(o.MaxWait)
	for clock.Now().Before(end) {
		if st, err := r.Fleet.State(ctx); err == nil {
			if _, ok := st.Leader(); ok {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-clock.After(50 * time.Millisecond):
		}
	}
	return false
}

// waitFirstOutcome extends the before phase, when no request has ended
// yet (a loaded machine), until one has or MaxWait passes: the drill's
// baseline needs at least one. false when ctx ends first.
func (r *Runner) waitFirstOutcome(ctx context.Context, o Options, load *Load) bool {
	clock := r.clock()
	end := clock.Now().Add(o.MaxWait)
	for {
		if done, _ := load.Progress(); done > 0 || !clock.Now().Before(end) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-clock.After(50 * time.Millisecond):
		}
	}
}

func (r *Runner) status(o Options, load *Load, phase string, el time.Duration) {
	done, failed := load.Progress()
	r.say(o, "  … %-6s %5.1fs  requests %d, failed %d", phase, el.Seconds(), done, failed)
}

// noteError counts failed request o of phase name in rep.Errors, by
// reason, keeping at most maxErrorKinds reasons per phase.
func noteError(rep *Report, name string, o Outcome) {
	reason := fmt.Sprintf("%s: HTTP %d: %s", name, o.Status, truncate.Marked(o.Error, 120, "…"))
	if o.Cell != "" {
		reason = fmt.Sprintf("%s: HTTP %d from %s via %s: %s", name, o.Status, o.Cell, o.Ingress, truncate.Marked(o.Error, 120, "…"))
	}
	kinds := 0
	for k := range rep.Errors {
		if strings.HasPrefix(k, name+": ") {
			kinds++
		}
	}
	if _, ok := rep.Errors[reason]; ok || kinds < maxErrorKinds {
		if rep.Errors == nil {
			rep.Errors = map[string]int{}
		}
		rep.Errors[reason]++
	}
}

// phase is the requests a drill started in one phase.
type phase struct {
	n, ok int
	ttft  []time.Duration
}

// setPhases fills rep's success rates, request counts and TTFT
// percentiles per phase.
func setPhases(rep *Report, before, during, after phase) {
	frac := func(p phase) *float64 {
		if p.n == 0 {
			return nil
		}
		return fptr(float64(p.ok) / float64(p.n))
	}
	rep.Success = Success{Before: frac(before), During: frac(during), After: frac(after)}
	rep.Requests.Before, rep.Requests.During, rep.Requests.After = before.n, during.n, after.n
	rep.TTFTms = map[string]Percentiles{}
	for name, p := range map[string]phase{"before": before, "during": during, "after": after} {
		if q := percentiles(p.ttft); q != nil {
			rep.TTFTms[name] = *q
		}
	}
}

// marks are a drill's instants: the injection (t0), the heal (t1), the
// fleet healthy again (recovered, zero: never), the end of the load, the
// end of the exposure window and the reroute (zero: not seen).
type marks struct {
	t0, t1, recovered, end, windowEnd, rerouteAt time.Time
}

// measure fills the request figures from the outcomes.
func (r *Runner) measure(rep *Report, d *Drill, t *target, os []Outcome, m marks) {
	t0, t1, recovered, end, windowEnd := m.t0, m.t1, m.recovered, m.end, m.windowEnd
	var before, during, after phase
	var exposed []time.Duration
	var long, leaked int
	maxLen := 0
	if d.leak {
		maxLen = t.faults[0].MaxModelLen
	}
	for _, o := range os {
		if o.Start.Before(t.from) {
			continue // the warm-up's: in no phase
		}
		var ph *phase
		name := "heal" // between the heal and a healthy fleet
		switch {
		case o.Start.Before(t0) && !o.End.Before(t0):
			// In flight at the injection: neither the baseline nor the
			// drill's own figures.
			name = "in flight"
			rep.Requests.InFlight++
			if !o.OK {
				rep.Requests.InFlightFailed++
			}
		case o.Start.Before(t0):
			ph, name = &before, "before"
		case o.Start.Before(t1):
			ph, name = &during, "during"
		case !recovered.IsZero() && !o.Start.Before(recovered) && o.Start.Before(end):
			ph, name = &after, "after"
		}
		if !o.OK {
			noteError(rep, name, o)
		}
		if !o.Start.Before(t0) {
			if !o.OK {
				rep.Lost++
			}
			if o.Status == http.StatusNotFound {
				rep.NoRoute++
			}
			if o.OK && o.Start.Before(windowEnd) {
				exposed = append(exposed, o.TTFT)
			}
			if o.Ingress != o.Home {
				rep.Requests.FailedOver++
			}
		}
		if d.leak && o.Start.Before(t1) && !o.Start.Before(t0) && o.Prompt > maxLen {
			long++
			if slices.Contains(t.cells, o.Cell) || o.Status == 400 {
				leaked++
				if !m.rerouteAt.IsZero() && !o.Start.Before(m.rerouteAt) {
					rep.LeakedAfterReroute++
				}
			}
		}
		if ph == nil {
			continue
		}
		ph.n++
		if o.OK {
			ph.ok++
			ph.ttft = append(ph.ttft, o.TTFT)
		}
	}
	setPhases(rep, before, during, after)
	rep.RerouteMS = percentiles(exposed)
	if d.leak && long > 0 {
		rep.LeakRate = fptr(float64(leaked) / float64(long))
	}
}
