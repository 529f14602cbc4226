package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/isobar-mesh/isobar/regional"
)

// A residency config naming a region the fleet does not have refuses to
// start, with a message naming the set and the region; one naming other
// regions needs --fleet-regions.
func TestRegionalResidencyFlag(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "residency.json")
	if err := os.WriteFile(file, []byte(`{"sets": {"eu": ["eu-west", "eu-central"]}, "tenants": {"acme-eu": "eu"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, region string
		fleet        []string
		wantErr      string // "" accepts
	}{
		{name: "known regions", region: "eu-west", fleet: []string{"eu-central", "us-east"}},
		{name: "typo region", region: "eu-west", fleet: []string{"eu-centrall", "us-east"}, wantErr: `set "eu" names region "eu-central"`},
		{name: "no fleet", region: "eu-west", wantErr: "--fleet-regions"},
		{name: "unreadable", region: "eu-west", fleet: []string{"eu-central"}, wantErr: "--residency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &regionalOpts{residencyFile: file}
			if tc.name == "unreadable" {
				o.residencyFile = filepath.Join(dir, "missing.json")
			}
			cfg := regional.DefaultConfig(tc.region)
			cfg.FleetRegions = tc.fleet
			err := o.applyResidency(&cfg)
			if tc.wantErr == "" {
				if err != nil || cfg.Residency == nil {
					t.Fatalf("applyResidency: %v (residency %v)", err, cfg.Residency)
				}
				return
			}
			var ue usageError
			if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("applyResidency: %v; want a usage error containing %q", err, tc.wantErr)
			}
		})
	}
}
