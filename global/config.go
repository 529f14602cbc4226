package global

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/optimize"
	"github.com/isobar-mesh/isobar/summary"
)

// Config holds a global controller's settings; zero fields take the
// documented defaults.
type Config struct {
	// Name of this member. Default: hostname-pid.
	Name string
	// Keepalive is the gRPC server's keepalive, ping enforcement and
	// per-connection stream cap (internal/grpcbounds defaults).
	Keepalive grpcbounds.Server
	// Listen is the gRPC address serving GlobalControl. Default
	// 127.0.0.1:19000.
	Listen string
	// Advertise is the address regions dial, published in the election.
	// Default: the bound Listen address.
	Advertise string
	// HTTPListen serves /metrics and /debug/plan. Default 127.0.0.1:9091;
	// "-" disables it.
	HTTPListen string
	// ElectionPrefix is the etcd election prefix. Default
	// election.DefaultPrefix ("/isobar/global/election/").
	ElectionPrefix string
	// PlanKey is the etcd key the leader writes plans to (fenced).
	// Default "/isobar/global/plan".
	PlanKey string
	// LeaseTTL of the election session. Default 2 s.
	LeaseTTL time.Duration
	// CycleInterval between plans. Default 1 s.
	CycleInterval time.Duration
	// RegionTTL: a region whose latest summary is older is down. Default 3 s.
	RegionTTL time.Duration
	// PlanTTL: plans are valid this long after they are issued; regions
	// fall back to local-first routing after. Default 30 s.
	PlanTTL time.Duration
	// Regions, when set, is the allowlist of region names; summaries from
	// others are refused.
	Regions []string
	// Planning parameters.
	Plan PlanConfig
	// TLS for the gRPC server — all three or none. Regions must present
	// the URI identity spiffe://isobar/region/<region> and may send only
	// that region's summaries; this member's own certificate should be
	// spiffe://isobar/global/<Name>, the only identity regions take plans
	// from.
	TLSCert, TLSKey, TLSCA string
	// Limits bound what regions can make this member hold (see Limits).
	Limits Limits
	// Etcd is the cluster New connects to when Deps.Etcd is nil: the
	// member then owns the client and closes it on Stop. One of the two
	// is required. Its Logger defaults to Deps.Logger.
	Etcd election.ClientConfig
}

// PlanConfig parameterises the optimiser (see package optimize).
type PlanConfig struct {
	// Headroom: plan each region to at most capacity·Headroom. Default 0.9.
	Headroom float64
	// Beta, K: the latency model's knee (defaults 0.1 and 4).
	Beta, K float64
	// ShedPenaltyMs: cost of refusing a request. Default 10,000.
	ShedPenaltyMs float64
	// DampStep: fraction of the way from the previous plan to the new
	// optimum taken per cycle. Default 0.5.
	DampStep float64
	// LocalFill: a region's demand stays home while it is under
	// LocalFill·capacity·Headroom; only the excess is spilled, nearest
	// first (optimize.SolveLocalFirst). Default 0.9.
	LocalFill float64
	// LocalFillBand is the hysteresis on LocalFill: a region that kept all
	// its demand home in the previous plan starts spilling only above
	// (LocalFill+LocalFillBand)·capacity·Headroom (at most 0.97), one that
	// spilled stops below LocalFill·capacity·Headroom. Default 0.05;
	// negative turns it off.
	LocalFillBand float64
}

// DefaultConfig returns a Config with every default filled in, the one
// source of the defaults (flags take theirs from it). Two defaults derive
// from other fields and stay zero here, filled by New: Name (hostname-pid)
// and Limits.MaxSyncStreams (2 × MaxRegions), so a caller that changes
// MaxRegions still gets the derived stream cap.
func DefaultConfig() Config {
	c := Config{Name: "-"}
	c.withDefaults()
	c.Name, c.Limits.MaxSyncStreams = "", 0
	return c
}

