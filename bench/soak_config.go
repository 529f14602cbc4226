package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"time"

	"github.com/jonboulle/clockwork"
)

// SoakConfig shapes a soak run. Zero fields take the defaults noted; the
// flag of `isobar bench soak` that sets each is named in brackets.
type SoakConfig struct {
	// Regions are the region names [--regions]. Default us-east, us-west,
	// eu-west.
	Regions []string
	// Cells is the number of synthetic cells in total, split round-robin
	// over the regions [--cells]. Default 1000.
	Cells int
	// Duration of the churn phase, warm-up included [--duration]. Default
	// 10 min. Start-up (bounded by StartTimeout) comes before it and the
	// two end checks (each bounded by Settle) after it.
	Duration time.Duration
	// Warmup: samples taken before this much of Duration has passed are
	// reported but left out of the flatness checks [--warmup]. Default
	// 30 s, at most Duration/3.
	Warmup time.Duration
	// ChurnInterval: every interval, ChurnFraction of the cells die (their
	// TCP connection is closed under the stream, no Terminated heartbeat)
	// and return ChurnDown later on a new stream with the same cell id and
	// a new incarnation [--churn-interval, --churn, --churn-down]. Defaults
	// 5 s, 0.05 and 3 s. A ChurnFraction below 0 turns churn off.
	ChurnInterval time.Duration
	ChurnFraction float64
	ChurnDown     time.Duration
	// SampleEvery: interval between samples after the warm-up [--sample].
	// Default 10 s.
	SampleEvery time.Duration
	// HeartbeatInterval of the cells and controllers [--heartbeat-interval].
	// Default 500 ms.
	HeartbeatInterval time.Duration
	// TTLGrace: a controller fails a cell after HeartbeatInterval+TTLGrace
	// without heartbeats. Default 1 s (tolerant of a loaded machine).
	TTLGrace time.Duration
	// PlanInterval is the global leader's planning cycle and
	// SummaryInterval the regions' summary interval. Defaults 1 s (the
	// production defaults).
	PlanInterval, SummaryInterval time.Duration
	// PlanTTL: plans are valid this long; a region that goes longer without
	// a new plan has lost plans. Default 30 s.
	PlanTTL time.Duration
	// LeaseTTL of the global election. Default 2 s.
	LeaseTTL time.Duration
	// PlanPoll: how often the plan watcher reads every region's applied
	// plan. Default 100 ms.
	PlanPoll time.Duration
	// Settle bounds each end check: all cells back and streams matching
	// after churn stops; goroutines back at the baseline after the cells
	// stop [--settle]. Default 30 s.
	Settle time.Duration
	// StartTimeout bounds the start: fleet up, every cell Ready and every
	// region on a plan. Default 2 min.
	StartTimeout time.Duration

	// Flatness bounds [--max-rss-growth, --rss-allowance,
	// --max-goroutine-growth, --goroutine-allowance]: the median of the
	// last third of the post-warm-up samples must not exceed the median of
	// the first third × (1 + growth) + allowance. Defaults 0.25 + 64 MiB
	// for RSS and 0.10 + 200 for goroutines.
	MaxRSSGrowth       float64
	RSSAllowance       uint64
	MaxGoroutineGrowth float64
	GoroutineAllowance int
	// GoroutineReturnAllowance: after every cell has stopped, goroutines
	// must come back to at most the count before the cells started plus
	// this, within Settle [--goroutine-return-allowance]. Default 50.
	GoroutineReturnAllowance int
	// MaxStreamErrors: streams that ended without the churner killing them
	// plus heartbeats the controllers refused [--max-stream-errors].
	// Default 0; negative disables the check.
	MaxStreamErrors int

	// Dir holds etcd's data. Default a temporary directory removed after.
	Dir string
	// Seed for the churn and the synthetic signals. Default 1.
	Seed uint64
}

// DefaultSoakRegions are the regions of a soak unless told otherwise.
func DefaultSoakRegions() []string { return []string{"us-east", "us-west", "eu-west"} }

// DefaultSoakConfig returns a SoakConfig with every default filled in,
// the one source of the defaults (isobar bench soak's flags take theirs
// from it). Warmup derives from Duration and stays zero here, filled by
// RunSoak.
func DefaultSoakConfig() SoakConfig {
	var c SoakConfig
	c.withDefaults()
	c.Warmup = 0
	return c
}

