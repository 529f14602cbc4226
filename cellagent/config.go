package cellagent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/internal/grpcbounds"
)

// Defaults of Config. They are exported so that command-line help and other
// packages (the lab) can show and reuse them.
const (
	DefaultInterval      = 500 * time.Millisecond
	DefaultWindow        = 10 * time.Second
	DefaultScrapeTimeout = time.Second
	// DefaultHealthTimeouts is Config.HealthTimeouts' default.
	DefaultHealthTimeouts  = 3
	DefaultMaxBodyBytes    = 8 << 20
	DefaultShutdownTimeout = 2 * time.Second
	DefaultBackoffMin      = 100 * time.Millisecond
	// DefaultBackoffMax bounds the reconnect backoff: after a controller
	// restart an agent is back within this (plus a dial) of the new
	// controller listening, which the controller's warm start waits for
	// (regional.DefaultAgentBackoffMax).
	DefaultBackoffMax = 2 * time.Second

	// MinInterval and MaxInterval bound the heartbeat interval, whether it
	// comes from Config or from a controller's ack.
	MinInterval = 10 * time.Millisecond
	MaxInterval = time.Minute

	maxCellIDLen = 128
)

// DefaultCompletionHandlers returns the default Config.CompletionHandlers:
// the vLLM handlers whose http_requests_total series feed the error rate.
func DefaultCompletionHandlers() []string {
	return []string{"/v1/completions", "/v1/chat/completions"}
}

// TLSFiles names the PEM files for mutual TLS towards the controller. Either
// all three are set or none. The controller checks the client certificate's
// identity against the cell id and region in the heartbeats, so the
// certificate must carry both as the URI SAN
// spiffe://isobar/region/<region>/cell/<cell-id>; a common name or DNS SAN
// does not count.
type TLSFiles struct {
	// Cert is the client certificate chain (PEM).
	Cert string
	// Key is the client private key (PEM).
	Key string
	// CA is the bundle that verifies the controller's certificate (PEM).
	CA string
	// ServerName overrides the name checked in the controller's certificate.
	// Default: the host part of Config.ControllerAddr.
	ServerName string
}

func (t TLSFiles) enabled() bool { return t.Cert != "" || t.Key != "" || t.CA != "" }

