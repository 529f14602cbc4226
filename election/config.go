package election

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultPrefix is the election prefix used when none is configured.
const DefaultPrefix = "/isobar/global/election/"

// DefaultTTL is the session lease TTL used when none is configured.
const DefaultTTL = 2 * time.Second

const (
	defaultMinBackoff = 100 * time.Millisecond
	defaultMaxBackoff = 2 * time.Second
)

// Config holds a candidate's values. Zero fields take the defaults
// documented on each field.
type Config struct {
	// Prefix of the election keys. Default DefaultPrefix. Always normalised
	// to end in "/" so that "/a/election" never matches the keys of a
	// sibling prefix such as "/a/election-other/". Must not be "/" alone
	// (the whole keyspace).
	Prefix string
	// ID identifies this candidate; it is written as the value of its
	// election key, so observers and standbys can name the leader.
	// Required.
	ID string
	// TTL of the session lease: a crashed leader is replaced within about
	// TTL (plus etcd's lease-expiry tick of 0.5 s). Default 2 s. etcd leases
	// have one-second granularity, so TTL must be at least 1 s and is
	// rounded up to whole seconds. etcd also raises a TTL below its own
	// minimum (1.5 election timeouts, rounded up; 1 s for StartEmbedded's
	// settings, 2 s for etcd's defaults).
	TTL time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential back-off of
	// Run between failed campaigns or failed terms. Defaults 100 ms and 2 s.
	MinBackoff time.Duration
	MaxBackoff time.Duration
}

// Deps holds a candidate's collaborators. Nil fields fall back: Clock to the
// real clock, Logger to a discarding logger, Registerer to no registration.
type Deps struct {
	Logger     *slog.Logger
	Clock      clockwork.Clock
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	c.Prefix = normalizePrefix(c.Prefix)
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = defaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = defaultMaxBackoff
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.ID == "":
		return fmt.Errorf("%w: ID is empty: set it to a name that identifies this candidate (e.g. name@address)", ErrInvalidConfig)
	case c.Prefix == "/":
		return fmt.Errorf("%w: Prefix %q is the whole keyspace: use a dedicated prefix such as %q", ErrInvalidConfig, c.Prefix, DefaultPrefix)
	case c.TTL < time.Second:
		return fmt.Errorf("%w: TTL %v: etcd leases are whole seconds, set TTL >= 1s", ErrInvalidConfig, c.TTL)
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("%w: MinBackoff %v, MaxBackoff %v: want 0 <= MinBackoff <= MaxBackoff", ErrInvalidConfig, c.MinBackoff, c.MaxBackoff)
	}
	return nil
}

// ttlSeconds is TTL rounded up to whole seconds, as etcd leases need.
func (c Config) ttlSeconds() int64 {
	return int64((c.TTL + time.Second - 1) / time.Second)
}

func (d Deps) withDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return d
}

// normalizePrefix returns the election prefix in the one form this package
// uses everywhere: DefaultPrefix for "", otherwise p with a trailing "/".
// Upstream NewElection appends "/" to its argument while ResumeElection
// does not (etcd PR #10297); NewElection and ResumeElection in this package
// take either form and hand upstream what it expects.
func normalizePrefix(p string) string {
	if p == "" {
		return DefaultPrefix
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p
}