func (c *SoakConfig) withDefaults() {
	if len(c.Regions) == 0 {
		c.Regions = DefaultSoakRegions()
	}
	if c.Cells == 0 {
		c.Cells = 1000
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.Warmup == 0 {
		c.Warmup = min(30*time.Second, c.Duration/3)
	}
	if c.ChurnInterval == 0 {
		c.ChurnInterval = 5 * time.Second
	}
	if c.ChurnFraction == 0 {
		c.ChurnFraction = 0.05
	}
	if c.ChurnDown == 0 {
		c.ChurnDown = 3 * time.Second
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = 10 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 500 * time.Millisecond
	}
	if c.TTLGrace == 0 {
		c.TTLGrace = time.Second
	}
	if c.PlanInterval == 0 {
		c.PlanInterval = time.Second
	}
	if c.SummaryInterval == 0 {
		c.SummaryInterval = time.Second
	}
	if c.PlanTTL == 0 {
		c.PlanTTL = 30 * time.Second
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 2 * time.Second
	}
	if c.PlanPoll == 0 {
		c.PlanPoll = 100 * time.Millisecond
	}
	if c.Settle == 0 {
		c.Settle = 30 * time.Second
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 2 * time.Minute
	}
	if c.MaxRSSGrowth == 0 {
		c.MaxRSSGrowth = 0.25
	}
	if c.RSSAllowance == 0 {
		c.RSSAllowance = 64 << 20
	}
	if c.MaxGoroutineGrowth == 0 {
		c.MaxGoroutineGrowth = 0.10
	}
	if c.GoroutineAllowance == 0 {
		c.GoroutineAllowance = 200
	}
	if c.GoroutineReturnAllowance == 0 {
		c.GoroutineReturnAllowance = 50
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// ErrInvalidConfig wraps every soak configuration error; test with
// errors.Is.
var ErrInvalidConfig = errors.New("bench: invalid config")

var regionName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// maxSoakCells bounds --cells: every cell is a TCP connection and a few
// goroutines on each side in this one process.
const maxSoakCells = 20_000

func (c SoakConfig) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if !regionName.MatchString(r) || seen[r] {
			return bad("--regions: region %q: want unique names of 1-64 characters of [A-Za-z0-9._-]", r)
		}
		seen[r] = true
	}
	switch {
	case len(c.Regions) > 16:
		return bad("--regions: %d regions: at most 16 in one process", len(c.Regions))
	case c.Cells < len(c.Regions) || c.Cells > maxSoakCells:
		return bad("--cells %d: want %d..%d (at least one per region)", c.Cells, len(c.Regions), maxSoakCells)
	case c.Duration < 0:
		return bad("--duration %v: must be > 0", c.Duration)
	case c.Warmup < 0 || c.Warmup >= c.Duration:
		return bad("--warmup %v: want 0 <= warm-up < --duration %v", c.Warmup, c.Duration)
	case math.IsNaN(c.ChurnFraction) || c.ChurnFraction > 1:
		return bad("--churn %v: want a fraction of the cells in [0, 1]", c.ChurnFraction)
	case c.MaxRSSGrowth < 0 || math.IsNaN(c.MaxRSSGrowth) || c.MaxGoroutineGrowth < 0 || math.IsNaN(c.MaxGoroutineGrowth):
		return bad("--max-rss-growth %v, --max-goroutine-growth %v: must be >= 0", c.MaxRSSGrowth, c.MaxGoroutineGrowth)
	case c.GoroutineAllowance < 0 || c.GoroutineReturnAllowance < 0:
		return bad("--goroutine-allowance %d, --goroutine-return-allowance %d: must be >= 0", c.GoroutineAllowance, c.GoroutineReturnAllowance)
	case c.LeaseTTL < time.Second:
		return bad("lease TTL %v: etcd leases are whole seconds, want >= 1s", c.LeaseTTL)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--duration", c.Duration}, {"--churn-interval", c.ChurnInterval}, {"--churn-down", c.ChurnDown},
		{"--sample", c.SampleEvery}, {"--heartbeat-interval", c.HeartbeatInterval}, {"TTL grace", c.TTLGrace},
		{"plan interval", c.PlanInterval}, {"summary interval", c.SummaryInterval}, {"plan TTL", c.PlanTTL},
		{"plan poll", c.PlanPoll}, {"--settle", c.Settle}, {"start timeout", c.StartTimeout},
	} {
		if d.v <= 0 {
			return bad("%s %v: must be > 0", d.flag, d.v)
		}
	}
	if c.HeartbeatInterval < 10*time.Millisecond {
		return bad("--heartbeat-interval %v: want at least 10ms", c.HeartbeatInterval)
	}
	if c.PlanTTL <= c.PlanInterval {
		return bad("plan TTL %v must exceed the plan interval %v", c.PlanTTL, c.PlanInterval)
	}
	return nil
}

// SoakDeps are the soak's collaborators. Nil fields get defaults.
type SoakDeps struct {
	// Logger receives the components' logs. Nil: dropped.
	Logger *slog.Logger
	// Progress receives one line per phase and per sample as the run goes.
	// Nil: none.
	Progress io.Writer
	// Clock times the harness and every component. Nil: the real clock.
	Clock clockwork.Clock
}

func (d *SoakDeps) withDefaults() {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Progress == nil {
		d.Progress = io.Discard
	}
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
}
