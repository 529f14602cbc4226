package xds

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// Bounds and defaults that are not configuration.
const (
	minRingSize = 1024
	maxRingSize = 8 * 1024 * 1024 // Envoy's and grpc-go's upper bound
	// maxChoiceCount bounds least_request's choice_count: beyond a few
	// choices FULL_SCAN is the clearer setting.
	maxChoiceCount = 100
)

// Config holds the values of an xDS server. The zero value of a field means
// its documented default; call sites normally set only Region.
type Config struct {
	// Region of this regional controller. Required. A Locality whose Region
	// is empty is placed here.
	Region string
	// Zone of this regional controller. Default "". A Locality whose Region
	// and Zone are both empty gets this zone.
	Zone string

	// LBPolicy is the cluster load-balancing policy: xdscontract.LeastRequest
	// (default: the typed least_request policy with ChoiceCount or
	// FullScan), xdscontract.RingHash (with RingSize) or
	// xdscontract.RoundRobin (both in the legacy lb_policy enum).
	LBPolicy xdscontract.LBPolicy
	// ChoiceCount is least_request's choice_count, the number of random
	// hosts compared per pick. Default 2 (P2C); at least 2, at most 100.
	// Ignored with FullScan.
	ChoiceCount uint32
	// FullScan makes least_request scan every host (selection_method
	// FULL_SCAN) instead of ChoiceCount random choices. Default false.
	FullScan bool
	// RingSize is the minimum ring size under ring_hash. Default 4096; at
	// least 1024 so endpoint weights survive the ring's quantisation.
	RingSize uint64

	// ListenAddress is the address of the Envoy HTTP listener. Default
	// "0.0.0.0". Must be an IP address.
	ListenAddress string
	// ListenPort is the port of the Envoy HTTP listener. Default 10000.
	ListenPort uint32

	// RouteTimeout bounds a whole request, streaming included. Default 600 s:
	// LLM requests are long. For proxyless gRPC clients it is written as the
	// route's max_stream_duration.
	RouteTimeout time.Duration
	// ConnectTimeout bounds an upstream TCP connect. Default 1 s.
	ConnectTimeout time.Duration

	// NumRetries is the number of retries on connect-failure, refused-stream,
	// reset and HTTP 503 (gRPC clients: UNAVAILABLE). Default 2.
	NumRetries uint32
	// RetryBudgetPercent caps concurrent retries as a percentage of active
	// requests, per cluster. Default 20.
	RetryBudgetPercent float64
	// RetryBudgetMinConcurrency is the number of concurrent retries always
	// allowed whatever the budget. Default 3.
	RetryBudgetMinConcurrency uint32
	// MaxRequests is the circuit breaker on concurrent requests, pending
	// requests and connections per cluster. Default 65536 (Envoy's own
	// default of 1024 is too low for long LLM requests across many cells).
	MaxRequests uint32

	// OutlierConsecutive5xx ejects an endpoint after this many consecutive
	// 5xx. Default 5.
	OutlierConsecutive5xx uint32
	// OutlierEnforcing5xx is the cluster's enforcing_consecutive_5xx: the
	// percent chance that a consecutive-5xx outlier is actually ejected
	// (envoy/config/cluster/v3/outlier_detection.proto; Envoy's default is
	// 100). Default 0: the regional controller owns 5xx ejection. Its
	// error-rate penalty (regional/projection) is bounded by what the rest
	// of the model's cells can carry, where the data plane's ejection is
	// bounded only by a count (max_ejection_percent), so at high load it
	// turns a partial brownout — a site failing a share of its requests
	// fast — into an overload of every other cell (bench paper's
	// retry_storm: goodput 0.08–0.16 with it, see docs/bench.md). Failures
	// of local origin (refused, reset: a dead engine) are still ejected at
	// once (OutlierConsecutiveLocalOrigin). Set 100 for Envoy's behaviour.
	OutlierEnforcing5xx uint32
	// OutlierConsecutiveLocalOrigin ejects an endpoint after this many
	// consecutive failures of local origin — connection refused or reset,
	// timeouts — counted apart from upstream 5xx
	// (split_external_local_origin_errors). Default 1: a refused
	// connection means nothing is listening (a killed engine), so no more
	// requests should be sent there until the ejection ends or the control
	// plane removes the endpoint.
	OutlierConsecutiveLocalOrigin uint32
	// OutlierInterval is the ejection analysis sweep interval. Default 5 s.
	OutlierInterval time.Duration
	// OutlierBaseEjectionTime is the base ejection duration. Default 10 s.
	OutlierBaseEjectionTime time.Duration
	// OutlierMaxEjectionPercent caps the share of a cluster's endpoints that
	// may be ejected at once. Default 50.
	OutlierMaxEjectionPercent uint32

	// ModelHeader is the request header that selects a model. Default
	// xdscontract.DefaultModelHeader ("x-isobar-model"). With a single
	// model there is also a catch-all route. ModelHeader and HopHeader must
	// pass xdscontract.CheckHeaders, as a data plane's must.
	ModelHeader string
	// HopHeader marks traffic forwarded from another region's data plane.
	// Default xdscontract.DefaultHopHeader ("x-isobar-hop"). Envoy routes
	// requests carrying it (any value) to the model's local-only clusters:
	// never forwarded again, never shed.
	HopHeader string

	// ContextClasses are the context-length classes in tokens, strictly
	// increasing. Default 4096, 8192, 32768, 131072; an empty non-nil slice
	// disables classes (one cluster per model for client traffic). Per model
	// and class the Envoy set holds a cluster of the endpoints whose
	// max_model_len is at least the class (unknown counts as large enough),
	// and routes send a request to the smallest class its prompt fits; see
	// xdscontract.PromptTokensHeader. At most 16 classes, each at most 2^30.
	ContextClasses []uint32

	// LEDS serves delta (incremental) xDS clients the LEDS layout: their
	// ClusterLoadAssignments name one LbEndpoint glob collection per
	// locality (xdscontract.LEDSCollection) instead of listing the
	// endpoints, and every endpoint is an LbEndpoint resource of its own,
	// so a change to one endpoint sends that endpoint, not its cluster.
	// State-of-the-world clients get the same resources with or without
	// it. Default false: delta clients get the EDS layout too. Envoy
	// consumes LEDS only over delta ADS (leds.go says what is served).
	LEDS bool
}

