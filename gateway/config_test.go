package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/xdscontract"
)

func TestConfigValidation(t *testing.T) {
	ok := Config{Controller: "127.0.0.1:18000", Region: "r1"}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no controller", func(c *Config) { c.Controller = "" }, "Controller is empty"},
		{"controller without port", func(c *Config) { c.Controller = "ctl" }, "not host:port"},
		{"no region", func(c *Config) { c.Region = "" }, "Region is empty"},
		{"region with space", func(c *Config) { c.Region = "a b" }, "visible ASCII"},
		{"bad lb", func(c *Config) { c.LB = "maglev" }, `LB "maglev"`},
		{"negative cap", func(c *Config) { c.MaxInflightPerEndpoint = -1 }, "MaxInflightPerEndpoint"},
		{"upper-case header", func(c *Config) { c.ModelHeader = "X-Model" }, "lower-case"},
		{"same headers", func(c *Config) { c.HopHeader = "x-isobar-model" }, "must differ"},
		{"tiny drain", func(c *Config) { c.DrainTimeout = time.Microsecond }, "DrainTimeout"},
		{"backoff order", func(c *Config) { c.MinBackoff, c.MaxBackoff = time.Second, time.Millisecond }, "below MinBackoff"},
	} {
		c := ok
		tc.edit(&c)
		_, err := New(c, Deps{DialOptions: insecureDial})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig mentioning %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(ok, Deps{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New without dial options = %v", err)
	}
	g, err := New(ok, Deps{DialOptions: insecureDial})
	if err != nil {
		t.Fatal(err)
	}
	if g.cfg.NodeID != "isobar-gateway-r1" || g.cfg.LB != LBXDS || g.cfg.MaxInflightPerEndpoint != 64 || g.cfg.RouteName != xdscontract.RouteName {
		t.Errorf("defaults %+v", g.cfg)
	}
	g.Stop() // never started: returns at once
	g.Stop()
}
