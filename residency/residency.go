// Package residency is the data-residency contract: which regions a
// tenant's or a model's requests may be served in. The regional
// controller reads it to build its pinned routes and to refuse a plan
// that breaks it; the gateway reads it to never pick a locality outside a
// request's regions, whatever the plan says or whether there is one (a
// stale or absent plan must not break residency); the global planner
// receives only set names and region lists, never tenants.
//
// The file is JSON:
//
//	{
//	  "sets":    {"eu": ["eu-west", "eu-central"]},
//	  "tenants": {"acme-eu": "eu"},
//	  "models":  {"llama-eu": "eu"}
//	}
//
// A request of a pinned tenant for a pinned model may go only to the
// regions both sets allow (the set named "<tenant's set>+<model's set>");
// with no region in common it is served nowhere (503 naming the
// constraint). Parse is strict: unknown fields, empty or unknown set
// references, bad names and oversized lists are errors naming the field;
// Validate refuses a region the fleet does not have.
//
// A Config is immutable once parsed; any number of goroutines may read it.
package residency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Bounds on a config.
const (
	MaxSets    = 32
	MaxRegions = 64 // per set
	MaxPins    = 10000
	MaxBytes   = 1 << 20
)

// ErrInvalid is wrapped by every error Parse, Load and Validate return.
var ErrInvalid = errors.New("residency: invalid config")

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Config is a parsed residency file.
type Config struct {
	sets    map[string][]string // sorted, deduplicated regions
	tenants map[string]string
	models  map[string]string
}

type file struct {
	Sets    map[string][]string `json:"sets"`
	Tenants map[string]string   `json:"tenants"`
	Models  map[string]string   `json:"models"`
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Load reads and parses the file at path.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("residency: %w", err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(&limited{f: f, left: MaxBytes + 1}); err != nil {
		return nil, fmt.Errorf("residency: read %s: %w", path, err)
	}
	c, err := Parse(b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

type limited struct {
	f    *os.File
	left int
}

func (l *limited) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, invalid("file larger than %d bytes", MaxBytes)
	}
	if len(p) > l.left {
		p = p[:l.left]
	}
	n, err := l.f.Read(p)
	l.left -= n
	return n, err
}

// Parse reads a residency config.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxBytes {
		return nil, invalid("config larger than %d bytes", MaxBytes)
	}
	var f file
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, invalid("%v (want {\"sets\": {name: [regions]}, \"tenants\": {tenant: set}, \"models\": {model: set}})", err)
	}
	if dec.More() {
		return nil, invalid("trailing data after the config object")
	}
	if len(f.Sets) > MaxSets {
		return nil, invalid("sets: %d sets, at most %d", len(f.Sets), MaxSets)
	}
	if len(f.Tenants)+len(f.Models) > MaxPins {
		return nil, invalid("%d tenants and models pinned, at most %d", len(f.Tenants)+len(f.Models), MaxPins)
	}
	c := &Config{sets: map[string][]string{}, tenants: map[string]string{}, models: map[string]string{}}
	for name, regions := range f.Sets {
		if !nameRE.MatchString(name) || strings.Contains(name, "+") {
			return nil, invalid("sets.%s: a set name is 1-64 letters, digits, '.', '_' or '-'", name)
		}
		if len(regions) == 0 || len(regions) > MaxRegions {
			return nil, invalid("sets.%s: %d regions, want 1 to %d", name, len(regions), MaxRegions)
		}
		rs := slices.Clone(regions)
		for i, r := range rs {
			if !nameRE.MatchString(r) {
				return nil, invalid("sets.%s[%d]: %q is not a region name", name, i, r)
			}
		}
		slices.Sort(rs)
		c.sets[name] = slices.Compact(rs)
	}
	for kind, pins := range map[string]map[string]string{"tenants": f.Tenants, "models": f.Models} {
		for who, set := range pins {
			if who == "" || len(who) > 256 {
				return nil, invalid("%s: a name of %d bytes, want 1 to 256", kind, len(who))
			}
			if _, ok := c.sets[set]; !ok {
				return nil, invalid("%s.%s: set %q is not defined under sets", kind, who, set)
			}
		}
	}
	for k, v := range f.Tenants {
		c.tenants[k] = v
	}
	for k, v := range f.Models {
		c.models[k] = v
	}
	return c, nil
}

// Validate refuses a config naming a region that is not in known.
func (c *Config) Validate(known []string) error {
	if c == nil {
		return nil
	}
	for _, name := range c.SetNames() {
		for _, r := range c.sets[name] {
			if !slices.Contains(known, r) {
				return invalid("set %q names region %q, which is not a region of this fleet (known: %s)", name, r, strings.Join(known, ", "))
			}
		}
	}
	return nil
}

// SetNames lists the defined sets, sorted.
func (c *Config) SetNames() []string {
	if c == nil {
		return nil
	}
	names := make([]string, 0, len(c.sets))
	for n := range c.sets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Regions returns the sorted regions of a set, or of a combined set
// "a+b" (the regions both allow). ok is false for an unknown name.
func (c *Config) Regions(set string) (regions []string, ok bool) {
	if c == nil || set == "" {
		return nil, false
	}
	a, b, combined := strings.Cut(set, "+")
	ra, ok := c.sets[a]
	if !ok {
		return nil, false
	}
	if !combined {
		return slices.Clone(ra), true
	}
	rb, ok := c.sets[b]
	if !ok {
		return nil, false
	}
	var both []string
	for _, r := range ra {
		if slices.Contains(rb, r) {
			both = append(both, r)
		}
	}
	return both, true
}

// Lookup returns the residency set of a request by tenant and model: ""
// when neither is pinned, the tenant's or the model's set when one is,
// "<tenant's>+<model's>" when both are pinned to different sets.
func (c *Config) Lookup(tenant, model string) string {
	if c == nil {
		return ""
	}
	ts, tok := c.tenants[tenant]
	ms, mok := c.models[model]
	switch {
	case tok && mok && ts != ms:
		return ts + "+" + ms
	case tok:
		return ts
	case mok:
		return ms
	}
	return ""
}

// Allows reports whether a request of residency set set may be served in
// region. The empty set allows every region; an unknown set allows none.
func (c *Config) Allows(set, region string) bool {
	if set == "" {
		return true
	}
	rs, ok := c.Regions(set)
	return ok && slices.Contains(rs, region)
}

// Pinned reports whether the config pins anything.
func (c *Config) Pinned() bool { return c != nil && (len(c.tenants) > 0 || len(c.models) > 0) }
