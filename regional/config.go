package regional

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/regional/projection"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/regional/xds"
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/summary"
)

// Config holds the regional controller's settings. Zero fields take the
// documented defaults in withDefaults.
type Config struct {
	// Region is this controller's region; heartbeats naming another region
	// are refused. Required.
	Region string
	// Zone is the locality zone written into xDS. Default: Region.
	Zone string
	// Listen is the gRPC address serving CellRegistry and xDS (ADS).
	// Default 127.0.0.1:18000.
	Listen string
	// HTTPListen serves /metrics, /debug/cells and the drain API, over
	// TLS when TLS is set. Default 127.0.0.1:9090. "-" disables it.
	HTTPListen string
	// HeartbeatInterval is the interval the controller tells agents to use.
	// Default 500 ms.
	HeartbeatInterval time.Duration
	// TTLGrace: a cell is Failed when no heartbeat came for
	// HeartbeatInterval + TTLGrace. Default 500 ms (TTL 1 s).
	TTLGrace time.Duration
	// CycleInterval: how often pressure is rescored and weights projected
	// (state changes are handled at once). Default 100 ms.
	CycleInterval time.Duration
	// ProbeInterval and ProbeTimeout: active RTT/jitter probes of each cell.
	// Defaults 1 s and 500 ms. A round's dials are spread over the first
	// half of the interval, not started at once.
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	// ProbeMaxPerRound bounds the cells probed per round, so that the
	// probes' cost stays flat in the region's size: with more live cells,
	// each round probes the ones probed longest ago, and a cell is probed
	// every ⌈cells / ProbeMaxPerRound⌉ rounds. Default 1,000 (every cell
	// every second up to 1,000 cells; at 10,000, every 10 s).
	ProbeMaxPerRound int
	// ProbeSteadyInterval is how often a cell whose RTT estimate is steady
	// is probed (probe.go cadence); a new cell, one whose last sample moved
	// or whose last probe failed is probed every ProbeInterval. Default
	// 10 s; ProbeInterval probes every cell every round.
	ProbeSteadyInterval time.Duration
	// MassExpiry: when many cells pass their TTL at once, the controller
	// holds them rather than failing them (massexpiry.go).
	MassExpiry MassExpiryConfig
	// ForgetAfter: Failed and Terminated cells stay visible in the registry
	// (debug, status) this long, then are forgotten. Default 5 min.
	ForgetAfter time.Duration
	// MaxMessageBytes caps one heartbeat message, checked on its encoded
	// size before it is decoded (ResourceExhausted, reason oversized).
	// Default 64 KiB.
	MaxMessageBytes int
	// FirstHeartbeatTimeout: a heartbeat stream that sends nothing this
	// long after it opens is closed with DeadlineExceeded (reason
	// first_heartbeat_timeout). An agent sends its first heartbeat at once.
	// Default 10 s.
	FirstHeartbeatTimeout time.Duration
	// Keepalive is the gRPC server's keepalive, ping enforcement and
	// per-connection stream cap (internal/grpcbounds defaults: pings after
	// 10 s idle, 5 s timeout, clients may ping every 5 s, 100 streams per
	// connection).
	Keepalive grpcbounds.Server
	// InboxSize is the registry's inbox capacity. Default 8192.
	InboxSize int
	// DataPlaneWindow: data-plane reports (demand, caller-side errors per
	// cell) are averaged over this window. Default 10 s.
	DataPlaneWindow time.Duration
	// AdminToken, when set, is a credential for the admin endpoints (debug
	// pages, drain API): Authorization: Bearer <token>. With TLS, an
	// operator client certificate is the other; with neither TLS nor a
	// token the endpoints are open. POSTs need Content-Type
	// application/json and cross-origin requests are refused (see
	// adminPolicy).
	AdminToken string
	// TLS enables mTLS on the gRPC listener and requires identities:
	// cellagents must present spiffe://isobar/region/<Region>/cell/<id>
	// for the cell they heartbeat for, xDS and DataPlane clients
	// spiffe://isobar/gateway/<Region>, and the global leader dialled
	// spiffe://isobar/global/<name> (see identity.go).
	TLS TLSFiles
	// EndpointBinding: how a cell's advertised endpoint is checked against
	// its certificate (endpointbind.go). Empty: BindSAN with TLS (the
	// endpoint's IP must be an IP SAN of the cell's certificate), BindOff
	// without, decided when the controller starts, so a Config from
	// DefaultConfig that gets TLS later is strict. BindSAN and BindMapping
	// need TLS.
	EndpointBinding EndpointBinding
	// EndpointMap: the cell-id → prefixes map of BindMapping (required by
	// it, refused with another mode). ParseEndpointMap builds it.
	EndpointMap *EndpointMap

	Score      score.Config
	Projection projection.Config
	XDS        xds.Config
	// Global configures cross-region routing (active when Deps.Etcd or
	// Deps.Gossip is set).
	Global GlobalConfig
	// Limits bound what peers can make the controller hold (see Limits).
	Limits Limits
	// WarmStart holds the first xDS push after a start until the cells
	// are back (warmstart.go, docs/design.md §5.4).
	WarmStart WarmStartConfig
	// Gossip is the memberlist node New builds (NewGossip) when
	// Gossip.Listen is set and Deps.Gossip is nil; the controller then
	// starts and stops it.
	Gossip GossipConfig
	// Etcd is the cluster New connects to when Etcd.Endpoints is set and
	// Deps.Etcd is nil, to find the global leader; the controller then
	// closes the client on Stop. Its Logger defaults to Deps.Logger.
	Etcd election.ClientConfig
	// Residency pins tenants' and models' requests to regions (package
	// residency): the controller refuses a plan that breaks it, builds one
	// pinned cluster per set and keeps pinned requests in their regions
	// when the plan is stale or gone (pinning.go, cycle/pinned.go). nil
	// pins nothing.
	Residency *residency.Config
	// FleetRegions lists the fleet's regions (this one may be left out).
	// When set, a Residency set naming a region outside them refuses the
	// start; when empty, regions the config names that no plan or gossip
	// has shown are counted at run time
	// (isobar_regional_residency_unseen_regions). isobar regional
	// requires it (--fleet-regions) whenever --residency names another
	// region than its own.
	FleetRegions []string
	// StaticRetryBudget turns the dynamic retry budget off: every model's
	// clusters keep XDS.RetryBudgetPercent. Default false: the budget
	// follows the region's utilisation per model (load over capacity of
	// its Ready cells, from the summary; retrybudget.go) along
	// xds.DefaultRetryBudgetCurve(XDS.RetryBudgetPercent).
	StaticRetryBudget bool
}

