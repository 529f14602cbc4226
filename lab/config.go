package lab

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/sim"
	"github.com/isobar-mesh/isobar/summary"
)

// Config sets the lab's shape. Zero fields take the defaults noted.
type Config struct {
	// Regions are the region names. Default us-east, us-west, eu-west; the
	// first hosts the global pair.
	Regions []string
	// Cells per region. Default 3.
	Cells int
	// RPS is the mean Poisson request rate per region, from clients local to
	// it. Default 1 per cell (the published evaluation's load).
	RPS float64
	// PromptTokens ± PromptJitter and MaxTokens shape the requests: default
	// 512 ± 200 prompt tokens and 128 output tokens (baseline_mixed); a
	// tenth of the requests are long (LongPrompt tokens, default 6000).
	PromptTokens, PromptJitter, MaxTokens, LongPrompt int
	// RegionRPS overrides RPS for the named regions (an overload run: one
	// region driven hard, the others light).
	RegionRPS map[string]float64
	// Workload is the clients' traffic. WorkloadSteady (the default):
	// Poisson arrivals at RPS of single streaming completions of
	// PromptTokens ± PromptJitter tokens (a tenth LongPrompt), each
	// prompt distinct random words, so prompts share no prefix by
	// accident. WorkloadMultiturn: Sessions chat conversations per region
	// open at once, each of up to Turns turns of TurnTokens ± TurnJitter
	// user tokens, each turn's request carrying the whole history so far
	// (so it shares the previous turn's prompt as a prefix), a session's
	// turns starting at RPS/Sessions on average but never before the
	// previous reply (sessions.go).
	Workload string
	// Sessions is the multiturn conversations each region keeps open.
	// Default 16; at most MaxInFlight.
	Sessions int
	// Turns is the most turns of a multiturn conversation; each draws its
	// length in 1..Turns. Default 8.
	Turns int
	// TurnTokens ± TurnJitter is the length of a multiturn user message.
	// Default 256 ± 64.
	TurnTokens, TurnJitter int
	// MaxInFlight bounds concurrent requests per region; arrivals beyond it
	// are dropped at the client and counted as failures of cause
	// client_drop (never as "shed", which is the plan's). Default 256.
	MaxInFlight int
	// Duration: run this long then stop; 0 runs until ctx ends.
	Duration time.Duration
	// Report: write the JSON report here when the run ends ("" = none).
	Report string
	// View: redraw the live status every ViewEvery. Default on when
	// Duration is 0.
	View      bool
	ViewEvery time.Duration
	// Profile and TimeScale of the simulated engines. Defaults: the
	// 70B-AWQ profile in real time.
	Profile   string
	TimeScale float64
	// Physics, when its GPU or Model is set, runs the simulated engines on
	// the physics engine of a catalogue GPU and model (sim.PhysicsProfile)
	// instead of a fitted Profile; the fake dcgm-exporters then report the
	// catalogue GPU. Physics.TP must be set (1 or more). Setting both
	// Physics and Profile is an error. Default: unset.
	Physics sim.PhysicsSpec
	// HeartbeatInterval of the agents and controllers. Default 500 ms.
	HeartbeatInterval time.Duration
	// WAN one-way delay and jitter between regions i and j. Default
	// Delay(i, j): the built-in table for the default regions, else
	// 20 ms + 15 ms × |i − j|; jitter 2 ms.
	Delay  func(i, j int) time.Duration
	Jitter time.Duration
	// LB is the gateways' load-balancing mode: isobar (default: least
	// expected TTFT), xds (as Envoy would), rr or lr.
	LB string
	// Globals is the size of the global HA pair. Default 2 (0 with one
	// region).
	Globals int
	// Insecure turns mTLS off. Default false: every gRPC link and etcd use
	// mTLS with a development CA generated for the run.
	Insecure bool
	// Dir holds the run's certificates and etcd data. Default a temporary
	// directory removed at Stop.
	Dir string
	// Seed for the traffic. Default 1.
	Seed uint64
	// NoTraffic turns the lab's own clients off (isobar chaos drives its
	// own load).
	NoTraffic bool
	// AdminListen serves the admin API (fleet state, fault injection) on
	// this address over HTTPS with mTLS, to operator identities only. ""
	// (the default) serves none. Needs mTLS: refused with Insecure.
	AdminListen string
	// CriticalityMix is the share of the clients' requests of each
	// criticality, indexed by reqclass.Criticality (ParseCriticalityMix
	// reads --criticality-mix); each request draws its class from the
	// lab's seed and sends it in xdscontract.CriticalityHeader. Default
	// zero: every request standard, with no header (the behaviour before
	// criticality existed).
	CriticalityMix [reqclass.Count]float64
	// Tenants are the clients' tenants and their weights (ParseTenants
	// reads --tenants); each request draws one from the lab's seed and
	// names it in xdscontract.TenantHeader. Default none: no header.
	Tenants []TenantWeight
	// Residency is a residency config file (package residency) every
	// region's controller and gateway enforce; ResidencyData its contents
	// when Residency is "" (a drill's built-in pin, DrillResidency). It
	// must name only the lab's regions. Default none: nothing pinned.
	Residency     string
	ResidencyData []byte
	// Fast shortens every control-loop timer (tests): heartbeats 200 ms
	// (TTL 2 s), summaries and plans 200 ms, leases 2 s; the summary's
	// capacity stays at the prior (no measurement counts).
	Fast bool
}

