package gossip

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Role: RoleRegional, Region: "eu-west"}
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"valid regional", func(*Config) {}, ""},
		{"valid global", func(c *Config) { c.Role, c.Region = RoleGlobal, "" }, ""},
		{"no role", func(c *Config) { c.Role = "" }, "Role"},
		{"unknown role", func(c *Config) { c.Role = "edge" }, "Role"},
		{"regional without region", func(c *Config) { c.Region = "" }, "Region"},
		{"region too long", func(c *Config) { c.Region = strings.Repeat("r", 129) }, "Region"},
		{"region with newline", func(c *Config) { c.Region = "a\nb" }, "Region"},
		{"name too long", func(c *Config) { c.NodeName = strings.Repeat("n", 257) }, "NodeName"},
		{"ingress too long", func(c *Config) { c.IngressAddress = strings.Repeat("i", 257) }, "IngressAddress"},
		{"bind port", func(c *Config) { c.BindPort = 70000 }, "BindPort"},
		{"advertise port", func(c *Config) { c.AdvertisePort = -1 }, "AdvertisePort"},
		{"profile", func(c *Config) { c.Profile = "moon" }, "Profile"},
		{"cluster label", func(c *Config) { c.Cluster = strings.Repeat("c", 256) }, "Cluster"},
		{"max summary", func(c *Config) { c.MaxSummaryBytes = 2 << 20 }, "MaxSummaryBytes"},
		{"secret key", func(c *Config) { c.SecretKey = make([]byte, 10) }, "SecretKey"},
		{"smoothing", func(c *Config) { c.RTTSmoothing = 1.5 }, "RTTSmoothing"},
		{"backoff", func(c *Config) { c.JoinBackoffMin, c.JoinBackoffMax = time.Second, time.Millisecond }, "JoinBackoffMax"},
		{"empty seed", func(c *Config) { c.Join = []string{"127.0.0.1:1", ""} }, "Join[1]"},
	} {
		c := ok
		tc.edit(&c)
		_, err := New(c, Deps{})
		var fe *FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, err)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
			t.Errorf("%s: err %v, want a FieldError on %s", tc.name, err, tc.field)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{Role: RoleRegional, Region: "eu"}.withDefaults(bytes.NewReader(make([]byte, 8)))
	if c.NodeName != "regional/eu" || c.Profile != ProfileWAN || c.MaxSummaryBytes != 32<<10 ||
		c.BindAddr != "127.0.0.1" || c.Cluster != "isobar" || c.JoinBackoffMin != time.Second {
		t.Errorf("regional defaults: %+v", c)
	}
	g := Config{Role: RoleGlobal, Region: "us"}.withDefaults(bytes.NewReader([]byte{0xde, 0xad, 0xbe, 0xef}))
	if g.NodeName != "global/us/deadbeef" {
		t.Errorf("global name %q", g.NodeName)
	}
	wan := c.memberlistConfig()
	if wan.ProbeInterval != 5*time.Second || wan.PushPullInterval != time.Minute || wan.Label != "isobar" {
		t.Errorf("wan profile: probe %v push-pull %v label %q", wan.ProbeInterval, wan.PushPullInterval, wan.Label)
	}
}

// Start once, Stop any number of times; no restart.
func TestLifecycle(t *testing.T) {
	n, err := New(Config{Role: RoleRegional, Region: "a", Profile: ProfileLocal}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Addr() != "" {
		t.Errorf("Addr before Start = %q", n.Addr())
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start: %v", err)
	}
	// A second node on the same port cannot start.
	_, port, _ := strings.Cut(n.Addr(), ":")
	clash := Config{Role: RoleRegional, Region: "b", Profile: ProfileLocal}
	clash.BindPort = atoi(t, port)
	m, err := New(clash, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err == nil {
		t.Error("two nodes started on one port")
	}
	m.Stop()
	n.Stop()
	n.Stop()
	if err := n.Start(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("Start after Stop: %v", err)
	}
	// Stop before Start is fine and final.
	o, _ := New(Config{Role: RoleGlobal, Profile: ProfileLocal}, Deps{})
	o.Stop()
	if err := o.Start(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("Start after an early Stop: %v", err)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a port: %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}