// DefaultContextClasses returns the default Config.ContextClasses.
func DefaultContextClasses() []uint32 { return []uint32{4096, 8192, 32768, 131072} }

// Bounds on context classes.
const (
	maxContextClasses = 16
	maxContextClass   = 1 << 30
)

// Deps holds the collaborators of an xDS server. Every field is optional.
type Deps struct {
	// Logger receives structured logs. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics. Nil leaves them unregistered.
	Registerer prometheus.Registerer
	// Clock times snapshot builds. Nil means the real clock.
	Clock clockwork.Clock
	// Authorize, when set, is called with the context of every stream and
	// fetch before it is served (the gRPC peer, with its TLS state, is in
	// it). An error refuses the stream with PermissionDenied carrying the
	// error's text; the refusal is counted in
	// isobar_regional_xds_streams_refused_total and logged. Nil serves
	// everyone. It is called concurrently from the streams' goroutines.
	Authorize func(ctx context.Context) error
}

func (d Deps) withDefaults() Deps {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	return d
}

func (c Config) withDefaults() Config {
	if c.LBPolicy == "" {
		c.LBPolicy = xdscontract.LeastRequest
	}
	if c.ChoiceCount == 0 {
		c.ChoiceCount = 2
	}
	if c.RingSize == 0 {
		c.RingSize = 4096
	}
	if c.ListenAddress == "" {
		c.ListenAddress = "0.0.0.0"
	}
	if c.ListenPort == 0 {
		c.ListenPort = 10000
	}
	if c.RouteTimeout == 0 {
		c.RouteTimeout = 600 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = time.Second
	}
	if c.NumRetries == 0 {
		c.NumRetries = 2
	}
	if c.RetryBudgetPercent == 0 {
		c.RetryBudgetPercent = 20
	}
	if c.RetryBudgetMinConcurrency == 0 {
		c.RetryBudgetMinConcurrency = 3
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = 65536
	}
	if c.OutlierConsecutiveLocalOrigin == 0 {
		c.OutlierConsecutiveLocalOrigin = 1
	}
	if c.OutlierConsecutive5xx == 0 {
		c.OutlierConsecutive5xx = 5
	}
	if c.OutlierInterval == 0 {
		c.OutlierInterval = 5 * time.Second
	}
	if c.OutlierBaseEjectionTime == 0 {
		c.OutlierBaseEjectionTime = 10 * time.Second
	}
	if c.OutlierMaxEjectionPercent == 0 {
		c.OutlierMaxEjectionPercent = 50
	}
	if c.ModelHeader == "" {
		c.ModelHeader = xdscontract.DefaultModelHeader
	}
	if c.HopHeader == "" {
		c.HopHeader = xdscontract.DefaultHopHeader
	}
	if c.ContextClasses == nil {
		c.ContextClasses = DefaultContextClasses()
	} else {
		c.ContextClasses = slices.Clone(c.ContextClasses)
	}
	return c
}

