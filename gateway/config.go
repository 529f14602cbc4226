package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/gateway/flowcontrol"
	"github.com/isobar-mesh/isobar/gateway/lb"
	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/internal/grpcbounds"
	"github.com/isobar-mesh/isobar/reqclass"
	"github.com/isobar-mesh/isobar/residency"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// LBMode chooses how the gateway picks an endpoint within a cluster.
type LBMode string

// Load-balancing modes.
const (
	// LBXDS honours what xDS says as stock Envoy does (default): a
	// priority by Envoy's priority load, a locality by LocalityWrr's EDF
	// schedule when the cluster is locality-weighted, then the cluster's
	// policy within the host source through gateway/lb: ROUND_ROBIN
	// (rotation, or EDF over the weights when they differ), LEAST_REQUEST
	// (N_CHOICES or FULL_SCAN on in-flight counts when the weights are
	// equal, EDF over weight/(active+1)^bias when they differ) or RANDOM
	// (uniform). An unknown pushed policy falls back to ROUND_ROBIN.
	LBXDS LBMode = "xds"
	// LBRoundRobin is the round-robin baseline: Envoy's ROUND_ROBIN over
	// all the cluster's endpoints with equal weights, ignoring localities
	// and priorities.
	LBRoundRobin LBMode = "rr"
	// LBLeastRequest is the least-request baseline: Envoy's default
	// LEAST_REQUEST (power of two choices on requests in flight) over all
	// the cluster's endpoints with equal weights, ignoring localities and
	// priorities.
	LBLeastRequest LBMode = "lr"
	// LBIsobar is isobar's own pick: a priority as in LBXDS, then, among its
	// healthy endpoints (in localities of positive weight when the cluster is
	// locality-weighted), the least expected time to first token (package
	// placement) from the prompt tokens the gateway has sent to each endpoint
	// and not yet seen answered, the request's own, the endpoint's prefill
	// rate, RTT and jitter from the EDS metadata
	// (xdscontract.MetadataPrefillRate, MetadataRTT, MetadataJitter) and its
	// requests in flight. Weight gates eligibility only. A remote region's
	// ingress competes as one endpoint: until the controller pushes its RTT
	// (and prefill rate) in the metadata its RTT counts as 0, and only its
	// locality's weight (0: never) gates it.
	LBIsobar LBMode = "isobar"
)

