package lab

import (
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/xdscontract"
)

func TestParseCriticalityMix(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   map[string]string
		want [reqclass.Count]float64
		err  string
	}{
		{name: "unset", in: nil},
		{name: "issue mix", in: map[string]string{"critical": "0.2", "standard": "0.5", "sheddable": "0.3"}, want: [3]float64{0.2, 0.5, 0.3}},
		{name: "normalised", in: map[string]string{"critical": "1", "sheddable": "3"}, want: [3]float64{0.25, 0, 0.75}},
		{name: "case", in: map[string]string{"Critical": "1"}, want: [3]float64{1, 0, 0}},
		{name: "unknown", in: map[string]string{"urgent": "1"}, err: "--criticality-mix urgent: unknown criticality"},
		{name: "empty class", in: map[string]string{"": "1"}, err: "unknown criticality"},
		{name: "negative", in: map[string]string{"critical": "-1"}, err: `--criticality-mix critical="-1"`},
		{name: "nan", in: map[string]string{"critical": "NaN"}, err: "want a share >= 0"},
		{name: "not a number", in: map[string]string{"standard": "half"}, err: "want a share >= 0"},
		{name: "zero", in: map[string]string{"standard": "0"}, err: "sum to 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCriticalityMix(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if math.Abs(got[i]-tc.want[i]) > 1e-12 {
					t.Fatalf("mix %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestParseTenants(t *testing.T) {
	got, err := ParseTenants(map[string]string{"quiet": "1", "noisy": "5"})
	if err != nil || len(got) != 2 || got[0] != (TenantWeight{"noisy", 5}) || got[1] != (TenantWeight{"quiet", 1}) {
		t.Fatalf("tenants %v, %v: want noisy=5, quiet=1 sorted", got, err)
	}
	for in, want := range map[string]string{
		"a=0": "--tenants a=\"0\"", "a=-2": "want a weight > 0", "a=x": "want a weight > 0", "a=Inf": "want a weight > 0",
		strings.Repeat("t", reqclass.MaxTenantLen+1) + "=1": "--tenants", "_other=1": "--tenants", " a=1": "--tenants",
	} {
		k, v, _ := strings.Cut(in, "=")
		if _, err := ParseTenants(map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %q", in, err, want)
		}
	}
}

// TestDrawClass: without a mix or tenants a request is standard with no
// header; with them, the draws follow the shares, carry the headers, and
// replay for the same seed.
func TestDrawClass(t *testing.T) {
	if rc := drawClass(Config{}, rand.New(rand.NewPCG(1, 2))); rc.crit != reqclass.Standard || rc.header != nil || rc.tenant != "" {
		t.Errorf("default class %+v: want standard, no header", rc)
	}
	cfg := Config{CriticalityMix: [3]float64{0.2, 0.5, 0.3}, Tenants: []TenantWeight{{"noisy", 5}, {"quiet", 1}}}
	counts := map[string]int{}
	const n = 20000
	for i := range uint64(n) {
		rc := drawClass(cfg, rand.New(rand.NewPCG(7, classStream+i)))
		again := drawClass(cfg, rand.New(rand.NewPCG(7, classStream+i)))
		if rc.crit != again.crit || rc.tenant != again.tenant {
			t.Fatalf("draw %d does not replay: %+v then %+v", i, rc, again)
		}
		if rc.header.Get(xdscontract.CriticalityHeader) != rc.crit.String() || rc.header.Get(xdscontract.TenantHeader) != rc.tenant {
			t.Fatalf("headers %v for %s/%s", rc.header, rc.crit, rc.tenant)
		}
		counts[rc.crit.String()]++
		counts[rc.tenant]++
	}
	for k, want := range map[string]float64{"critical": 0.2, "standard": 0.5, "sheddable": 0.3, "noisy": 5.0 / 6, "quiet": 1.0 / 6} {
		if got := float64(counts[k]) / n; math.Abs(got-want) > 0.02 {
			t.Errorf("%s drawn %.3f of the time, want %.3f", k, got, want)
		}
	}
}

// TestReportByClass: the report's splits by criticality and tenant count
// each request once, with its class's success and TTFT.
func TestReportByClass(t *testing.T) {
	t0 := time.Unix(100, 0)
	ok := func(c reqclass.Criticality, tenant string, ttft time.Duration) Outcome {
		return Outcome{Start: t0, End: t0.Add(time.Second), OK: true, Status: http.StatusOK, TTFT: ttft, Criticality: c, Tenant: tenant}
	}
	os := []Outcome{
		ok(reqclass.Critical, "a", 10*time.Millisecond), ok(reqclass.Critical, "b", 30*time.Millisecond),
		ok(reqclass.Standard, "a", 50*time.Millisecond),
		{Start: t0, End: t0, Criticality: reqclass.Sheddable, Tenant: "a", Cause: CauseShedByPlan},
		ok(reqclass.Sheddable, "b", 70*time.Millisecond),
	}
	bc := byCriticality(os)
	if c := bc["critical"]; c.Requests != 2 || c.SuccessRate != 1 || c.TTFTms.P50 < 10 || c.TTFTms.P50 > 30 || c.TTFTms.P95 < c.TTFTms.P50 {
		t.Errorf("critical %+v: want 2 requests, all served, TTFT within 10..30 ms", c)
	}
	if s := bc["sheddable"]; s.Requests != 2 || s.Succeeded != 1 || s.Failures.ShedByPlan != 1 || s.TTFTms.P95 != 70 {
		t.Errorf("sheddable %+v: want 1 of 2 served (1 shed), TTFT 70 ms", s)
	}
	if len(bc) != 3 {
		t.Errorf("classes %v: want 3", slices.Collect(maps.Keys(bc)))
	}
	if byTenant(os, false) != nil {
		t.Errorf("by tenant without tenants: want nil")
	}
	bt := byTenant(os, true)
	if bt["a"].Requests != 3 || bt["a"].Succeeded != 2 || bt["b"].Requests != 2 || bt["b"].SuccessRate != 1 {
		t.Errorf("by tenant %+v", bt)
	}
	if got := classLine(os); got != "critical 100.0% of 2, standard 100.0% of 1, sheddable 50.0% of 2" {
		t.Errorf("live line %q", got)
	}
	var b strings.Builder
	WriteClassTable(&b, Report{Total: summarise(os), ByCriticality: bc, ByTenant: bt})
	for _, want := range []string{"critical", "standard", "sheddable", "tenant a", "tenant b", "50.0%"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestResidencyConfig: the lab loads its residency config from a file or
// its contents, refuses one naming a region it does not run with a clear
// error, and lists the pinned tenants' regions.
func TestResidencyConfig(t *testing.T) {
	regions := DefaultRegions()
	cfg := Config{Regions: regions, ResidencyData: DrillResidency(regions)}
	rc, pinned, err := cfg.loadResidency()
	if err != nil || rc == nil || !rc.Allows(rc.Lookup(DrillTenant, ""), "eu-west") || rc.Allows(rc.Lookup(DrillTenant, ""), "us-east") {
		t.Fatalf("drill residency: %v", err)
	}
	if !slices.Equal(pinned[DrillTenant], []string{"eu-west"}) || len(pinned) != 1 {
		t.Errorf("pinned %v: want %s → [eu-west]", pinned, DrillTenant)
	}
	if rc, pinned, err := (Config{Regions: regions}).loadResidency(); rc != nil || pinned != nil || err != nil {
		t.Errorf("no residency: %v %v %v", rc, pinned, err)
	}
	path := filepath.Join(t.TempDir(), "res.json")
	if err := os.WriteFile(path, []byte(`{"sets":{"eu":["eu-central"]},"tenants":{"acme":"eu"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = Config{Regions: regions, Residency: path}.loadResidency()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--residency") || !strings.Contains(err.Error(), "eu-central") {
		t.Errorf("unknown region: error %v, want an invalid config naming --residency and eu-central", err)
	}
	_, _, err = Config{Regions: regions, Residency: filepath.Join(t.TempDir(), "none.json")}.loadResidency()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("missing file: error %v, want an invalid config", err)
	}
	if got := DrillResidency([]string{"a", "b"}); !strings.Contains(string(got), `"eu":["b"]`) {
		t.Errorf("drill residency without an eu region: %s, want the last region", got)
	}
}
