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
// loop. They are the same for every policy where they apply: what an
// operator configures on stock Envoy (health checks, retries, a retry
// budget, outlier detection, worker threads) is given to the baselines
// and to isobar alike; only rr-plain keeps the published baseline's
// health checks alone.
type DataPlane struct {
	// HCInterval and HCUnhealthy: active health checks (Envoy: interval,
	// unhealthy_threshold) of the baselines. Defaults 2 s and 2. Isobar's
	// cluster has none: its control plane removes dead endpoints.
	HCInterval  time.Duration
	HCUnhealthy int
	// NumRetries: retries on connect failure, refused stream and reset
	// before the first byte, on another host (Envoy's previous_hosts
	// predicate). Default 1. Every policy but rr-plain.
	NumRetries int
	// RetryBudgetPercent and RetryBudgetMin: Envoy's retry budget — at
	// most max(RetryBudgetMin, RetryBudgetPercent % of the requests in
	// flight) retries in flight at once. Defaults 20 and 3.
	RetryBudgetPercent float64
	RetryBudgetMin     int
	// EjectConsecutive, EjectFor, MaxEjectPercent: outlier detection on
	// consecutive local-origin failures (refused or reset). An ejected
	// host is out for EjectFor × (times ejected), and at most
	// MaxEjectPercent of the hosts are out at once. Defaults 1, 10 s and
	// 50 (regional/xds's defaults). Every policy but rr-plain.
	EjectConsecutive int
	EjectFor         time.Duration
	MaxEjectPercent  int
	// Eject5xx: outlier detection's consecutive_5xx — a host answering
	// this many 5xx in a row is ejected as above (regional/xds
	// OutlierConsecutive5xx, default 5). Only the retry-storm stage's
	// brownout answers 5xx. The baselines enforce it, as stock Envoy does
	// (enforcing_consecutive_5xx 100); isobar's clusters do only with
	// IsobarEject5xx (regional/xds OutlierEnforcing5xx, default 0: the
	// regional controller's capacity-bounded penalty ejects instead).
	Eject5xx       int
	IsobarEject5xx bool
	// MaxInflightPerEndpoint is isobar gateway's per-endpoint in-flight
	// cap (gateway.Config.MaxInflightPerEndpoint, default 64): an arrival
	// whose every eligible endpoint is at it is saturated (429, or the
	// flow-control queue). Applied in the overload stage, where it binds.
	MaxInflightPerEndpoint int
	// Workers is the number of Envoy worker threads at the ingress: each
	// has its own load balancer (round-robin index, EDF schedule), while
	// requests in flight per host are shared. Default 4.
	Workers int
	// ChoiceCount is LEAST_REQUEST's choice_count. Default 2.
	ChoiceCount int
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
	// DecodeCost is isobar's pick's cost per request in flight
	// (placement.Config.DecodeCost, isobar gateway --isobar-decode-cost).
	// 0: placement's default (25 ms).
	DecodeCost time.Duration
	// AffinityBand is isobar-affinity's and precise-prefix's band
	// (placement.Config.AffinityBand, isobar gateway --affinity-band).
	// Nil: placement's default (0.25).
	AffinityBand *float64 `json:",omitempty"`
}

// DefaultDataPlane returns the documented defaults.
func DefaultDataPlane() DataPlane {
	return DataPlane{
		HCInterval: 2 * time.Second, HCUnhealthy: 2,
		NumRetries: 1, RetryBudgetPercent: 20, RetryBudgetMin: 3,
		EjectConsecutive: 1, EjectFor: 10 * time.Second, MaxEjectPercent: 50, Eject5xx: 5, MaxInflightPerEndpoint: 64,
		Workers: 4, ChoiceCount: 2,
		Heartbeat: 500 * time.Millisecond, Window: 10 * time.Second,
		KillDetect: 10 * time.Millisecond, PushDelay: 5 * time.Millisecond,
	}
}

// Names of the two grounds every report runs.
const (
	// GroundPhysics is the physics engine: rtx-pro-6000 with
	// llama-3.1-70b-awq (sim.PhysicsProfile), vLLM's scheduler defaults
	// and efficiencies fitted on single-engine load curves only.
	GroundPhysics = "physics"
	// GroundPaperFit is the frozen 70b-awq-flat profile
	// (sim.Profile70BFlat), fitted once on the published rr rows; kept for
	// continuity.
	GroundPaperFit = "paper-fit"
)

// Config is one evaluation ground. The zero value is not valid; start
// from DefaultConfig or Grounds.
type Config struct {
	// Ground names the ground in the report.
	Ground    string
	Topology  Topology
	Profile   sim.Profile
	DataPlane DataPlane
	// SLOHigh is the bisection's upper bound in RPS. Default 48.
	SLOHigh float64
	// Physics is the physics engine's spec when Profile is one (nil for a
	// fitted profile). The heterogeneous stages build their GPUs from it,
	// so they run on physics grounds only.
	Physics *sim.PhysicsSpec `json:",omitempty"`
}

// DefaultConfig is the paper-fit ground: the published evaluation's setup
// with the frozen 70b-awq-flat profile.
func DefaultConfig() Config {
	return Config{Ground: GroundPaperFit, Topology: PaperTopology(), Profile: sim.Profile70BFlat(), DataPlane: DefaultDataPlane(), SLOHigh: 48}
}