// Config holds a gateway's values. Zero fields take the documented defaults.
type Config struct {
	// Controller is the regional controller's gRPC address (host:port),
	// serving ADS and DataPlane.Report. Required.
	Controller string
	// Region is the region this gateway serves. Required. Requests sent to
	// an endpoint of another region carry HopHeader with this value.
	Region string
	// Keepalive of the connection to the controller (ADS, reports): a
	// controller that vanished without closing is noticed within Time +
	// Timeout (internal/grpcbounds defaults: 10 s + 5 s).
	Keepalive grpcbounds.Client
	// NodeID is this data plane's xDS node id and report identity. Default
	// "isobar-gateway-" + Region.
	NodeID string
	// LB is the load-balancing mode: xds (default), rr, lr or isobar.
	LB LBMode
	// NoPrefixAffinity turns off --lb isobar's prefix affinity: the
	// gateway then keeps no index of the prompt blocks it sent each
	// endpoint, and the pick ignores prefix caches.
	NoPrefixAffinity bool
	// Placement holds the constants of the isobar pick (LBIsobar). Zero:
	// placement.DefaultConfig().
	Placement placement.Config
	// MaxInflightPerEndpoint caps the requests in flight to one endpoint
	// (address): the cap of an endpoint that declares no batch
	// (max_num_seqs), or of any with NoQueue or HealthOnly, and the upper
	// bound of flowcontrol.EndpointCap for one that does. A request whose
	// every candidate endpoint is at its cap waits in the flow-control
	// queue (429 with NoQueue). Default 64.
	MaxInflightPerEndpoint int
	// ModelHeader is the request header naming the model; when absent the
	// JSON body's "model" is matched as if it were this header. Default
	// xdscontract.DefaultModelHeader ("x-isobar-model"), as in the regional
	// controller. ModelHeader and HopHeader must pass
	// xdscontract.CheckHeaders, as the controller's must.
	ModelHeader string
	// HopHeader marks requests forwarded from another region. Default
	// xdscontract.DefaultHopHeader ("x-isobar-hop"), as in the regional
	// controller. It is trusted only with a valid proof made with HopKey
	// (hop.go); from anyone else it is removed before routing.
	HopHeader string
	// HopKey is the secret every region's gateways and pickers share to
	// prove a forwarded request (xdscontract.HopAuthHeader), at least
	// MinHopKeyBytes bytes. Empty: this gateway trusts no hop header (every
	// request is a client's: routed, shed and counted as such) and its own
	// forwarded requests carry no proof.
	HopKey []byte
	// HopMaxSkew is how far a hop proof's issue time may be from this
	// gateway's clock, either way: the clock skew allowed between regions,
	// and the window in which a proof seen on the wire can be replayed.
	// Default 2 min.
	HopMaxSkew time.Duration
	// RouteName is the RouteConfiguration the gateway serves from. Default
	// xdscontract.RouteName.
	RouteName string
	// MaxBodyBytes caps a request body (HTTP 413 beyond). Default 16 MiB.
	MaxBodyBytes int64
	// MaxInflightRequests caps the completion requests the gateway holds
	// at once, from arrival to the last response byte; one more is answered
	// 503 at once, before its body is read, and counted in
	// isobar_gateway_overload_refused_total. Default 4096.
	MaxInflightRequests int
	// ReadTimeout bounds the reading of a request, headers and body: a body
	// not received whole in time is answered 408 and its connection closed
	// (http.Server.ReadTimeout; lifted once the body is in, so that a
	// streamed answer is bounded by its route's timeout instead). Default
	// 60 s.
	ReadTimeout time.Duration
	// ReadHeaderTimeout bounds the reading of a request's headers. Default
	// 10 s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its next
	// request. Default 120 s.
	IdleTimeout time.Duration
	// MaxXDSMessageBytes is the largest xDS response the gateway receives
	// (gRPC's MaxCallRecvMsgSize on its ADS streams). Default
	// xdscontract.MaxXDSMessageBytes(xdscontract.DefaultMaxCells): sized
	// for the largest region the controller admits by default; size it with
	// MaxXDSMessageBytes(the controller's --max-cells) when that is raised.
	MaxXDSMessageBytes int
	// XDSDelta receives the ClusterLoadAssignments over delta
	// (incremental) ADS, with LEDS when the controller serves it (its
	// --xds-leds), so one endpoint's change costs that endpoint's bytes
	// (xdsclient.Subscription.Delta). Default false: state-of-the-world,
	// as for clusters and routes.
	XDSDelta bool
	// DrainTimeout bounds how long Stop lets in-flight requests finish
	// before closing their connections. Default 30 s.
	DrainTimeout time.Duration
	// ReportInterval is the period of DataPlane reports. Default 1 s.
	ReportInterval time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential reconnect
	// backoff of the xDS and report streams. Defaults 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// Listen and MetricsListen are the addresses Run listens on. Listen
	// default "127.0.0.1:8080"; MetricsListen default "" (metrics on the
	// main listener only).
	Listen, MetricsListen string
	// HealthOnly: the HTTP handler serves /health and /metrics only, no
	// OpenAI API (the ext_proc picker's listener). Default false.
	HealthOnly bool
	// Residency pins tenants' and models' requests to regions (package
	// residency): the gateway sets xdscontract.ResidencyHeader from it and
	// never picks an endpoint outside a request's regions, whatever its
	// routes say. nil pins nothing.
	Residency *residency.Config
	// TrustedSources are the peers (CIDR prefixes) whose
	// xdscontract.CriticalityHeader "critical" (or objective mapped to
	// critical) is believed; from any other peer it is lowered to standard
	// (class.go). A request proven forwarded by another isobar gateway (the
	// hop proof) keeps its class wherever it comes from. Default none: a
	// gateway cannot tell an authenticating proxy in front of it from a
	// client, so no client may promote itself until the operator names the
	// proxies that set the header (--trusted-sources).
	TrustedSources []netip.Prefix
	// ObjectivePriority maps Inference Extension objective names
	// (xdscontract.ObjectiveHeader) to their priority, read through
	// reqclass.FromPriority when a request has no criticality header.
	// Default none: an objective is then standard (and counted).
	ObjectivePriority map[string]int
	// MaxTenants bounds the distinct tenants the gateway tracks for
	// fairness and labels; later ones share reqclass.OtherTenant. Default
	// reqclass.DefaultMaxTenants.
	MaxTenants int
	// Queue bounds the flow-control queue requests wait in while every
	// eligible endpoint is at its in-flight cap, and sets its policy
	// (newest first, yield, objective ages; package gateway/flowcontrol).
	// Zero: flowcontrol.DefaultConfig(). A non-zero Queue is taken as it
	// is: start from DefaultConfig and adjust it, since a field left zero
	// turns its policy off.
	Queue flowcontrol.Config
	// NoQueue answers such requests 429 at once instead (the behaviour
	// before flow control).
	NoQueue bool
}

