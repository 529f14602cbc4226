package lab

import (
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/isobar-mesh/isobar/regional"
)

// planRecorder records, per region, each distinct routing its controller
// had in force at a sample, for the report. Its mutex guards the record;
// the run loop notes and the report reads.
type planRecorder struct {
	started time.Time // the report's time origin

	mu    sync.Mutex
	plans map[string][]PlanSeen
}

// note records each region's routing (routes by region name) when it
// differs from the last one recorded for that region.
func (p *planRecorder) note(now time.Time, routes map[string]*regional.RouteTable) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.plans == nil {
		p.plans = map[string][]PlanSeen{}
	}
	for name, rt := range routes {
		rr := routesReport(rt)
		seen := p.plans[name]
		if n := len(seen); n > 0 && reflect.DeepEqual(seen[n-1].RoutesReport, rr) || len(seen) >= maxPlansSeen {
			continue
		}
		p.plans[name] = append(seen, PlanSeen{AtS: now.Sub(p.started).Seconds(), RoutesReport: rr})
	}
}

// seen returns a copy of what was recorded for region.
func (p *planRecorder) seen(region string) []PlanSeen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.plans[region])
}

// stopper is the lab's shutdown stack: components register their stop as
// they start, Stop runs them in reverse order. Its mutex guards the stack;
// heals push onto it while the lab runs.
type stopper struct {
	mu    sync.Mutex
	stops []func()
}

func (s *stopper) push(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stops = append(s.stops, f)
}

// stopAll runs and drops every registered stop, the last first.
func (s *stopper) stopAll() {
	s.mu.Lock()
	stops := s.stops
	s.stops = nil
	s.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}