// PhysicsConfig is the physics ground: the same topology and data plane
// with rtx-pro-6000 + llama-3.1-70b-awq on the physics engine.
func PhysicsConfig() (Config, error) {
	spec := sim.PhysicsSpec{GPU: "rtx-pro-6000", Model: "llama-3.1-70b-awq", TP: 1, KVDtype: "fp16"}
	p, err := sim.PhysicsProfile(spec)
	if err != nil {
		return Config{}, err
	}
	return Config{Ground: GroundPhysics, Topology: PaperTopology(), Profile: p, DataPlane: DefaultDataPlane(), SLOHigh: 64, Physics: &spec}, nil
}

// Grounds returns both grounds, physics first.
func Grounds() ([]Config, error) {
	ph, err := PhysicsConfig()
	if err != nil {
		return nil, err
	}
	return []Config{ph, DefaultConfig()}, nil
}

// ErrInvalidConfig is wrapped by Validate's errors.
var ErrInvalidConfig = errors.New("paper: invalid config")

// Validate reports the first problem.
func (c Config) Validate() error {
	d := c.DataPlane
	switch {
	case c.Ground == "":
		return fmt.Errorf("%w: the ground needs a name", ErrInvalidConfig)
	case len(c.Topology.Sites) == 0 || c.Topology.CellsPerSite < 1:
		return fmt.Errorf("%w: the topology needs at least one site and one cell per site", ErrInvalidConfig)
	case d.HCInterval <= 0 || d.HCUnhealthy < 1:
		return fmt.Errorf("%w: health checks need an interval > 0 and a threshold >= 1", ErrInvalidConfig)
	case d.Heartbeat <= 0 || d.Window <= 0:
		return fmt.Errorf("%w: heartbeat and window must be > 0", ErrInvalidConfig)
	case d.NumRetries < 0 || d.EjectFor < 0 || d.KillDetect < 0 || d.PushDelay < 0 || d.RetryBudgetMin < 0:
		return fmt.Errorf("%w: retries, ejection, detection and push delays must be >= 0", ErrInvalidConfig)
	case !(d.RetryBudgetPercent >= 0 && d.RetryBudgetPercent <= 100) || d.MaxEjectPercent < 0 || d.MaxEjectPercent > 100:
		return fmt.Errorf("%w: retry budget and max ejection are percentages in [0, 100]", ErrInvalidConfig)
	case d.EjectConsecutive < 1 || d.Eject5xx < 1 || d.Workers < 1 || d.ChoiceCount < 1 || d.MaxInflightPerEndpoint < 1:
		return fmt.Errorf("%w: ejection thresholds, workers, choice count and the in-flight cap must be >= 1", ErrInvalidConfig)
	case !(c.SLOHigh > 0):
		return fmt.Errorf("%w: the bisection's upper bound must be > 0", ErrInvalidConfig)
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

// Stream salts: every random draw of a trial comes from a source keyed by
// (seed, salt, index), so no consumer's draws shift another's.
const (
	saltArrival  = 0xa771
	saltBurst    = 0xb0257
	saltNet      = 0x6e6574
	saltLB       = 0x6c62
	saltHC       = 0x6863
	saltProbe    = 0x9b0be
	saltSchedule = 0x5c4ed
	saltClass    = 0xc1a55
	saltBrownout = 0xb1017
)

// keyed returns a source for stream (seed, salt, i).
func keyed(seed, salt, i uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed^(salt*0x9e3779b97f4a7c15), i))
}

// generate draws the trial's requests. Request i's draws — its
// inter-arrival gap, class, shape, engine frontend latency and Envoy
// worker — come from a source keyed by (seed, i) alone: the same workload
// gives the same requests for every policy, and at another rate request i
// keeps its shape (its gap scales with 1/rate).
func (w workload) generate(p sim.Profile) []request {
	samplers := make([]*load.Sampler, len(w.mix))
	var total float64
	for i, m := range w.mix {
		samplers[i] = load.NewSampler(m.class, w.seed+uint64(i)*7919)
		total += m.share
	}
	pickClass := func(r *rand.Rand) int {
		x := r.Float64() * total
		for i, m := range w.mix {
			if x -= m.share; x < 0 {
				return i
			}
		}
		return len(w.mix) - 1
	}
	var out []request
	add := func(r *rand.Rand, at time.Duration, c int, idx uint64, burst bool) {
		sh := samplers[c].At(idx, at)
		out = append(out, request{arrive: at, prompt: sh.Prompt, out: sh.Output, class: c, burst: burst,
			session: sh.Session, shared: sh.SharedPrefix, blocks: sh.BlockHashes(p.BlockSize),
			frontend: p.FrontendDelay(r), worker: r.Uint32(), cell: -1, pendingAt: -1})
	}
	if w.rps > 0 {
		t := time.Duration(0)
		for i := uint64(0); ; i++ {
			r := keyed(w.seed, saltArrival, i)
			t += time.Duration(r.ExpFloat64() / w.rps * float64(time.Second))
			if t >= w.duration {
				break
			}
			add(r, t, pickClass(r), i, false)
		}
	}
	for i, m := range w.mix {
		if m.class.BurstSize <= 0 || m.class.BurstEvery <= 0 {
			continue
		}
		n := uint64(0)
		for t := m.class.BurstEvery; t < w.duration; t += m.class.BurstEvery {
			for k := range m.class.BurstSize {
				// A burst lands within 100 ms.
				r := keyed(w.seed, saltBurst, n)
				add(r, t+time.Duration(k)*2*time.Millisecond, i, 1<<40+n, true)
				n++
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
		put(int64(r.worker))
		put(int64(r.shared))
	}
	return fmt.Sprintf("%016x", h.Sum64())
}
