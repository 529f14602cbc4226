package wan

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidation(t *testing.T) {
	ok := Config{Path: "a-b", Target: "127.0.0.1:9000"}
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no path", func(c *Config) { c.Path = "" }, "Path"},
		{"path with space", func(c *Config) { c.Path = "a b" }, "Path"},
		{"path too long", func(c *Config) { c.Path = strings.Repeat("x", 65) }, "Path"},
		{"path not utf-8", func(c *Config) { c.Path = "a\xffb" }, "Path"},
		{"bad listen", func(c *Config) { c.Listen = "nowhere" }, "Listen"},
		{"no target", func(c *Config) { c.Target = "" }, "Target"},
		{"target port 0", func(c *Config) { c.Target = "127.0.0.1:0" }, "Target"},
		{"target without host", func(c *Config) { c.Target = ":80" }, "Target"},
		{"negative delay", func(c *Config) { c.Delay = -time.Millisecond }, "Delay"},
		{"delay too long", func(c *Config) { c.Delay = MaxDelay + 1 }, "Delay"},
		{"negative jitter", func(c *Config) { c.Jitter = -1 }, "Jitter"},
		{"jitter above delay", func(c *Config) { c.Delay, c.Jitter = time.Millisecond, 5*time.Millisecond }, ""},
		{"negative dial timeout", func(c *Config) { c.DialTimeout = -1 }, "DialTimeout"},
		{"negative chunk", func(c *Config) { c.ChunkSize = -1 }, "ChunkSize"},
		{"huge chunk", func(c *Config) { c.ChunkSize = MaxChunkSize + 1 }, "ChunkSize"},
		{"negative queue", func(c *Config) { c.QueueLen = -3 }, "QueueLen"},
		{"huge queue", func(c *Config) { c.QueueLen = MaxQueueLen + 1 }, "QueueLen"},
		{"negative idle", func(c *Config) { c.SessionIdle = -time.Second }, "SessionIdle"},
		{"tiny idle", func(c *Config) { c.SessionIdle = time.Nanosecond }, "SessionIdle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.withDefaults().validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name field %s", err, tc.field)
			}
		})
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := New(Config{Target: "127.0.0.1:1"}, Deps{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New without Path: %v", err)
	}
	if _, err := NewUDP(Config{Path: "x"}, Deps{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewUDP without Target: %v", err)
	}
	p, err := New(Config{Path: "x", Target: "127.0.0.1:1"}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.SetDelay(-1, 0); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("SetDelay(-1) = %v", err)
	}
	if _, err := New(Config{Path: "y", Target: "127.0.0.1:1", Listen: p.Addr()}, Deps{}); err == nil {
		t.Error("second listener on a taken port")
	}
}