// Config holds the values of one cellagent. The zero value of a field means
// its default, as documented on the field.
type Config struct {
	// CellID is the stable id of this cell: [A-Za-z0-9._-], at most 128
	// bytes. Required for an Agent, not for ScrapeOnce.
	CellID string
	// Region is the region the cell belongs to. Required for an Agent.
	Region string
	// Keepalive of the heartbeat stream's connection: a controller that
	// vanished without closing is noticed within Time + Timeout
	// (internal/grpcbounds defaults: 10 s + 5 s).
	Keepalive grpcbounds.Client
	// ControllerAddr is the regional controller's gRPC address, host:port.
	// Required for an Agent.
	ControllerAddr string
	// VLLMURL is the full URL of the engine's Prometheus page, e.g.
	// http://127.0.0.1:8000/metrics. /health and /v1/models are found beside
	// it (same scheme, host and port). Required.
	VLLMURL string
	// DCGMURL is the full URL of the dcgm-exporter page, e.g.
	// http://127.0.0.1:9400/metrics. Empty: no DCGM; the hardware signals are
	// absent and the dcgm source reports ok=false "not configured".
	DCGMURL string
	// DCGMGPU selects this cell's GPU among those the exporter (or NVML)
	// serves: a decimal index (label gpu) or a UUID (label UUID, "GPU-...").
	// Empty: the exporter must serve exactly one GPU.
	DCGMGPU string
	// NVML reads the GPU through NVML instead of dcgm-exporter (needs a
	// binary built with -tags nvml). Exclusive with DCGMURL. Its health is
	// reported as the dcgm source.
	NVML bool
	// Advertise is the host:port the data plane sends requests to. Default:
	// the host:port of VLLMURL.
	Advertise string
	// Interval is the heartbeat interval. Default 500ms; must lie within
	// [MinInterval, MaxInterval]. A controller's ack may change it.
	Interval time.Duration
	// ScrapeInterval is the period of the scrapes. Default: Interval.
	ScrapeInterval time.Duration
	// Window is the sliding window over which TTFT P95, error rate and
	// request rate are computed from counter deltas. Default 10s.
	Window time.Duration
	// ScrapeTimeout bounds each HTTP request (metrics, /health, /v1/models,
	// dcgm). Default 1s. See HealthTimeouts for a /health probe that times
	// out.
	ScrapeTimeout time.Duration
	// HealthTimeouts is how many consecutive /health probes must time out
	// before an engine that answered the probe before them counts as down
	// (FAILED), as a liveness probe's failure threshold: a busy engine or
	// a loaded machine can miss one deadline, and one miss taking a
	// healthy cell out of the routes costs more than a hung engine served
	// a few seconds longer. A refused or reset connection (a dead engine)
	// counts at once, and so does a timeout when the engine was not
	// answering already. Default 3; 1 makes every timeout count.
	HealthTimeouts int
	// MaxBodyBytes caps each response body read. Default 8 MiB.
	MaxBodyBytes int64
	// CompletionHandlers are the http_requests_total handler label values
	// that count for the error rate. Default: /v1/completions and
	// /v1/chat/completions.
	CompletionHandlers []string
	// StartupGrace: while the engine has never been reachable since the agent
	// started, and for at most this long, an unreachable engine is reported
	// LOADING instead of FAILED (vLLM only listens once its model is
	// loaded). Default 0: disabled, unreachable is always FAILED.
	StartupGrace time.Duration
	// ShutdownTimeout bounds how long Stop waits for the final TERMINATED
	// heartbeat to be delivered. Default 2s.
	ShutdownTimeout time.Duration
	// BackoffMin and BackoffMax bound the jittered exponential backoff
	// between stream reconnects: attempt k waits uniformly in
	// [0, min(BackoffMax, BackoffMin·2^k)), so the first retry comes
	// within BackoffMin and none waits BackoffMax or more. Defaults 100ms
	// and 2s; a regional controller holds its first push for TTL plus
	// the largest of these (regional.WarmStartConfig.AgentBackoffMax).
	BackoffMin, BackoffMax time.Duration
	// MetricsListen, when set, is the address Run serves /metrics on.
	MetricsListen string
	// TLS enables mutual TLS towards the controller. Default: plaintext.
	TLS TLSFiles
	// PrefillTokensPerSecond is the engine's prefill throughput in prompt
	// tokens per second (its capacity class), as declared for the
	// deployment: vLLM does not publish it. Sent in the heartbeat's
	// capability; the controller hands it to the data plane, whose pick
	// weighs queued prompt tokens by it. 0 (the default): unknown. Must be
	// finite and at most MaxPrefillTokensPerSecond.
	PrefillTokensPerSecond float64
	// MaxNumSeqs is the engine's running-batch cap (vLLM --max-num-seqs),
	// as declared for the deployment. Sent in the heartbeat's capability.
	// 0 (the default): unknown. At most MaxMaxNumSeqs.
	MaxNumSeqs uint32
}

// Bounds of the declared capacity (Config.PrefillTokensPerSecond and
// Config.MaxNumSeqs): far above any engine; a larger value is a mistake.
const (
	MaxPrefillTokensPerSecond = 1e9
	MaxMaxNumSeqs             = 1 << 20
)

