package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/regional"
)

// PlanMark is a plan's position: its fencing epoch and, within the
// epoch, its sequence. Plans are ordered by epoch, then sequence.
type PlanMark struct {
	Epoch    uint64 `json:"epoch"`
	Sequence uint64 `json:"sequence"`
}

// Less orders plan marks.
func (m PlanMark) Less(o PlanMark) bool {
	return m.Epoch < o.Epoch || (m.Epoch == o.Epoch && m.Sequence < o.Sequence)
}

func (m PlanMark) String() string { return fmt.Sprintf("%d:%d", m.Epoch, m.Sequence) }

// RegionPlans is what the plan watcher saw of one region's applied plans.
type RegionPlans struct {
	Region string   `json:"region"`
	First  PlanMark `json:"first"`
	Last   PlanMark `json:"last"`
	// Changes counts the new plans the watcher saw applied (it polls, so
	// plans applied within one poll count once).
	Changes int `json:"changes"`
	// Epochs are the distinct fencing epochs applied, in order: more than
	// one means the global leadership changed during the run.
	Epochs []uint64 `json:"epochs"`
	// Regressions lists the times the applied plan went backwards.
	Regressions []string `json:"regressions"`
	// NotOnPlan counts polls that found the region routing on something
	// else than a plan (fallback or local).
	NotOnPlan int `json:"not_on_plan"`
	// MaxGapSeconds is the longest time without a new plan.
	MaxGapSeconds float64 `json:"max_gap_seconds"`
	// Plans counts the controller's plans by result (applied, stale,
	// expired, invalid), over the whole run.
	Plans map[string]float64 `json:"plans_by_result"`
}

// planWatcher polls every region's route table and keeps each region's
// plan history. Its goroutine (run) owns the history until it returns.
type planWatcher struct {
	regions []*soakRegion
	poll    time.Duration
	clock   clockwork.Clock

	hist    []RegionPlans
	changed []time.Time
}

func newPlanWatcher(regions []*soakRegion, poll time.Duration, clock clockwork.Clock) *planWatcher {
	w := &planWatcher{regions: regions, poll: poll, clock: clock,
		hist: make([]RegionPlans, len(regions)), changed: make([]time.Time, len(regions))}
	now := clock.Now()
	for i, r := range regions {
		w.hist[i].Region = r.name
		w.hist[i].Regressions = []string{}
		w.hist[i].Epochs = []uint64{}
		if m, ok := applied(r.ctrl.Routes()); ok {
			w.hist[i].First, w.hist[i].Last = m, m
			w.hist[i].Epochs = append(w.hist[i].Epochs, m.Epoch)
		}
		w.changed[i] = now
	}
	return w
}

// applied returns the plan mark a route table carries, when it is a plan.
func applied(t *regional.RouteTable) (PlanMark, bool) {
	if t == nil || t.Source != regional.RoutesPlan {
		return PlanMark{}, false
	}
	return PlanMark{Epoch: t.Epoch, Sequence: t.Sequence}, true
}

// run polls until ctx ends and returns the history.
func (w *planWatcher) run(ctx context.Context) []RegionPlans {
	t := w.clock.NewTicker(w.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			w.observe(w.clock.Now())
			for i, r := range w.regions {
				w.hist[i].Plans = r.plansByResult()
			}
			return w.hist
		case <-t.Chan():
			w.observe(w.clock.Now())
		}
	}
}

const maxRegressionsKept = 10

func (w *planWatcher) observe(now time.Time) {
	for i, r := range w.regions {
		h := &w.hist[i]
		m, ok := applied(r.ctrl.Routes())
		switch {
		case !ok:
			h.NotOnPlan++
		case m.Less(h.Last):
			if len(h.Regressions) < maxRegressionsKept {
				h.Regressions = append(h.Regressions, fmt.Sprintf("%s after %s", m, h.Last))
			}
			h.Last, w.changed[i] = m, now
		case h.Last.Less(m):
			if h.First == (PlanMark{}) {
				h.First = m
			}
			if n := len(h.Epochs); n == 0 || h.Epochs[n-1] != m.Epoch {
				h.Epochs = append(h.Epochs, m.Epoch)
			}
			h.Last, w.changed[i] = m, now
			h.Changes++
		}
		h.MaxGapSeconds = max(h.MaxGapSeconds, now.Sub(w.changed[i]).Seconds())
	}
}