func (c *Config) withDefaults() {
	if c.Name == "" {
		h, _ := os.Hostname()
		c.Name = h + "-" + strconv.Itoa(os.Getpid())
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:19000"
	}
	if c.HTTPListen == "" {
		c.HTTPListen = "127.0.0.1:9091"
	}
	if c.ElectionPrefix == "" {
		c.ElectionPrefix = election.DefaultPrefix
	}
	if c.PlanKey == "" {
		c.PlanKey = "/isobar/global/plan"
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 2 * time.Second
	}
	if c.CycleInterval == 0 {
		c.CycleInterval = time.Second
	}
	if c.RegionTTL == 0 {
		c.RegionTTL = 3 * time.Second
	}
	if c.PlanTTL == 0 {
		c.PlanTTL = 30 * time.Second
	}
	m := optimize.Model{Headroom: c.Plan.Headroom, Beta: c.Plan.Beta, K: c.Plan.K, ShedPenaltyMs: c.Plan.ShedPenaltyMs}.WithDefaults()
	c.Plan.Headroom, c.Plan.Beta, c.Plan.K, c.Plan.ShedPenaltyMs = m.Headroom, m.Beta, m.K, m.ShedPenaltyMs
	if c.Plan.DampStep == 0 {
		c.Plan.DampStep = 0.5
	}
	if c.Plan.LocalFill == 0 {
		c.Plan.LocalFill = optimize.DefaultLocalFill
	}
	if c.Plan.LocalFillBand == 0 {
		c.Plan.LocalFillBand = 0.05
	}
	c.Limits.withDefaults()
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("global: invalid config")

func (c Config) validate() error {
	if strings.ContainsAny(c.Name, "@ \t\n") || c.Name == "" {
		return fmt.Errorf("%w: name %q must be non-empty without '@' or spaces", ErrInvalidConfig, c.Name)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("%w: listen %q: %v", ErrInvalidConfig, c.Listen, err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"lease TTL", c.LeaseTTL}, {"cycle interval", c.CycleInterval}, {"region TTL", c.RegionTTL}, {"plan TTL", c.PlanTTL}} {
		if d.v <= 0 {
			return fmt.Errorf("%w: %s must be > 0", ErrInvalidConfig, d.name)
		}
	}
	if c.LeaseTTL < time.Second {
		return fmt.Errorf("%w: lease TTL %v: etcd leases are whole seconds, want >= 1s", ErrInvalidConfig, c.LeaseTTL)
	}
	if c.Plan.Headroom <= 0 || c.Plan.Headroom > 1 {
		return fmt.Errorf("%w: headroom %v: want (0,1]", ErrInvalidConfig, c.Plan.Headroom)
	}
	if !(c.Plan.LocalFill > 0 && c.Plan.LocalFill <= 1) {
		return fmt.Errorf("%w: local fill %v: want (0,1]", ErrInvalidConfig, c.Plan.LocalFill)
	}
	if !(c.Plan.LocalFillBand <= 0.5) {
		return fmt.Errorf("%w: local fill band %v: want at most 0.5 (negative: off)", ErrInvalidConfig, c.Plan.LocalFillBand)
	}
	if c.Plan.DampStep <= 0 || c.Plan.DampStep > 1 {
		return fmt.Errorf("%w: damp step %v: want (0,1]", ErrInvalidConfig, c.Plan.DampStep)
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	for _, r := range c.Regions {
		if !summary.ValidName(r) {
			return fmt.Errorf("%w: region %q in the allowlist is not a valid name", ErrInvalidConfig, r)
		}
	}
	if (c.TLSCert != "" || c.TLSKey != "" || c.TLSCA != "") && (c.TLSCert == "" || c.TLSKey == "" || c.TLSCA == "") {
		return fmt.Errorf("%w: --tls-cert, --tls-key and --tls-ca must be given together", ErrInvalidConfig)
	}
	return nil
}

// Deps are the controller's collaborators.
type Deps struct {
	// Etcd is the client for the election and plan writes; the caller
	// owns it. Nil: New connects to Config.Etcd.
	Etcd       *clientv3.Client
	Clock      clockwork.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// GRPCServerOptions are added to the gRPC server's options (tracing).
	GRPCServerOptions []grpc.ServerOption
	// GRPCListener and HTTPListener override Listen/HTTPListen (tests).
	GRPCListener, HTTPListener net.Listener
}
