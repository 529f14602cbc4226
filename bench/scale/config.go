package scale

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"
)

// Config shapes a scale run. Zero fields take the defaults noted; the flag
// of `isobar bench scale` that sets each is named in brackets.
type Config struct {
	// Cells are the fleet sizes, in cells in total [--cells]. Default 10,
	// 100, 1,000, 10,000.
	Cells []int
	// Regions are the region counts of the hierarchical topology
	// [--regions]. Default 1, 10, 100. The flat topology has one controller
	// whatever the region count: it runs once per fleet size.
	Regions []int
	// HeartbeatInterval of the cells and controllers [--heartbeat-interval].
	// Default 500 ms (the production default).
	HeartbeatInterval time.Duration
	// TTLGrace: a controller fails a cell after HeartbeatInterval+TTLGrace
	// without heartbeats [--ttl-grace]. Default 500 ms (the production
	// default; TTL 1 s).
	TTLGrace time.Duration
	// SummaryInterval: each hierarchical controller publishes its summary
	// this often [--summary-interval]. Default 1 s (the production default).
	SummaryInterval time.Duration
	// Window is the measurement window of each point, after every cell is
	// Ready and a warm-up [--window]. Default 5 s.
	Window time.Duration
	// Warmup after every cell is Ready, before the window. Default 1 s, at
	// most Window.
	Warmup time.Duration
	// Deaths: cell deaths timed per point for death-to-removed [--deaths].
	// Default 20.
	Deaths int
	// SilentDeaths: cells timed per point from falling silent (stream open,
	// no more heartbeats) to removed, the TTL path [--silent-deaths].
	// Default 10.
	SilentDeaths int
	// CellProcs: child processes that hold each point's cells, when
	// Deps.CellProcess is set [--cell-procs]. Default 0: one per 4,000
	// cells (10,000 cells: 3). Capped at the point's cells.
	CellProcs int
	// CycleSamples: cycles timed per point, within CycleBudget
	// [--cycles]. Defaults 200 and 3 s.
	CycleSamples int
	CycleBudget  time.Duration
	// SolveSamples: optimiser solves timed per point, within SolveBudget.
	// Defaults 20 and 3 s.
	SolveSamples int
	SolveBudget  time.Duration
	// StartTimeout bounds a point's start (every cell Ready and seen by
	// the xDS client); DeathTimeout bounds each death and each revival.
	// Defaults 2 min and 15 s.
	StartTimeout, DeathTimeout time.Duration
	// DeltaXDS runs the controllers with LEDS for delta clients
	// (regional/xds Config.LEDS) and the timing xDS client over delta ADS
	// (xdsclient.WatchConfig.Delta), so a death sends the dead endpoint,
	// not the cluster [--xds-delta]. Default false: state-of-the-world.
	DeltaXDS bool
	// MaxCells is a ceiling on a point's cells: bigger points are skipped
	// with the reason [--max-cells]. Default 0: no ceiling but the
	// machine's (file descriptors).
	MaxCells int
	// Seed of the synthetic signals, phases and optimiser instances
	// [--seed]. Default 1.
	Seed uint64
	// Topologies are the topologies run, Flat and Hierarchical
	// [--topology]. Default both: a small machine can skip the flat
	// 10,000-cell controller to reach the hierarchical points.
	Topologies []string
}

// Deps are a run's collaborators.
type Deps struct {
	// Clock of the controllers, cells and xDS client, and of the
	// measurements. Nil means the real clock.
	Clock clockwork.Clock
	// Logger receives the components' logs. Nil discards them.
	Logger *slog.Logger
	// Progress receives one line per point as it finishes. Nil: none.
	Progress io.Writer
	// CellProcess makes the command of one cell process: a program that
	// runs ServeCells on its stdin and stdout (`isobar bench scale cells`).
	// The run starts, controls and reaps it. Nil: the cells run in this
	// process, beside the controllers.
	CellProcess func() *exec.Cmd
}

// DefaultCells and DefaultRegions are the fleet sizes and region counts of
// a run unless told otherwise.
func DefaultCells() []int   { return []int{10, 100, 1000, 10000} }
func DefaultRegions() []int { return []int{1, 10, 100} }

