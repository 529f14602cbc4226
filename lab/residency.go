package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/isobar-mesh/isobar/residency"
)

// DrillTenant is the tenant DrillResidency pins.
const DrillTenant = "acme-eu"

// DrillResidency is the residency config of the residency drill's lab:
// DrillTenant pinned to the set "eu" of the regions whose name starts
// with "eu" (the last region when none does), so that at least one region
// lies outside it.
func DrillResidency(regions []string) []byte {
	var eu []string
	for _, r := range regions {
		if strings.HasPrefix(r, "eu") {
			eu = append(eu, r)
		}
	}
	if (len(eu) == 0 || len(eu) == len(regions)) && len(regions) > 0 {
		eu = []string{regions[len(regions)-1]}
	}
	b, _ := json.Marshal(map[string]any{"sets": map[string][]string{"eu": eu}, "tenants": map[string]string{DrillTenant: "eu"}})
	return b
}

// loadResidency reads the lab's residency config (nil without one),
// checks it names only the lab's regions, and lists its pinned tenants
// with the regions each may be served in.
func (c Config) loadResidency() (*residency.Config, map[string][]string, error) {
	data, what := c.ResidencyData, "the built-in residency config"
	if c.Residency != "" {
		b, err := os.ReadFile(c.Residency)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: --residency: %w", ErrInvalidConfig, err)
		}
		if len(b) > residency.MaxBytes {
			return nil, nil, fmt.Errorf("%w: --residency %s: larger than %d bytes", ErrInvalidConfig, c.Residency, residency.MaxBytes)
		}
		data, what = b, c.Residency
	}
	if data == nil {
		return nil, nil, nil
	}
	rc, err := residency.Parse(data)
	if err == nil {
		err = rc.Validate(c.Regions)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --residency %s: %w", ErrInvalidConfig, what, err)
	}
	// The tenants' pins, for the admin API (Parse has checked the file).
	var f struct {
		Tenants map[string]string `json:"tenants"`
	}
	_ = json.Unmarshal(data, &f)
	pinned := map[string][]string{}
	for t, set := range f.Tenants {
		regions, _ := rc.Regions(set)
		pinned[t] = regions
	}
	return rc, pinned, nil
}
