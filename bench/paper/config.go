package paper

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/isobar-mesh/isobar/bench/load"
	"github.com/isobar-mesh/isobar/sim"
)

// Site is one datacenter of the flat topology.
type Site struct {
	Name string
	// OneWay is the one-way network delay between the ingress and the
	// site's cells.
	OneWay time.Duration
}

// Topology is the published evaluation's: one ingress in front of
// CellsPerSite cells in each site.
type Topology struct {
	Sites        []Site
	CellsPerSite int
}

// Cells is the number of cells.
func (t Topology) Cells() int { return len(t.Sites) * t.CellsPerSite }

// SiteOf is the site index of cell i.
func (t Topology) SiteOf(i int) int { return i / t.CellsPerSite }

// PaperTopology is 9 cells in 3 sites at 2, 12 and 20 ms one way from the
// ingress.
func PaperTopology() Topology {
	return Topology{
		Sites: []Site{
			{Name: "us-east", OneWay: 2 * time.Millisecond},
			{Name: "us-central", OneWay: 12 * time.Millisecond},
			{Name: "us-west", OneWay: 20 * time.Millisecond},
		},
		CellsPerSite: 3,
	}
}

// DataPlane holds the fixed parameters of the ingress and the control
// loop. They are the same for every policy where they apply.
type DataPlane struct {
	// HCInterval and HCUnhealthy: the baselines' active health checks
	// (Envoy: interval, unhealthy_threshold). Defaults 2 s and 2.
	HCInterval  time.Duration
	HCUnhealthy int
	// NumRetries, EjectFor: isobar's pushed cluster (regional/xds
	// defaults): retries on connect failure, base ejection time after one
	// local-origin failure. Defaults 2 and 10 s.
	NumRetries int
	EjectFor   time.Duration
	// Heartbeat is the cellagent heartbeat and regional cycle period.
	// Default 500 ms.
	Heartbeat time.Duration
	// Window is the cellagent's signal window (TTFT P95, error rate).
	// Default 10 s (cellagent.DefaultWindow).
	Window time.Duration
	// KillDetect is how long after an engine dies the regional controller
	// has its FAILED heartbeat (the cellagent's engine watch). Default
	// 10 ms; the live lab's kill-cell drill measures engine SIGKILL to
	// endpoint removed at about 6 ms.
	KillDetect time.Duration
	// PushDelay is projection to weights in effect at the ingress (xDS
	// push). Default 5 ms.
	PushDelay time.Duration
}

// DefaultDataPlane returns the documented defaults.
func DefaultDataPlane() DataPlane {
	return DataPlane{
		HCInterval: 2 * time.Second, HCUnhealthy: 2,
		NumRetries: 2, EjectFor: 10 * time.Second,
		Heartbeat: 500 * time.Millisecond, Window: 10 * time.Second,
		KillDetect: 10 * time.Millisecond, PushDelay: 5 * time.Millisecond,
	}
}

// Config is one evaluation setup. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	Topology  Topology
	Profile   sim.Profile
	DataPlane DataPlane
}

// DefaultConfig is the published evaluation's setup with the frozen
// 70b-awq-flat profile (sim.Profile70BFlat: calibrated on rr in this
// topology).
func DefaultConfig() Config {
	return Config{Topology: PaperTopology(), Profile: sim.Profile70BFlat(), DataPlane: DefaultDataPlane()}
}

// ErrInvalidConfig is wrapped by Validate's errors.
var ErrInvalidConfig = errors.New("paper: invalid config")

// Validate reports the first problem.
func (c Config) Validate() error {
	d := c.DataPlane
	switch {
	case len(c.Topology.Sites) == 0 || c.Topology.CellsPerSite < 1:
		return fmt.Errorf("%w: the topology needs at least one site and one cell per site", ErrInvalidConfig)
	case d.HCInterval <= 0 || d.HCUnhealthy < 1:
		return fmt.Errorf("%w: health checks need an interval > 0 and a threshold >= 1", ErrInvalidConfig)
	case d.Heartbeat <= 0 || d.Window <= 0:
		return fmt.Errorf("%w: heartbeat and window must be > 0", ErrInvalidConfig)
	case d.NumRetries < 0 || d.EjectFor < 0 || d.KillDetect < 0 || d.PushDelay < 0:
		return fmt.Errorf("%w: retries, ejection, detection and push delays must be >= 0", ErrInvalidConfig)
	}
	for _, s := range c.Topology.Sites {
		if s.OneWay < 0 {
			return fmt.Errorf("%w: site %s: negative one-way delay", ErrInvalidConfig, s.Name)
		}
	}
	return c.Profile.Validate()
}

// mixPart is one class of a workload and its share of the requests.
type mixPart struct {
	class load.Class
	share float64
}

// workload describes a trial's arrivals.
type workload struct {
	mix []mixPart
	// rps is the steady Poisson rate; bursts of a class's BurstSize come
	// on top every BurstEvery (adversarial_spike).
	rps      float64
	duration time.Duration // arrivals stop here
	seed     uint64
}

// generate draws the trial's requests. The same workload gives the same
// requests for every policy (arrival times, shapes and engine frontend
// latencies all come from seed).
func (w workload) generate(p sim.Profile) []request {
	rng := rand.New(rand.NewPCG(w.seed, 0xa771))
	fe := rand.New(rand.NewPCG(w.seed, 0xfe))
	samplers := make([]*load.Sampler, len(w.mix))
	var total float64
	for i, m := range w.mix {
		samplers[i] = load.NewSampler(m.class, w.seed+uint64(i)*7919)
		total += m.share
	}
	pickClass := func() int {
		x := rng.Float64() * total
		for i, m := range w.mix {
			if x -= m.share; x < 0 {
				return i
			}
		}
		return len(w.mix) - 1
	}
	var out []request
	add := func(at time.Duration, c int, burst bool) {
		sh := samplers[c].Next(at)
		out = append(out, request{arrive: at, prompt: sh.Prompt, out: sh.Output, class: c, burst: burst,
			frontend: p.FrontendDelay(fe), cell: -1})
	}
	if w.rps > 0 {
		for t := time.Duration(0); ; {
			t += time.Duration(rng.ExpFloat64() / w.rps * float64(time.Second))
			if t >= w.duration {
				break
			}
			add(t, pickClass(), false)
		}
	}
	for i, m := range w.mix {
		if m.class.BurstSize <= 0 || m.class.BurstEvery <= 0 {
			continue
		}
		for t := m.class.BurstEvery; t < w.duration; t += m.class.BurstEvery {
			for k := range m.class.BurstSize {
				// A burst lands within 100 ms.
				add(t+time.Duration(k)*2*time.Millisecond, i, true)
			}
		}
	}
	sortRequests(out)
	return out
}

func sortRequests(rs []request) {
	slices.SortStableFunc(rs, func(a, b request) int { return cmp.Compare(a.arrive, b.arrive) })
}

// digest is a hash of the requests' arrival times and shapes: equal for
// every policy of a trial, by construction.
func digest(rs []request) string {
	h := fnv.New64a()
	var b [8]byte
	put := func(v int64) {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		h.Write(b[:])
	}
	for _, r := range rs {
		put(int64(r.arrive))
		put(int64(r.prompt))
		put(int64(r.out))
		put(int64(r.frontend))
	}
	return fmt.Sprintf("%016x", h.Sum64())
}