// GossipConfig is the region's gossip member (regional/gossip): its role,
// region and advertised ingress come from Config (Region,
// Global.IngressAddress), its identity from Config.TLS.
type GossipConfig struct {
	// Listen is the memberlist address, host:port (UDP and TCP). Empty:
	// no gossip node is built.
	Listen string
	// Join lists seed members as host:port. Empty: others join this one.
	Join []string
	// SecretKey encrypts all gossip (16, 24 or 32 bytes; gossip.ParseKey
	// reads a key file). Required with TLS, where it binds members to
	// their certificates.
	SecretKey []byte
	// Profile selects memberlist's timings. Default gossip.ProfileWAN.
	Profile string
	// RTTSmoothing is the EWMA weight of a new RTT sample. Default
	// gossip.DefaultRTTSmoothing.
	RTTSmoothing float64
}

// TLSFiles names PEM files for mutual TLS. All three or none.
type TLSFiles struct {
	Cert, Key, CA string
}

// Enabled reports whether any TLS file is set.
func (t TLSFiles) Enabled() bool { return t.Cert != "" || t.Key != "" || t.CA != "" }

// Validate checks that all or none are set.
func (t TLSFiles) Validate() error {
	if t.Enabled() && (t.Cert == "" || t.Key == "" || t.CA == "") {
		return fmt.Errorf("%w: --tls-cert, --tls-key and --tls-ca must be given together", ErrInvalidConfig)
	}
	return nil
}

// DefaultConfig returns a Config with every default filled in, for region.
func DefaultConfig(region string) Config {
	c := Config{Region: region}
	c.withDefaults()
	return c
}

// TTL is the time without heartbeats after which a cell is Failed.
func (c Config) TTL() time.Duration { return c.HeartbeatInterval + c.TTLGrace }

