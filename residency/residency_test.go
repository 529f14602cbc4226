package residency

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const sample = `{"sets": {"eu": ["eu-west", "eu-central", "eu-west"], "de": ["eu-central"], "us": ["us-east"]},
 "tenants": {"acme-eu": "eu", "acme-us": "us"}, "models": {"llama-de": "de"}}`

func TestLookupAndAllows(t *testing.T) {
	c, err := Parse([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if rs, _ := c.Regions("eu"); !slices.Equal(rs, []string{"eu-central", "eu-west"}) {
		t.Errorf("eu = %v: want sorted, deduplicated", rs)
	}
	for _, tc := range []struct {
		tenant, model, set, region string
		ok                         bool
	}{
		{"acme-eu", "m", "eu", "eu-west", true},
		{"acme-eu", "m", "eu", "us-east", false},
		{"other", "m", "", "us-east", true},
		{"other", "llama-de", "de", "eu-west", false},
		{"acme-eu", "llama-de", "eu+de", "eu-central", true},
		{"acme-eu", "llama-de", "eu+de", "eu-west", false},
		{"acme-us", "llama-de", "us+de", "us-east", false}, // nothing in common
	} {
		set := c.Lookup(tc.tenant, tc.model)
		if set != tc.set || c.Allows(set, tc.region) != tc.ok {
			t.Errorf("(%s, %s) → %q allows %s = %v: want %q, %v", tc.tenant, tc.model, set, tc.region, c.Allows(set, tc.region), tc.set, tc.ok)
		}
	}
	if c.Allows("nope", "eu-west") {
		t.Error("an unknown set allows a region")
	}
	var none *Config
	if none.Lookup("acme-eu", "m") != "" || none.Pinned() || !none.Allows("", "x") {
		t.Error("a nil config pins nothing")
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	for in, want := range map[string]string{
		`{"sets": {"eu": []}}`:                            "sets.eu",
		`{"sets": {"eu": ["eu west"]}}`:                   "sets.eu[0]",
		`{"sets": {"eu": ["a"]}, "tenants": {"x": "us"}}`: "tenants.x",
		`{"sets": {"e+u": ["a"]}}`:                        "sets.e+u",
		`{"set": {}}`:                                     "unknown field",
		`{"sets": {}} {}`:                                 "trailing",
		`[1]`:                                             "want {",
	} {
		_, err := Parse([]byte(in))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) = %v: want an ErrInvalid naming %q", in, err, want)
		}
	}
}

func TestValidateAndLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(p, []byte(sample), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate([]string{"eu-west", "eu-central", "us-east"}); err != nil {
		t.Errorf("known regions: %v", err)
	}
	err = c.Validate([]string{"eu-west", "us-east"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"eu-central"`) {
		t.Errorf("unknown region: %v, want an error naming eu-central", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("a missing file loads")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte(`{"sets": {"a": ["x"]}, "models": {"m": "a"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, n := range c.SetNames() {
			rs, ok := c.Regions(n)
			if !ok || len(rs) == 0 || !slices.IsSorted(rs) {
				t.Fatalf("set %q: %v %v", n, rs, ok)
			}
		}
	})
}
