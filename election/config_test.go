package election

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // substring of the error; "" = valid
	}{
		{"defaults", Config{ID: "a"}, ""},
		{"no id", Config{}, "ID is empty"},
		{"root prefix", Config{ID: "a", Prefix: "/"}, "whole keyspace"},
		{"ttl too short", Config{ID: "a", TTL: 500 * time.Millisecond}, "TTL 500ms"},
		{"negative ttl", Config{ID: "a", TTL: -time.Second}, "TTL"},
		{"backoff inverted", Config{ID: "a", MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MinBackoff"},
		{"negative backoff", Config{ID: "a", MinBackoff: -1}, "MinBackoff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.withDefaults().validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{ID: "a"}.withDefaults()
	if c.Prefix != DefaultPrefix || c.TTL != 2*time.Second || c.MinBackoff != 100*time.Millisecond || c.MaxBackoff != 2*time.Second {
		t.Fatalf("defaults = %+v", c)
	}
	for ttl, want := range map[time.Duration]int64{time.Second: 1, 1500 * time.Millisecond: 2, 2 * time.Second: 2, 2*time.Second + 1: 3} {
		if got := (Config{TTL: ttl}).ttlSeconds(); got != want {
			t.Errorf("ttlSeconds(%v) = %d, want %d", ttl, got, want)
		}
	}
}

func TestNewCandidateErrors(t *testing.T) {
	cli := &clientv3.Client{} // never contacted by NewCandidate
	if _, err := NewCandidate(nil, Config{ID: "a"}, Deps{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil client: %v", err)
	}
	if _, err := NewCandidate(cli, Config{}, Deps{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no ID: %v", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := NewCandidate(cli, Config{ID: "a"}, Deps{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewCandidate(cli, Config{ID: "b"}, Deps{Registerer: reg}); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Fatalf("second candidate on one registry: %v, want a registration error", err)
	}
	// A failed registration leaves nothing half-registered behind.
	reg2 := prometheus.NewRegistry()
	reg2.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "isobar_election_leader_changes_total", Help: "taken"}))
	if _, err := NewCandidate(cli, Config{ID: "c"}, Deps{Registerer: reg2}); err == nil {
		t.Fatal("want a registration error")
	}
	mfs, err := reg2.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 {
		t.Fatalf("%d metric families left after a failed registration, want only the pre-existing one", len(mfs))
	}
}

func TestNormalizePrefix(t *testing.T) {
	for in, want := range map[string]string{
		"":             DefaultPrefix,
		"/a":           "/a/",
		"/a/":          "/a/",
		"/a/election":  "/a/election/",
		"/a/election/": "/a/election/",
		"x":            "x/",
	} {
		if got := normalizePrefix(in); got != want {
			t.Errorf("normalizePrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOverlapsPrefix(t *testing.T) {
	const p = "/a/el/"
	for _, tc := range []struct {
		key, end string
		want     bool
	}{
		{"/a/el/x", "", true},
		{"/a/el/", "", true},
		{"/a/el", "", false},
		{"/a/elx", "", false},
		{"/a/plan", "", false},
		{"/a/", clientv3.GetPrefixRangeEnd("/a/"), true},             // prefix delete of the parent
		{"/a/el/", clientv3.GetPrefixRangeEnd("/a/el/"), true},       // the prefix itself
		{"/a/el/x", "/a/el/y", true},                                 // range inside
		{"/a/a", "/a/el/", false},                                    // ends right before
		{"/a/a", "/a/el/0", true},                                    // ends inside
		{"/a/em", "\x00", false},                                     // from a key past the prefix
		{"/a/", "\x00", true},                                        // from a key before it, to the end
		{"/b/", clientv3.GetPrefixRangeEnd("/b/"), false},            // unrelated
		{clientv3.GetPrefixRangeEnd(p), "\x00", false},               // from the prefix's end on
		{"/a/el/zz", clientv3.GetPrefixRangeEnd("/a/el/zz"), true},   // inside
		{"/a/ek", clientv3.GetPrefixRangeEnd("/a/ek"), false},        // sibling below
		{"/a/el0", clientv3.GetPrefixRangeEnd("/a/el0"), false},      // sibling above
		{"", "\x00", true},                                           // everything
		{"\x00", clientv3.GetPrefixRangeEnd("/a/el/\xff\xff"), true}, // from the start into it
	} {
		if got := overlapsPrefix(tc.key, tc.end, p); got != tc.want {
			t.Errorf("overlapsPrefix(%q, %q, %q) = %v, want %v", tc.key, tc.end, p, got, tc.want)
		}
	}
}

// TestBackoff: the election's schedule draws each delay from [cur/2, cur],
// cur doubling from the minimum to the maximum.
func TestBackoff(t *testing.T) {
	b := newBackoff(100*time.Millisecond, time.Second)
	for i, c := range []time.Duration{100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000, 1000} {
		c *= time.Millisecond
		if d := b.Next(); d < c/2 || d > c {
			t.Fatalf("step %d: %v outside [%v, %v]", i, d, c/2, c)
		}
	}
	b.Reset()
	if d := b.Next(); d < 50*time.Millisecond || d > 100*time.Millisecond {
		t.Fatalf("after reset: %v", d)
	}
}

func TestEtcdLoggerForwardsErrorsOnly(t *testing.T) {
	var buf bytes.Buffer
	lg := etcdLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), nil)
	lg.With(zap.String("local-member-id", "abc")).Error("raft failed", zap.Int("Applied-Index", 7))
	lg.Warn("dropped warning")
	lg.Info("dropped info")
	out := buf.String()
	for _, want := range []string{`msg="etcd log"`, `etcd_msg="raft failed"`, "etcd_local_member_id=abc", "etcd_applied_index=7", "level=ERROR"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "dropped") {
		t.Errorf("warnings or info forwarded: %q", out)
	}
	if strings.Count(out, "\n") != 1 {
		t.Errorf("want one line, got %q", out)
	}
	if etcdLogger(nil, nil).Core().Enabled(zapcore.FatalLevel) {
		t.Error("nil logger: want a no-op zap logger")
	}
}
