package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/isobar-mesh/isobar/adminapi"
)

// maxScenarioBytes and maxScenarioDrills bound a scenario file.
const (
	maxScenarioBytes  = 1 << 20
	maxScenarioDrills = 100
)

// Duration is a time.Duration written as "1.5s" in scenario files.
type Duration time.Duration

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"1.5s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	if v < 0 || v > 24*time.Hour {
		return fmt.Errorf("duration %q: want 0..24h", s)
	}
	*d = Duration(v)
	return nil
}

// ScenarioOptions are the timing and load fields of a scenario.
type ScenarioOptions struct {
	Before    *Duration `json:"before,omitempty"`
	During    *Duration `json:"during,omitempty"`
	After     *Duration `json:"after,omitempty"`
	MaxWait   *Duration `json:"max_wait,omitempty"`
	Settle    *Duration `json:"settle,omitempty"`
	RPS       *float64  `json:"rps,omitempty"`
	MaxTokens *int      `json:"max_tokens,omitempty"`
}

// ScenarioThresholds are thresholds as written in a scenario.
type ScenarioThresholds struct {
	MaxErrorRate *float64  `json:"max_error_rate,omitempty"`
	MaxRTO       *Duration `json:"max_rto,omitempty"`
	MaxDetect    *Duration `json:"max_detect,omitempty"`
	MaxLost      *int      `json:"max_lost,omitempty"`
	MaxLeak      *float64  `json:"max_leak,omitempty"`
}

// ScenarioDrill is one step of a scenario.
type ScenarioDrill struct {
	Drill string `json:"drill"`
	Params
	Options    ScenarioOptions    `json:"options,omitempty"`
	Thresholds ScenarioThresholds `json:"thresholds,omitempty"`
}

// Scenario is a sequence of drills with shared options and thresholds.
type Scenario struct {
	Options    ScenarioOptions    `json:"options,omitempty"`
	Thresholds ScenarioThresholds `json:"thresholds,omitempty"`
	Drills     []ScenarioDrill    `json:"drills"`
}

// ParseScenario decodes a scenario file (YAML or JSON). Unknown fields,
// unknown drills and out-of-range values are errors naming the field.
func ParseScenario(b []byte) (*Scenario, error) {
	if len(b) > maxScenarioBytes {
		return nil, fmt.Errorf("chaos: scenario: %d bytes, at most %d", len(b), maxScenarioBytes)
	}
	var s Scenario
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		return nil, fmt.Errorf("chaos: scenario: %w", err)
	}
	if len(s.Drills) == 0 {
		return nil, errors.New("chaos: scenario: no drills: list them under drills:, e.g. - drill: kill-cell")
	}
	if len(s.Drills) > maxScenarioDrills {
		return nil, fmt.Errorf("chaos: scenario: %d drills, at most %d", len(s.Drills), maxScenarioDrills)
	}
	if err := s.Options.validate("options"); err != nil {
		return nil, err
	}
	if err := s.Thresholds.validate("thresholds"); err != nil {
		return nil, err
	}
	for i, d := range s.Drills {
		where := fmt.Sprintf("drills[%d]", i)
		if _, err := Lookup(d.Drill); err != nil {
			return nil, fmt.Errorf("chaos: scenario: %s.drill: %w", where, err)
		}
		if err := d.Params.validate(where); err != nil {
			return nil, err
		}
		if err := d.Options.validate(where + ".options"); err != nil {
			return nil, err
		}
		if err := d.Thresholds.validate(where + ".thresholds"); err != nil {
			return nil, err
		}
	}
	return &s, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func (p Params) validate(where string) error {
	f := adminapi.Fault{Kind: adminapi.FaultKillEngine, Region: p.Region, Regions: p.Regions, Cells: p.Cells, DelayMS: p.DelayMS,
		JitterMS: p.JitterMS, Severity: p.Severity, MaxModelLen: p.MaxModelLen}
	if err := f.Validate(); err != nil {
		return fmt.Errorf("chaos: scenario: %s: %w", where, err)
	}
	if p.Count < 0 || p.Count > adminapi.MaxFaultRegions {
		return fmt.Errorf("chaos: scenario: %s.count %d: want 0..%d", where, p.Count, adminapi.MaxFaultRegions)
	}
	return nil
}

func (o ScenarioOptions) validate(where string) error {
	if o.RPS != nil && (!finite(*o.RPS) || *o.RPS <= 0 || *o.RPS > 10_000) {
		return fmt.Errorf("chaos: scenario: %s.rps %v: want (0, 10000]", where, *o.RPS)
	}
	if o.MaxTokens != nil && (*o.MaxTokens < 1 || *o.MaxTokens > 1<<20) {
		return fmt.Errorf("chaos: scenario: %s.max_tokens %d: want 1..%d", where, *o.MaxTokens, 1<<20)
	}
	return nil
}

func (t ScenarioThresholds) validate(where string) error {
	for name, v := range map[string]*float64{"max_error_rate": t.MaxErrorRate, "max_leak": t.MaxLeak} {
		if v != nil && (!finite(*v) || *v < 0 || *v > 1) {
			return fmt.Errorf("chaos: scenario: %s.%s %v: want a fraction in [0, 1]", where, name, *v)
		}
	}
	if t.MaxLost != nil && *t.MaxLost < 0 {
		return fmt.Errorf("chaos: scenario: %s.max_lost %d: want >= 0", where, *t.MaxLost)
	}
	return nil
}

// Apply sets o's fields from the scenario's.
func (s ScenarioOptions) Apply(o *Options) {
	set := func(dst *time.Duration, v *Duration) {
		if v != nil {
			*dst = time.Duration(*v)
		}
	}
	set(&o.Before, s.Before)
	set(&o.During, s.During)
	set(&o.After, s.After)
	set(&o.MaxWait, s.MaxWait)
	set(&o.Settle, s.Settle)
	if s.RPS != nil {
		o.Load.RPS = *s.RPS
	}
	if s.MaxTokens != nil {
		o.Load.MaxTokens = *s.MaxTokens
	}
}

// Thresholds converts to Thresholds.
func (t ScenarioThresholds) Thresholds() Thresholds {
	d := func(v *Duration) *time.Duration {
		if v == nil {
			return nil
		}
		x := time.Duration(*v)
		return &x
	}
	return Thresholds{MaxErrorRate: t.MaxErrorRate, MaxRTO: d(t.MaxRTO), MaxDetect: d(t.MaxDetect), MaxLost: t.MaxLost, MaxLeak: t.MaxLeak}
}
