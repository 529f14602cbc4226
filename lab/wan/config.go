package wan

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
	"unicode"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// Errors. Test with errors.Is.
var (
	// ErrInvalidConfig wraps every Config and SetDelay refusal; the message
	// names the field and what to change.
	ErrInvalidConfig = errors.New("wan: invalid config")
	// ErrStarted: Start was called a second time.
	ErrStarted = errors.New("wan: already started")
	// ErrStopped: Start was called after Stop.
	ErrStopped = errors.New("wan: stopped")
)

// Defaults of Config.
const (
	DefaultListen      = "127.0.0.1:0"
	DefaultDialTimeout = 5 * time.Second
	DefaultChunkSize   = 32 << 10
	DefaultQueueLen    = 256
	DefaultSessionIdle = time.Minute
)

// Limits of Config and SetDelay.
const (
	// MaxDelay bounds Delay and Jitter: an emulated path slower than this
	// is a mistake (a unit slip), not a WAN.
	MaxDelay = time.Minute
	// MaxChunkSize bounds ChunkSize.
	MaxChunkSize = 1 << 20
	// MaxQueueLen bounds QueueLen.
	MaxQueueLen = 1 << 16
	// maxPathBytes bounds Path, a metric label.
	maxPathBytes = 64
)

// Config is one emulated WAN path: where it listens, where it forwards, and
// the one-way delay it adds in each direction. The same Config serves New
// (TCP) and NewUDP; fields that one of them does not use are ignored.
type Config struct {
	// Path names the path in metrics (label path) and logs, e.g. "a-b" for
	// region a's traffic to region b. Required; printable, no spaces, at
	// most 64 bytes. Unique per registry and protocol: two proxies with the
	// same Path and protocol share their metric series.
	Path string
	// Listen is the address the proxy accepts on. Default 127.0.0.1:0 (a
	// free port; read it back with Addr). To put a TCP and a UDP proxy of
	// one path on the same port (memberlist uses one port for both), give
	// NewUDP the TCP proxy's Addr.
	Listen string
	// Target is the far end, host:port, dialled once per accepted TCP
	// connection (once per UDP client session). Required; SetTarget changes
	// it for later connections.
	Target string
	// Delay is the one-way delay added to each direction. Default 0.
	// A round trip through the path takes 2×Delay more than without it.
	Delay time.Duration
	// Jitter spreads each chunk's delay uniformly over
	// [Delay-Jitter, Delay+Jitter], clipped at 0; order is kept (see the
	// package doc). Default 0.
	Jitter time.Duration
	// Seed seeds the jitter samples. Each connection (UDP session) and
	// direction draws from its own generator, seeded from Seed and the
	// connection's sequence number, so a run with the same Seed and the
	// same connection order samples the same delays. Default 0 (a valid
	// seed).
	Seed uint64
	// DialTimeout bounds the TCP dial to Target. Default 5s.
	DialTimeout time.Duration
	// ChunkSize is the TCP read size: bytes read together share one delay
	// sample. Default 32 KiB, at most 1 MiB.
	ChunkSize int
	// QueueLen is how many chunks (TCP) or datagrams (UDP) per direction
	// may be held in the delay line. A full TCP line stops reading, so the
	// sender feels TCP back-pressure; a full UDP line drops datagrams.
	// Default 256, at most 65536.
	QueueLen int
	// SessionIdle closes a UDP client session after this long without a
	// datagram either way. Default 1m, at least 1ms.
	SessionIdle time.Duration
}

func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.QueueLen == 0 {
		c.QueueLen = DefaultQueueLen
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = DefaultSessionIdle
	}
	return c
}

func fieldErr(field, format string, a ...any) error {
	return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, fmt.Sprintf(format, a...))
}

func (c Config) validate() error {
	if err := validPath(c.Path); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fieldErr("Listen", "%q: want host:port, e.g. 127.0.0.1:0 (%v)", c.Listen, err)
	}
	if err := validTarget(c.Target); err != nil {
		return err
	}
	if err := validDelay(c.Delay, c.Jitter); err != nil {
		return err
	}
	if c.DialTimeout < 0 {
		return fieldErr("DialTimeout", "%v is negative: want a positive duration, or 0 for %v", c.DialTimeout, DefaultDialTimeout)
	}
	if c.ChunkSize < 1 || c.ChunkSize > MaxChunkSize {
		return fieldErr("ChunkSize", "%d: want 1 to %d bytes, or 0 for %d", c.ChunkSize, MaxChunkSize, DefaultChunkSize)
	}
	if c.QueueLen < 1 || c.QueueLen > MaxQueueLen {
		return fieldErr("QueueLen", "%d: want 1 to %d, or 0 for %d", c.QueueLen, MaxQueueLen, DefaultQueueLen)
	}
	if c.SessionIdle < time.Millisecond {
		return fieldErr("SessionIdle", "%v: want at least 1ms, or 0 for %v", c.SessionIdle, DefaultSessionIdle)
	}
	return nil
}

func validPath(p string) error {
	if p == "" {
		return fieldErr("Path", "is empty: name the path, e.g. \"a-b\"")
	}
	if len(p) > maxPathBytes {
		return fieldErr("Path", "%q is longer than %d bytes", p, maxPathBytes)
	}
	for _, r := range p {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fieldErr("Path", "%q contains %q: use printable characters without spaces", p, r)
		}
	}
	return nil
}

func validTarget(t string) error {
	host, port, err := net.SplitHostPort(t)
	if err != nil || host == "" || port == "" || port == "0" {
		return fieldErr("Target", "%q: want the far end's host:port, e.g. 127.0.0.1:9000", t)
	}
	return nil
}

func validDelay(delay, jitter time.Duration) error {
	if delay < 0 || delay > MaxDelay {
		return fieldErr("Delay", "%v: want 0 to %v", delay, MaxDelay)
	}
	if jitter < 0 || jitter > MaxDelay {
		return fieldErr("Jitter", "%v: want 0 to %v", jitter, MaxDelay)
	}
	return nil
}

// Deps are the proxy's collaborators. Nil fields get defaults.
type Deps struct {
	// Clock times the delay line and the UDP idle sweep. Nil: the real
	// clock.
	Clock clockwork.Clock
	// Logger receives structured logs. Nil: logs are discarded.
	Logger *slog.Logger
	// Registerer receives the isobar_wan_* metrics. Nil: metrics are kept
	// but not registered. Several proxies may share one registry.
	Registerer prometheus.Registerer
}

func (d Deps) withDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return d
}