// ErrInvalidConfig is wrapped by every configuration error; test with
// errors.Is.
var ErrInvalidConfig = errors.New("scale: invalid config")

// maxRegions bounds the region count: the fake endpoints number regions
// in one address octet.
const maxRegions = 250

func (c *Config) withDefaults() {
	if len(c.Cells) == 0 {
		c.Cells = DefaultCells()
	}
	if len(c.Regions) == 0 {
		c.Regions = DefaultRegions()
	}
	c.Cells, c.Regions = sortedUnique(c.Cells), sortedUnique(c.Regions)
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HeartbeatInterval, 500*time.Millisecond)
	def(&c.TTLGrace, 500*time.Millisecond)
	def(&c.SummaryInterval, time.Second)
	def(&c.Window, 5*time.Second)
	def(&c.Warmup, min(time.Second, c.Window))
	def(&c.CycleBudget, 3*time.Second)
	def(&c.SolveBudget, 3*time.Second)
	def(&c.StartTimeout, 2*time.Minute)
	def(&c.DeathTimeout, 15*time.Second)
	if c.Deaths == 0 {
		c.Deaths = 20
	}
	if c.SilentDeaths == 0 {
		c.SilentDeaths = 10
	}
	if c.CycleSamples == 0 {
		c.CycleSamples = 200
	}
	if c.SolveSamples == 0 {
		c.SolveSamples = 20
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

func sortedUnique(v []int) []int {
	out := slices.Clone(v)
	slices.Sort(out)
	return slices.Compact(out)
}

func (c *Config) validate() error {
	for _, n := range c.Cells {
		if n < 1 || n > 250*250 {
			return fmt.Errorf("%w: cells %d: want 1..%d", ErrInvalidConfig, n, 250*250)
		}
	}
	for _, t := range c.Topologies {
		if t != Flat && t != Hierarchical {
			return fmt.Errorf("%w: topology %q: want %s or %s", ErrInvalidConfig, t, Flat, Hierarchical)
		}
	}
	for _, r := range c.Regions {
		if r < 1 || r > maxRegions {
			return fmt.Errorf("%w: regions %d: want 1..%d", ErrInvalidConfig, r, maxRegions)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"heartbeat interval", c.HeartbeatInterval}, {"TTL grace", c.TTLGrace}, {"summary interval", c.SummaryInterval},
		{"window", c.Window}, {"warm-up", c.Warmup}, {"cycle budget", c.CycleBudget}, {"solve budget", c.SolveBudget},
		{"start timeout", c.StartTimeout}, {"death timeout", c.DeathTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%w: %s %v: must be > 0", ErrInvalidConfig, d.name, d.v)
		}
	}
	if c.HeartbeatInterval < 10*time.Millisecond {
		return fmt.Errorf("%w: heartbeat interval %v: want >= 10ms", ErrInvalidConfig, c.HeartbeatInterval)
	}
	if c.Deaths < 1 || c.Deaths > 1000 {
		return fmt.Errorf("%w: deaths %d: want 1..1000", ErrInvalidConfig, c.Deaths)
	}
	if c.SilentDeaths < 1 || c.SilentDeaths > 1000 {
		return fmt.Errorf("%w: silent deaths %d: want 1..1000", ErrInvalidConfig, c.SilentDeaths)
	}
	if c.CellProcs < 0 || c.CellProcs > maxCellProcs {
		return fmt.Errorf("%w: cell processes %d: want 0..%d (0: one per %d cells)", ErrInvalidConfig, c.CellProcs, maxCellProcs, maxCellsPerProc)
	}
	if c.CycleSamples < 1 || c.SolveSamples < 1 {
		return fmt.Errorf("%w: cycle and solve samples must be >= 1", ErrInvalidConfig)
	}
	if c.MaxCells < 0 {
		return fmt.Errorf("%w: max cells %d: want >= 0 (0: no ceiling)", ErrInvalidConfig, c.MaxCells)
	}
	return nil
}

// NewConfig applies the defaults to c and validates it.
func NewConfig(c Config) (Config, error) {
	c.withDefaults()
	return c, c.validate()
}