// validate checks a Config that has had its defaults applied.
func (c Config) validate() error {
	if c.Region == "" {
		return fmt.Errorf("%w: Region is empty; set it to this controller's region", ErrInvalidConfig)
	}
	if err := xdscontract.CheckName("Region", c.Region); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Zone != "" {
		if err := xdscontract.CheckName("Zone", c.Zone); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	switch c.LBPolicy {
	case xdscontract.LeastRequest, xdscontract.RingHash, xdscontract.RoundRobin:
	default:
		return fmt.Errorf("%w: LBPolicy %q is unknown; use %q, %q or %q",
			ErrInvalidConfig, c.LBPolicy, xdscontract.LeastRequest, xdscontract.RingHash, xdscontract.RoundRobin)
	}
	if c.ChoiceCount < 2 || c.ChoiceCount > maxChoiceCount {
		return fmt.Errorf("%w: ChoiceCount %d is out of range; use 2 to %d (2 is power-of-two choices)",
			ErrInvalidConfig, c.ChoiceCount, maxChoiceCount)
	}
	if c.RingSize < minRingSize || c.RingSize > maxRingSize {
		return fmt.Errorf("%w: RingSize %d is out of range; use %d to %d (4096 is a good value)",
			ErrInvalidConfig, c.RingSize, minRingSize, maxRingSize)
	}
	if _, err := netip.ParseAddr(c.ListenAddress); err != nil {
		return fmt.Errorf("%w: ListenAddress %q is not an IP address (use e.g. 0.0.0.0 or ::)", ErrInvalidConfig, c.ListenAddress)
	}
	if c.ListenPort > 65535 {
		return fmt.Errorf("%w: ListenPort %d is above 65535", ErrInvalidConfig, c.ListenPort)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"RouteTimeout", c.RouteTimeout},
		{"ConnectTimeout", c.ConnectTimeout},
		{"OutlierInterval", c.OutlierInterval},
		{"OutlierBaseEjectionTime", c.OutlierBaseEjectionTime},
	} {
		if d.v < time.Millisecond {
			return fmt.Errorf("%w: %s %v is below 1ms; leave it zero for the default or set a positive duration",
				ErrInvalidConfig, d.field, d.v)
		}
	}
	if c.NumRetries > 10 {
		return fmt.Errorf("%w: NumRetries %d is above 10; retries multiply load on a struggling fleet", ErrInvalidConfig, c.NumRetries)
	}
	if c.RetryBudgetPercent < 0 || c.RetryBudgetPercent > 100 {
		return fmt.Errorf("%w: RetryBudgetPercent %v is out of range; use (0, 100]", ErrInvalidConfig, c.RetryBudgetPercent)
	}
	if c.OutlierMaxEjectionPercent > 100 {
		return fmt.Errorf("%w: OutlierMaxEjectionPercent %d is above 100", ErrInvalidConfig, c.OutlierMaxEjectionPercent)
	}
	if c.OutlierEnforcing5xx > 100 {
		return fmt.Errorf("%w: OutlierEnforcing5xx %d is above 100", ErrInvalidConfig, c.OutlierEnforcing5xx)
	}
	if err := xdscontract.CheckHeaders(c.ModelHeader, c.HopHeader); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if len(c.ContextClasses) > maxContextClasses {
		return fmt.Errorf("%w: ContextClasses has %d classes; use at most %d", ErrInvalidConfig, len(c.ContextClasses), maxContextClasses)
	}
	for i, n := range c.ContextClasses {
		if n == 0 || n > maxContextClass {
			return fmt.Errorf("%w: ContextClasses[%d] = %d is out of range; use 1 to %d tokens", ErrInvalidConfig, i, n, maxContextClass)
		}
		if i > 0 && n <= c.ContextClasses[i-1] {
			return fmt.Errorf("%w: ContextClasses must be strictly increasing; %d follows %d", ErrInvalidConfig, n, c.ContextClasses[i-1])
		}
	}
	return nil
}