func (c Config) withDefaults() Config {
	if c.NodeID == "" && c.Region != "" {
		c.NodeID = "isobar-gateway-" + c.Region
	}
	if c.LB == "" {
		c.LB = LBXDS
	}
	if c.Placement == (placement.Config{}) {
		c.Placement = placement.DefaultConfig()
	}
	if c.MaxInflightPerEndpoint == 0 {
		c.MaxInflightPerEndpoint = 64
	}
	if c.ModelHeader == "" {
		c.ModelHeader = xdscontract.DefaultModelHeader
	}
	if c.HopHeader == "" {
		c.HopHeader = xdscontract.DefaultHopHeader
	}
	if c.RouteName == "" {
		c.RouteName = xdscontract.RouteName
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 16 << 20
	}
	if c.HopMaxSkew == 0 {
		c.HopMaxSkew = 2 * time.Minute
	}
	if c.MaxInflightRequests == 0 {
		c.MaxInflightRequests = 4096
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 60 * time.Second
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = min(10*time.Second, c.ReadTimeout)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.MaxXDSMessageBytes == 0 {
		c.MaxXDSMessageBytes = xdscontract.MaxXDSMessageBytes(xdscontract.DefaultMaxCells)
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = time.Second
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(5*time.Second, c.MinBackoff)
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.MaxTenants == 0 {
		c.MaxTenants = reqclass.DefaultMaxTenants
	}
	if c.Queue == (flowcontrol.Config{}) {
		c.Queue = flowcontrol.DefaultConfig()
	}
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.Controller == "" {
		return bad("Controller is empty; set it to the regional controller's host:port (--controller)")
	}
	if _, _, err := net.SplitHostPort(c.Controller); err != nil {
		return bad("Controller %q is not host:port: %v", c.Controller, err)
	}
	if c.Region == "" {
		return bad("Region is empty; set it to this gateway's region (--region)")
	}
	if err := c.Keepalive.Validate(); err != nil {
		return bad("Keepalive: %v", err)
	}
	for _, f := range []struct{ name, v string }{{"Region", c.Region}, {"NodeID", c.NodeID}} {
		if err := xdscontract.CheckName(f.name, f.v); err != nil {
			return bad("%v", err)
		}
	}
	switch c.LB {
	case LBXDS, LBRoundRobin, LBLeastRequest, LBIsobar:
	default:
		return bad("LB %q is unknown; use xds, rr, lr or isobar", c.LB)
	}
	if err := c.Placement.Validate(); err != nil {
		return bad("Placement: %v", err)
	}
	if c.MaxInflightPerEndpoint < 1 {
		return bad("MaxInflightPerEndpoint %d is below 1", c.MaxInflightPerEndpoint)
	}
	if err := xdscontract.CheckHeaders(c.ModelHeader, c.HopHeader); err != nil {
		return bad("%v", err)
	}
	if c.MaxBodyBytes < 1 {
		return bad("MaxBodyBytes %d is below 1", c.MaxBodyBytes)
	}
	if n := len(c.HopKey); n > 0 && n < MinHopKeyBytes {
		return bad("HopKey has %d bytes; use at least %d random bytes (e.g. head -c 32 /dev/urandom > hop.key), the same on every region's gateways", n, MinHopKeyBytes)
	}
	if c.MaxInflightRequests < 1 {
		return bad("MaxInflightRequests %d is below 1", c.MaxInflightRequests)
	}
	if c.MaxXDSMessageBytes < 4<<20 {
		return bad("MaxXDSMessageBytes %d is below gRPC's default 4 MiB; leave it zero for the default", c.MaxXDSMessageBytes)
	}
	if c.ReadHeaderTimeout > c.ReadTimeout {
		return bad("ReadHeaderTimeout %v is above ReadTimeout %v, which covers the headers too", c.ReadHeaderTimeout, c.ReadTimeout)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"DrainTimeout", c.DrainTimeout}, {"ReportInterval", c.ReportInterval}, {"MinBackoff", c.MinBackoff}, {"MaxBackoff", c.MaxBackoff},
		{"HopMaxSkew", c.HopMaxSkew}, {"ReadTimeout", c.ReadTimeout}, {"ReadHeaderTimeout", c.ReadHeaderTimeout}, {"IdleTimeout", c.IdleTimeout}} {
		if d.v < time.Millisecond {
			return bad("%s %v is below 1ms; leave it zero for the default", d.name, d.v)
		}
	}
	if c.MaxBackoff < c.MinBackoff {
		return bad("MaxBackoff %v is below MinBackoff %v", c.MaxBackoff, c.MinBackoff)
	}
	return c.validateClasses(bad)
}

// validateClasses checks the request-class and queue settings.
func (c Config) validateClasses(bad func(string, ...any) error) error {
	if c.MaxTenants < 1 || c.MaxTenants > 1<<16 {
		return bad("MaxTenants %d outside [1, 65536]", c.MaxTenants)
	}
	if len(c.ObjectivePriority) > 1024 {
		return bad("ObjectivePriority maps %d objectives, at most 1024", len(c.ObjectivePriority))
	}
	if err := c.Queue.Validate(); err != nil {
		return bad("Queue: %v", err)
	}
	return nil
}

// Deps holds a gateway's collaborators.
type Deps struct {
	// Clock drives timers (route timeouts, retry back-off, ejection times,
	// reports, reconnects). Nil means the real clock.
	Clock clockwork.Clock
	// Logger receives structured logs. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics. Nil leaves them unregistered.
	Registerer prometheus.Registerer
	// Gatherer, when set, is served on /metrics of the main listener.
	Gatherer prometheus.Gatherer
	// DialOptions configure the gRPC connection to the controller. They
	// must carry transport credentials (insecure ones explicitly when TLS
	// is off).
	DialOptions []grpc.DialOption
	// Transport, when set, carries the upstream requests instead of the
	// gateway's own http.Transport. The clusters' connect timeouts are then
	// the Transport's business.
	Transport http.RoundTripper
	// Rand is the random source of endpoint picks (Envoy's random() in
	// priority choice, power-of-N choices, full-scan ties and RANDOM; the
	// isobar pick's ties) and of the load balancers' seeds. It must be safe
	// for concurrent use. Nil: math/rand/v2's global generator.
	Rand lb.Rand
	// DialContext, when set, opens the gateway's own transport's upstream
	// connections (e.g. through an emulated WAN link); the cluster's
	// connect timeout still bounds it through ctx. Nil: a net.Dialer.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (d Deps) withDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Rand == nil {
		d.Rand = globalRand{}
	}
	return d
}
