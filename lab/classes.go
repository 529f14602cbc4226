package lab

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// TenantWeight is one tenant of the lab's clients and its share of their
// requests (relative to the other tenants' weights).
type TenantWeight struct {
	Name   string
	Weight float64
}

// maxLabTenants bounds Config.Tenants.
const maxLabTenants = 32

// ParseCriticalityMix parses --criticality-mix entries (class=share, e.g.
// critical=0.2,standard=0.5,sheddable=0.3): each class of reqclass by
// name, each share finite and >= 0, their sum > 0. The shares are
// normalised to sum to 1. An empty map is the zero mix (every request
// standard, no header).
func ParseCriticalityMix(m map[string]string) ([reqclass.Count]float64, error) {
	var mix [reqclass.Count]float64
	if len(m) == 0 {
		return mix, nil
	}
	sum := 0.0
	for _, name := range slices.Sorted(maps.Keys(m)) {
		c, ok := reqclass.Parse(name)
		if !ok || c.String() != strings.ToLower(strings.TrimSpace(name)) {
			return mix, fmt.Errorf("--criticality-mix %s: unknown criticality: want critical, standard or sheddable", name)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(m[name]), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return mix, fmt.Errorf("--criticality-mix %s=%q: want a share >= 0", name, m[name])
		}
		mix[c] += v
		sum += v
	}
	if sum <= 0 {
		return mix, fmt.Errorf("--criticality-mix: the shares sum to 0")
	}
	for i := range mix {
		mix[i] /= sum
	}
	return mix, nil
}

// ParseTenants parses --tenants entries (name=weight): each name a
// usable tenant of at most reqclass.MaxTenantLen bytes, each weight finite
// and > 0, at most maxLabTenants. They are returned sorted by name.
func ParseTenants(m map[string]string) ([]TenantWeight, error) {
	if len(m) > maxLabTenants {
		return nil, fmt.Errorf("--tenants: %d tenants, at most %d", len(m), maxLabTenants)
	}
	var out []TenantWeight
	for _, name := range slices.Sorted(maps.Keys(m)) {
		t, truncated, bad := reqclass.NormalizeTenant(name)
		if bad || truncated || t == reqclass.NoTenant || t != name || t == reqclass.OtherTenant {
			return nil, fmt.Errorf("--tenants %q: want a name of 1..%d printable bytes without spaces around it (not %q)",
				name, reqclass.MaxTenantLen, reqclass.OtherTenant)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(m[name]), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			return nil, fmt.Errorf("--tenants %s=%q: want a weight > 0", name, m[name])
		}
		out = append(out, TenantWeight{Name: t, Weight: v})
	}
	return out, nil
}

// mixSet reports whether the criticality mix is set (else every request
// is standard and carries no criticality header).
func (c Config) mixSet() bool { return c.CriticalityMix != [reqclass.Count]float64{} }

// validateClasses checks the mix and the tenants as ParseCriticalityMix
// and ParseTenants would produce them.
func (c Config) validateClasses() error {
	sum := 0.0
	for _, v := range c.CriticalityMix {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("%w: --criticality-mix %v: want shares >= 0", ErrInvalidConfig, c.CriticalityMix)
		}
		sum += v
	}
	if c.mixSet() && sum <= 0 {
		return fmt.Errorf("%w: --criticality-mix: the shares sum to 0", ErrInvalidConfig)
	}
	if len(c.Tenants) > maxLabTenants {
		return fmt.Errorf("%w: --tenants: %d tenants, at most %d", ErrInvalidConfig, len(c.Tenants), maxLabTenants)
	}
	for _, t := range c.Tenants {
		if n, tr, bad := reqclass.NormalizeTenant(t.Name); bad || tr || n != t.Name || n == reqclass.NoTenant || !(t.Weight > 0) || math.IsInf(t.Weight, 0) {
			return fmt.Errorf("%w: --tenants %s=%v: want a usable name and a weight > 0", ErrInvalidConfig, t.Name, t.Weight)
		}
	}
	return nil
}

// classStream is the PCG stream base of the requests' criticality and
// tenant draws (plus the request's number), apart from the arrivals' and
// the texts' sources so that setting a mix replays the same arrivals.
const classStream = 0xc1a55 << 40

// requestClass is a request's criticality and tenant, and the headers
// that carry them.
type requestClass struct {
	crit   reqclass.Criticality
	tenant string
	header http.Header
}

// drawClass draws a request's criticality by cfg.CriticalityMix and its
// tenant by cfg.Tenants' weights from rng. Without a mix the request is
// standard and sends no criticality header; without tenants it names
// none.
func drawClass(cfg Config, rng *rand.Rand) requestClass {
	rc := requestClass{crit: reqclass.Standard}
	if !cfg.mixSet() && len(cfg.Tenants) == 0 {
		return rc
	}
	rc.header = http.Header{}
	if cfg.mixSet() {
		sum := 0.0
		for _, v := range cfg.CriticalityMix {
			sum += v
		}
		u, acc := rng.Float64()*sum, 0.0
		rc.crit = reqclass.Sheddable
		for _, c := range reqclass.All() {
			acc += cfg.CriticalityMix[c]
			if u < acc {
				rc.crit = c
				break
			}
		}
		rc.header.Set(xdscontract.CriticalityHeader, rc.crit.String())
	}
	if len(cfg.Tenants) > 0 {
		sum := 0.0
		for _, t := range cfg.Tenants {
			sum += t.Weight
		}
		u, acc := rng.Float64()*sum, 0.0
		rc.tenant = cfg.Tenants[len(cfg.Tenants)-1].Name
		for _, t := range cfg.Tenants {
			acc += t.Weight
			if u < acc {
				rc.tenant = t.Name
				break
			}
		}
		rc.header.Set(xdscontract.TenantHeader, rc.tenant)
	}
	return rc
}
