package chaos

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/isobar-mesh/isobar/adminapi"
)

// Static stability (docs/design.md §5.4): a restarted control plane is
// invisible to traffic. The restart drills check it from what the users
// and the data planes saw: no request answered "no route", no region's
// data plane on fewer of its own cells than before, and success during the
// drill at least staticMinSuccess.

// cellTracker polls the fleet on its own goroutine from the injection to
// the end of a drill and keeps, per region, the fewest of its own cells
// its data plane routed to. stop ends it and returns the counts.
type cellTracker struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu     sync.Mutex
	counts map[string]CellCounts
}

// localEndpoints counts the region's own cells in its data plane.
func localEndpoints(rs *adminapi.RegionState) int {
	n := 0
	for _, e := range rs.Endpoints {
		if e.Region == rs.Name {
			n++
		}
	}
	return n
}

func (r *Runner) trackCells(ctx context.Context, o Options, before *adminapi.FleetState) *cellTracker {
	ctx, cancel := context.WithCancel(ctx)
	ct := &cellTracker{cancel: cancel, done: make(chan struct{}), counts: map[string]CellCounts{}}
	for i := range before.Regions {
		n := localEndpoints(&before.Regions[i])
		ct.counts[before.Regions[i].Name] = CellCounts{Before: n, Min: n, After: n}
	}
	clock := r.clock()
	go func() {
		defer close(ct.done)
		// Twice the drill's poll: the runner polls the same admin API.
		tick := clock.NewTicker(2 * o.Poll)
		defer tick.Stop()
		for {
			if st, err := r.Fleet.State(ctx); err == nil {
				ct.note(st)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.Chan():
			}
		}
	}()
	return ct
}

func (ct *cellTracker) note(st *adminapi.FleetState) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for i := range st.Regions {
		rs := &st.Regions[i]
		c, ok := ct.counts[rs.Name]
		if !ok {
			continue
		}
		n := localEndpoints(rs)
		c.Min, c.After = min(c.Min, n), n
		ct.counts[rs.Name] = c
	}
}

// stop ends the polling and returns the counts. Idempotent.
func (ct *cellTracker) stop() map[string]CellCounts {
	ct.once.Do(func() {
		ct.cancel()
		<-ct.done
	})
	ct.mu.Lock()
	defer ct.mu.Unlock()
	out := make(map[string]CellCounts, len(ct.counts))
	for k, v := range ct.counts {
		out[k] = v
	}
	return out
}

// staticChecks appends the static-stability failures to rep.
func staticChecks(rep *Report) {
	if rep.NoRoute > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d requests answered 404 no route: a model vanished from a data plane's routing", rep.NoRoute))
	}
	names := make([]string, 0, len(rep.Cells))
	for n := range rep.Cells {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if c := rep.Cells[n]; c.Min < c.Before {
			rep.Failures = append(rep.Failures, fmt.Sprintf("region %s's data plane fell to %d of its %d cells", n, c.Min, c.Before))
		}
	}
	if s := rep.Success.During; s != nil && *s < staticMinSuccess {
		rep.Failures = append(rep.Failures, fmt.Sprintf("success during the drill %.4f, want at least %g", *s, staticMinSuccess))
	}
}

// runRolling injects the faults one at a time: each stays in for
// o.During once detected (its region's controller down), is healed, and
// the fleet is healthy again before the next. The report covers the whole
// sequence: during runs from the first injection to the last heal.
func (r *Runner) runRolling(ctx context.Context, d *Drill, t *target, o Options, load *Load, rep *Report, cells *cellTracker) (*Report, error) {
	clock := r.clock()
	t0 := rep.InjectedAt
	var detectAt, t1, recovered time.Time
	for i, f := range t.faults {
		res, err := r.Fleet.Inject(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("chaos: %s: inject %s: %w", d.Name, f, err)
		}
		rep.Faults = append(rep.Faults, res.Fault)
		r.say(o, "  ⚡ injected %s (%d of %d)", res.Fault, i+1, len(t.faults))
		step := &target{params: t.params, faults: []adminapi.Fault{res.Fault}, regions: []string{f.Region}, before: t.before}
		start := clock.Now()
		seen := false
		tick := clock.NewTicker(o.Poll)
		for {
			now := clock.Now()
			if !seen {
				if st, err := r.Fleet.State(ctx); err == nil && d.detected(step, st) {
					seen = true
					if detectAt.IsZero() {
						detectAt = now
						r.say(o, "  ✓ detected after %.0f ms: %s", float64(now.Sub(t0))/1e6, d.Detects)
					}
				}
			}
			if (seen && now.Sub(start) >= o.During) || now.Sub(start) >= max(o.During, o.MaxWait) {
				break
			}
			select {
			case <-ctx.Done():
				tick.Stop()
				r.heal(context.WithoutCancel(ctx), o, []adminapi.Fault{res.Fault}, rep)
				return nil, ctx.Err()
			case <-tick.Chan():
			}
		}
		tick.Stop()
		if !seen {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: not detected within %v (%s)", f, max(o.During, o.MaxWait), d.Detects))
		}
		t1 = clock.Now()
		r.heal(ctx, o, []adminapi.Fault{res.Fault}, rep)
		if _, err := r.waitHealthy(ctx, o); err != nil {
			rep.Failures = append(rep.Failures, fmt.Sprintf("not healthy after healing %s: %v", f, err))
			recovered = time.Time{}
			break
		}
		recovered = clock.Now()
	}
	if !recovered.IsZero() {
		rep.HealedMS = durMS(recovered.Sub(t1))
		if !r.wait(ctx, o, load, o.After, "after") {
			return nil, ctx.Err()
		}
	}
	end := clock.Now()
	outcomes, shed := load.Stop()
	if !detectAt.IsZero() {
		rep.DetectMS = durMS(detectAt.Sub(t0))
	}
	r.measure(rep, d, t, outcomes, marks{t0: t0, t1: t1, recovered: recovered, end: end, windowEnd: t0.Add(minRerouteWindow)})
	rep.Requests.ClientShed = shed
	r.finish(o, d, rep, cells)
	return rep, nil
}