func (c *Config) withDefaults() {
	if c.Zone == "" {
		c.Zone = c.Region
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:18000"
	}
	if c.HTTPListen == "" {
		c.HTTPListen = "127.0.0.1:9090"
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 500 * time.Millisecond
	}
	if c.TTLGrace == 0 {
		c.TTLGrace = 500 * time.Millisecond
	}
	if c.CycleInterval == 0 {
		c.CycleInterval = 100 * time.Millisecond
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = time.Second
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = 500 * time.Millisecond
	}
	if c.ProbeMaxPerRound == 0 {
		c.ProbeMaxPerRound = 1000
	}
	if c.ProbeSteadyInterval == 0 {
		c.ProbeSteadyInterval = max(10*time.Second, c.ProbeInterval)
	}
	if c.ForgetAfter == 0 {
		c.ForgetAfter = 5 * time.Minute
	}
	c.MassExpiry = c.MassExpiry.withDefaults()
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 64 << 10
	}
	if c.FirstHeartbeatTimeout == 0 {
		c.FirstHeartbeatTimeout = 10 * time.Second
	}
	c.Keepalive = c.Keepalive.WithDefaults()
	if c.InboxSize == 0 {
		c.InboxSize = 8192
	}
	if c.DataPlaneWindow == 0 {
		c.DataPlaneWindow = 10 * time.Second
	}
	if c.Score == (score.Config{}) {
		c.Score = score.DefaultConfig()
	}
	if c.Projection == (projection.Config{}) {
		c.Projection = projection.DefaultConfig()
	}
	if c.XDS.Region == "" {
		c.XDS.Region = c.Region
	}
	if c.XDS.Zone == "" {
		c.XDS.Zone = c.Zone
	}
	if c.XDS.RetryBudgetPercent == 0 {
		// xds.Config's own default, made explicit: the dynamic retry
		// budget's maximum (retrybudget.go).
		c.XDS.RetryBudgetPercent = 20
	}
	c.Global.withDefaults()
	c.Limits.withDefaults()
	c.WarmStart.withDefaults(c.TTL())
}

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("regional: invalid config")