// Workloads of Config.Workload.
const (
	WorkloadSteady    = "steady"
	WorkloadMultiturn = "multiturn"
)

// Workloads lists the workloads, the default first.
func Workloads() []string { return []string{WorkloadSteady, WorkloadMultiturn} }

// DefaultRegions are the lab's regions unless told otherwise.
func DefaultRegions() []string { return []string{"us-east", "us-west", "eu-west"} }

// defaultDelays are one-way WAN delays between the default regions.
var defaultDelays = map[[2]string]time.Duration{
	{"us-east", "us-west"}: 30 * time.Millisecond,
	{"us-east", "eu-west"}: 40 * time.Millisecond,
	{"us-west", "eu-west"}: 70 * time.Millisecond,
}

func (c *Config) withDefaults() {
	if len(c.Regions) == 0 {
		c.Regions = DefaultRegions()
	}
	if c.Cells == 0 {
		c.Cells = 3
	}
	if c.RPS == 0 {
		c.RPS = float64(c.Cells)
	}
	if c.PromptTokens == 0 {
		c.PromptTokens, c.PromptJitter = 512, 200
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = 128
	}
	if c.LongPrompt == 0 {
		c.LongPrompt = 6000
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 256
	}
	if c.Workload == "" {
		c.Workload = WorkloadSteady
	}
	if c.Sessions == 0 {
		c.Sessions = 16
	}
	if c.Turns == 0 {
		c.Turns = 8
	}
	if c.TurnTokens == 0 {
		c.TurnTokens, c.TurnJitter = 256, 64
	}
	if c.ViewEvery == 0 {
		c.ViewEvery = time.Second
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 500 * time.Millisecond
		if c.Fast {
			c.HeartbeatInterval = 200 * time.Millisecond
		}
	}
	if c.Jitter == 0 {
		c.Jitter = 2 * time.Millisecond
	}
	if c.Delay == nil {
		regions := c.Regions
		c.Delay = func(i, j int) time.Duration {
			if i == j {
				return 0
			}
			if d, ok := defaultDelays[[2]string{regions[i], regions[j]}]; ok {
				return d
			}
			if d, ok := defaultDelays[[2]string{regions[j], regions[i]}]; ok {
				return d
			}
			return 20*time.Millisecond + 15*time.Millisecond*time.Duration(max(i-j, j-i))
		}
	}
	if c.LB == "" {
		c.LB = "isobar"
	}
	if c.Globals == 0 && len(c.Regions) > 1 {
		c.Globals = 2
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("lab: invalid config")

func (c Config) validate() error {
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if !summary.ValidName(r) || seen[r] {
			return fmt.Errorf("%w: region %q: want unique names of [A-Za-z0-9._-]", ErrInvalidConfig, r)
		}
		seen[r] = true
	}
	switch {
	case len(c.Regions) > 8:
		return fmt.Errorf("%w: --regions %d: at most 8 in one process", ErrInvalidConfig, len(c.Regions))
	case c.Cells < 1 || c.Cells > 32:
		return fmt.Errorf("%w: --cells %d: want 1..32 per region", ErrInvalidConfig, c.Cells)
	case c.RPS < 0 || c.RPS > 1000:
		return fmt.Errorf("%w: --rps %v: want 0..1000 per region", ErrInvalidConfig, c.RPS)
	case c.badRegionRPS() != "":
		return fmt.Errorf("%w: --region-rps %s: want a region of --regions and 0..1000", ErrInvalidConfig, c.badRegionRPS())
	case c.Duration < 0:
		return fmt.Errorf("%w: --duration must be >= 0", ErrInvalidConfig)
	case c.PromptTokens < 1 || c.PromptJitter < 0 || c.PromptJitter >= c.PromptTokens:
		return fmt.Errorf("%w: prompt tokens %d ± %d: want jitter < tokens", ErrInvalidConfig, c.PromptTokens, c.PromptJitter)
	case c.MaxTokens < 1:
		return fmt.Errorf("%w: max tokens must be >= 1", ErrInvalidConfig)
	case !slices.Contains(Workloads(), c.Workload):
		return fmt.Errorf("%w: --workload %q: want one of %v", ErrInvalidConfig, c.Workload, Workloads())
	case c.Sessions < 1 || c.Sessions > c.MaxInFlight:
		return fmt.Errorf("%w: --sessions %d: want 1..%d per region", ErrInvalidConfig, c.Sessions, c.MaxInFlight)
	case c.Turns < 1 || c.Turns > 64:
		return fmt.Errorf("%w: --turns %d: want 1..64", ErrInvalidConfig, c.Turns)
	case c.TurnTokens < 1 || c.TurnJitter < 0 || c.TurnJitter >= c.TurnTokens:
		return fmt.Errorf("%w: turn tokens %d ± %d: want jitter < tokens", ErrInvalidConfig, c.TurnTokens, c.TurnJitter)
	case c.TurnTokens+c.TurnJitter+chatTemplateTokens+c.MaxTokens > sim.DefaultMaxModelLen:
		return fmt.Errorf("%w: a first turn of %d+%d tokens and %d output tokens exceeds the engines' context of %d",
			ErrInvalidConfig, c.TurnTokens, c.TurnJitter, c.MaxTokens, sim.DefaultMaxModelLen)
	case c.TimeScale <= 0:
		return fmt.Errorf("%w: --time-scale must be > 0", ErrInvalidConfig)
	case c.LB != "isobar" && c.LB != "xds" && c.LB != "rr" && c.LB != "lr":
		return fmt.Errorf("%w: --lb %q: want isobar, xds, rr or lr", ErrInvalidConfig, c.LB)
	case c.AdminListen != "" && c.Insecure:
		return fmt.Errorf("%w: --admin-listen needs mTLS: drop --insecure", ErrInvalidConfig)
	case c.Globals < 0 || c.Globals > 3:
		return fmt.Errorf("%w: --globals %d: want 0..3", ErrInvalidConfig, c.Globals)
	}
	if _, err := c.engineProfile(); err != nil {
		return err
	}
	return c.validateClasses()
}

// usesPhysics reports whether Physics selects the engines' timing.
func (c Config) usesPhysics() bool { return c.Physics.GPU != "" || c.Physics.Model != "" }

// engineProfile returns the profile the simulated engines run: the physics
// profile when Physics is set, else nil (the engines look Profile up).
func (c Config) engineProfile() (*sim.Profile, error) {
	if !c.usesPhysics() {
		if c.Profile != "" {
			if _, err := sim.LookupProfile(c.Profile); err != nil {
				return nil, fmt.Errorf("%w: --profile: %w", ErrInvalidConfig, err)
			}
		}
		return nil, nil
	}
	if c.Profile != "" {
		return nil, fmt.Errorf("%w: --profile and --gpu/--model exclude each other", ErrInvalidConfig)
	}
	p, err := sim.PhysicsProfile(c.Physics)
	if err != nil {
		return nil, fmt.Errorf("%w: --gpu/--model/--tp/--kv-dtype: %w", ErrInvalidConfig, err)
	}
	if p.KVCacheTokens < sim.DefaultMaxModelLen {
		return nil, fmt.Errorf("%w: --gpu/--model/--tp/--kv-dtype: the KV cache of %s holds %d tokens, less than the engines' context of %d: raise --tp",
			ErrInvalidConfig, p.Name, p.KVCacheTokens, sim.DefaultMaxModelLen)
	}
	return &p, nil
}

// Deps are the lab's collaborators.
type Deps struct {
	Logger *slog.Logger
	// Out receives the live view. Default os.Stdout.
	Out   io.Writer
	Clock clockwork.Clock
}

// badRegionRPS names the first RegionRPS entry that is not a region of
// the lab or not a rate in 0..1000, or returns "".
func (c Config) badRegionRPS() string {
	for name, v := range c.RegionRPS {
		if !slices.Contains(c.Regions, name) || !(v >= 0 && v <= 1000) {
			return fmt.Sprintf("%s=%v", name, v)
		}
	}
	return ""
}