// Deps holds the collaborators of an Agent. Every field may be nil.
type Deps struct {
	// Clock drives every timer of the agent. Nil: the real clock. Network
	// deadlines (ScrapeTimeout, ShutdownTimeout) use real time.
	Clock clockwork.Clock
	// Logger receives structured logs. Nil: logs are discarded.
	Logger *slog.Logger
	// Registerer receives the agent's metrics. Nil: metrics are not
	// registered.
	Registerer prometheus.Registerer
	// HTTPClient performs the scrapes. Nil: a client with keep-alives and no
	// proxy. Per-request timeouts come from Config.ScrapeTimeout.
	HTTPClient *http.Client
	// DialOptions are added to the gRPC dial options (after the transport
	// credentials the agent derives from Config.TLS).
	DialOptions []grpc.DialOption
}

// FieldError reports a Config field with a bad value. The command line maps
// Field to its flag.
type FieldError struct {
	// Field is the Config field name, e.g. "Interval" or "TLS.Cert".
	Field string
	// Problem says what is wrong and what to do.
	Problem string
}

func (e *FieldError) Error() string {
	return "cellagent: Config." + e.Field + ": " + e.Problem
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// DefaultConfig returns a Config with every default filled in, the one
// source of the defaults (isobar cellagent's flags take theirs from it).
// The defaults derived from other fields stay zero, filled when the agent
// is built: ScrapeInterval (Interval) and Advertise (host:port of
// VLLMURL).
func DefaultConfig() Config {
	c := Config{}.withDefaults()
	c.ScrapeInterval, c.Advertise = 0, ""
	return c
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = c.Interval
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.ScrapeTimeout == 0 {
		c.ScrapeTimeout = DefaultScrapeTimeout
	}
	if c.HealthTimeouts == 0 {
		c.HealthTimeouts = DefaultHealthTimeouts
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if len(c.CompletionHandlers) == 0 {
		c.CompletionHandlers = DefaultCompletionHandlers()
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = DefaultBackoffMin
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.Advertise == "" {
		if u, err := url.Parse(c.VLLMURL); err == nil && u.Host != "" {
			c.Advertise = hostPortOf(u)
		}
	}
	return c
}

// validateScrape checks the fields ScrapeOnce needs.
func (c Config) validateScrape() error {
	if c.VLLMURL == "" {
		return fieldErr("VLLMURL", "required: the full URL of the engine's /metrics page")
	}
	if err := checkHTTPURL(c.VLLMURL); err != nil {
		return fieldErr("VLLMURL", "%v", err)
	}
	if c.DCGMURL != "" {
		if c.NVML {
			return fieldErr("DCGMURL", "set together with NVML; choose one hardware source")
		}
		if err := checkHTTPURL(c.DCGMURL); err != nil {
			return fieldErr("DCGMURL", "%v", err)
		}
	}
	if c.DCGMGPU != "" {
		if _, err := parseGPUSelector(c.DCGMGPU); err != nil {
			return fieldErr("DCGMGPU", "%v", err)
		}
	}
	if c.ScrapeTimeout < 0 {
		return fieldErr("ScrapeTimeout", "must be positive, got %v", c.ScrapeTimeout)
	}
	if c.MaxBodyBytes < 1024 {
		return fieldErr("MaxBodyBytes", "must be at least 1024 bytes, got %d", c.MaxBodyBytes)
	}
	if c.Window < 0 {
		return fieldErr("Window", "must be positive, got %v", c.Window)
	}
	for _, h := range c.CompletionHandlers {
		if h == "" {
			return fieldErr("CompletionHandlers", "contains an empty handler")
		}
	}
	return nil
}

// validate checks the fields an Agent needs. Call it on withDefaults().
func (c Config) validate() error {
	if err := c.validateScrape(); err != nil {
		return err
	}
	if err := c.Keepalive.Validate(); err != nil {
		return fieldErr("Keepalive", "%v", err)
	}
	if c.CellID == "" {
		return fieldErr("CellID", "required: a stable id of this cell ([A-Za-z0-9._-], at most 128 bytes)")
	}
	if err := checkCellID(c.CellID); err != nil {
		return fieldErr("CellID", "%v", err)
	}
	if c.Region == "" {
		return fieldErr("Region", "required: the region this cell belongs to")
	}
	if c.ControllerAddr == "" {
		return fieldErr("ControllerAddr", "required: the regional controller's host:port")
	}
	if _, _, err := net.SplitHostPort(c.ControllerAddr); err != nil {
		return fieldErr("ControllerAddr", "want host:port, got %q", c.ControllerAddr)
	}
	if c.Advertise == "" {
		return fieldErr("Advertise", "required when VLLMURL has no host")
	}
	if _, port, err := net.SplitHostPort(c.Advertise); err != nil || port == "" {
		return fieldErr("Advertise", "want host:port, got %q", c.Advertise)
	}
	if c.Interval < MinInterval || c.Interval > MaxInterval {
		return fieldErr("Interval", "must lie within [%v, %v], got %v", MinInterval, MaxInterval, c.Interval)
	}
	if c.ScrapeInterval < MinInterval || c.ScrapeInterval > MaxInterval {
		return fieldErr("ScrapeInterval", "must lie within [%v, %v], got %v", MinInterval, MaxInterval, c.ScrapeInterval)
	}
	if c.ShutdownTimeout < 0 {
		return fieldErr("ShutdownTimeout", "must be positive, got %v", c.ShutdownTimeout)
	}
	if c.HealthTimeouts < 0 {
		return fieldErr("HealthTimeouts", "must be at least 1, got %d", c.HealthTimeouts)
	}
	if c.StartupGrace < 0 {
		return fieldErr("StartupGrace", "must not be negative, got %v", c.StartupGrace)
	}
	if c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin {
		return fieldErr("BackoffMin", "want 0 < BackoffMin <= BackoffMax, got %v and %v", c.BackoffMin, c.BackoffMax)
	}
	if !(c.PrefillTokensPerSecond >= 0 && c.PrefillTokensPerSecond <= MaxPrefillTokensPerSecond) {
		return fieldErr("PrefillTokensPerSecond", "want 0 (unknown) or a rate in prompt tokens per second up to %g, got %v",
			float64(MaxPrefillTokensPerSecond), c.PrefillTokensPerSecond)
	}
	if c.MaxNumSeqs > MaxMaxNumSeqs {
		return fieldErr("MaxNumSeqs", "want 0 (unknown) up to %d, got %d", MaxMaxNumSeqs, c.MaxNumSeqs)
	}
	if c.TLS.enabled() {
		switch {
		case c.TLS.Cert == "":
			return fieldErr("TLS.Cert", "mutual TLS needs the certificate, key and CA together; the certificate is missing")
		case c.TLS.Key == "":
			return fieldErr("TLS.Key", "mutual TLS needs the certificate, key and CA together; the key is missing")
		case c.TLS.CA == "":
			return fieldErr("TLS.CA", "mutual TLS needs the certificate, key and CA together; the CA bundle is missing")
		}
	}
	return nil
}

func checkCellID(id string) error {
	if len(id) > maxCellIDLen {
		return fmt.Errorf("longer than %d bytes", maxCellIDLen)
	}
	for i := 0; i < len(id); i++ {
		b := id[i]
		ok := b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-'
		if !ok {
			return fmt.Errorf("%q: byte %d (%q) is outside [A-Za-z0-9._-]", id, i, b)
		}
	}
	return nil
}

func checkHTTPURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("want an http:// or https:// URL, got %q", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("no host in %q", raw)
	}
	return nil
}

// hostPortOf returns u's host:port, filling in the scheme's default port.
func hostPortOf(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	return net.JoinHostPort(u.Hostname(), strconv.Itoa(port))
}

// siblingURL returns the URL with the same scheme and host as base and the
// given path.
func siblingURL(base, path string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: path}).String(), nil
}

// ErrNoNVML is returned when NVML is requested from a binary built without
// the nvml tag. Check it with errors.Is.
var ErrNoNVML = errors.New("cellagent: built without NVML support; rebuild with -tags nvml")