func (c Config) validate() error {
	if !summary.ValidName(c.Region) {
		return fmt.Errorf("%w: region %q: want 1-128 characters of [A-Za-z0-9._-]", ErrInvalidConfig, c.Region)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("%w: listen address %q: %v", ErrInvalidConfig, c.Listen, err)
	}
	if c.HTTPListen != "-" {
		if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
			return fmt.Errorf("%w: http listen address %q: %v", ErrInvalidConfig, c.HTTPListen, err)
		}
	}
	durations := []struct {
		name string
		d    time.Duration
	}{
		{"heartbeat interval", c.HeartbeatInterval}, {"TTL grace", c.TTLGrace},
		{"cycle interval", c.CycleInterval}, {"probe interval", c.ProbeInterval},
		{"probe timeout", c.ProbeTimeout}, {"forget-after", c.ForgetAfter},
		{"first heartbeat timeout", c.FirstHeartbeatTimeout},
	}
	for _, d := range durations {
		if d.d <= 0 {
			return fmt.Errorf("%w: %s must be > 0, got %v", ErrInvalidConfig, d.name, d.d)
		}
	}
	if c.ProbeMaxPerRound < 1 {
		return fmt.Errorf("%w: probes per round %d: want at least 1", ErrInvalidConfig, c.ProbeMaxPerRound)
	}
	if c.ProbeSteadyInterval < c.ProbeInterval {
		return fmt.Errorf("%w: steady probe interval %v is shorter than the probe interval %v: want at least the probe interval",
			ErrInvalidConfig, c.ProbeSteadyInterval, c.ProbeInterval)
	}
	if f := c.MassExpiry.Fraction; !(f > 0 && f <= 1) {
		return fmt.Errorf("%w: mass expiry fraction %v: want a share of the live cells in (0, 1]", ErrInvalidConfig, f)
	}
	if c.MaxMessageBytes < 1024 {
		return fmt.Errorf("%w: max message size %d: want at least 1024 bytes", ErrInvalidConfig, c.MaxMessageBytes)
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if err := c.validateEndpointBinding(); err != nil {
		return err
	}
	if err := c.Keepalive.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := c.Global.Keepalive.Validate(); err != nil {
		return fmt.Errorf("%w: global: %w", ErrInvalidConfig, err)
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	if err := c.WarmStart.validate(); err != nil {
		return err
	}
	if c.Global.SummaryInterval <= 0 || c.Global.NominalCellRPS <= 0 || c.Global.Headroom <= 0 || c.Global.Headroom > 1 ||
		c.Global.LocalFill < 0 || c.Global.LocalFill > 1 || math.IsNaN(c.Global.LocalFill) {
		return fmt.Errorf("%w: global: summary interval, nominal cell RPS must be > 0, headroom in (0,1] and local fill in [0,1]", ErrInvalidConfig)
	}
	if err := c.Global.Capacity.Validate(); err != nil {
		return fmt.Errorf("%w: global: %w", ErrInvalidConfig, err)
	}
	if a := c.Global.IngressAddress; a != "" {
		if err := ingressAddress(a); err != nil {
			return fmt.Errorf("%w: ingress address: %v", ErrInvalidConfig, err)
		}
	}
	if err := c.validateResidency(); err != nil {
		return err
	}
	if err := c.Score.Validate(); err != nil {
		return err
	}
	return c.Projection.Validate()
}

// Deps are the controller's collaborators. Nil fields get real defaults.
type Deps struct {
	Clock      clockwork.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Gatherer serves /metrics; nil with a nil Registerer means a private
	// registry is created and served.
	Gatherer prometheus.Gatherer
	// GRPCServerOptions are added to the gRPC server's options (tracing
	// stats handlers, interceptors).
	GRPCServerOptions []grpc.ServerOption
	// GRPCListener and HTTPListener, when set, are used instead of
	// listening on Config.Listen / Config.HTTPListen (tests).
	GRPCListener net.Listener
	HTTPListener net.Listener
	// Dialer is used by the RTT prober. Nil → ProbeDial.
	Dialer func(network, addr string, timeout time.Duration) (net.Conn, error)
	// Etcd, when set, is used to find the global leader; the region then
	// streams summaries to it and applies its plans.
	Etcd *clientv3.Client
	// GlobalDialOptions dial the global leader (transport credentials are
	// required when Etcd is set).
	GlobalDialOptions []grpc.DialOption
	// Gossip, when set, carries this region's summary to its peers and
	// theirs to it, with inter-region RTT, for the fallback plan; the
	// caller owns it. Nil: the node Config.Gossip describes, if any.
	Gossip gossiper
	// GossipTransport, when set, wraps the transport of the gossip node
	// NewGossip builds (the lab routes gossip through emulated WAN paths).
	GossipTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// Demand reports the ingress demand per model (requests/s). Nil: what
	// the region's data planes report over DataPlane.Report, or, when none
	// does, the cells' served load.
	Demand func() map[string]float64
	// PlanFence keeps the highest plan epoch and sequence applied across
	// restarts. Nil: FileFence in Config.WarmStart.StateDir
	// (plan-fence.json) when one is set; without a state directory the
	// fence holds through fallback but a restarted controller starts
	// without one.
	PlanFence FenceStore
}

func (d *Deps) withDefaults() {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Registerer == nil && d.Gatherer == nil {
		reg := prometheus.NewRegistry()
		d.Registerer, d.Gatherer = reg, reg
	}
	if d.Gatherer == nil {
		if g, ok := d.Registerer.(prometheus.Gatherer); ok {
			d.Gatherer = g
		} else {
			d.Gatherer = prometheus.NewRegistry()
		}
	}
	if d.Dialer == nil {
		d.Dialer = ProbeDial
	}
}

// ProbeDial is the RTT prober's default Dialer: a TCP connect without
// keepalive. A probe closes its connection as soon as it is up, so the
// keepalive options net.Dialer sets by default (SO_KEEPALIVE and three
// TCP_KEEP* setsockopt calls on every connection) buy nothing; in a CPU
// profile of the controllers at 2,000 cells they were a fifth of the
// probes' dials.
func ProbeDial(network, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, KeepAlive: -1}
	return d.Dial(network, addr)
}

// MassExpiryConfig bounds the hold of a mass TTL expiry: while at least
// Fraction of a region's live cells (and at least 3) are past their TTL
// in one sweep, the controller holds them, for at most Hold, rather than
// fail them all (massexpiry.go says why and what others do).
type MassExpiryConfig struct {
	// Fraction of the live cells past their TTL at once that makes a mass
	// expiry, in (0, 1]. Default 0.5 (Envoy's panic threshold).
	Fraction float64
	// Hold: the longest a mass expiry is held; then the cells still silent
	// fail. Default 10 s, about a dead peer's gRPC keepalive detection
	// (10 s idle + 5 s timeout); negative: never hold.
	Hold time.Duration
}

func (m MassExpiryConfig) withDefaults() MassExpiryConfig {
	if m.Fraction == 0 {
		m.Fraction = 0.5
	}
	if m.Hold == 0 {
		m.Hold = 10 * time.Second
	}
	return m
}
