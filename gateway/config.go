package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/regional/xds"
)

// LBMode chooses how the gateway picks an endpoint within a cluster.
type LBMode string

// Load-balancing modes.
const (
	// LBXDS honours what xDS says (default): priorities, locality weights
	// scaled by locality health, then the cluster's policy within the
	// locality (weighted least-request for LEAST_REQUEST: power of two
	// choices when endpoint weights are equal, weight/(active+1)^bias
	// otherwise; weighted random for the others).
	LBXDS LBMode = "xds"
	// LBRoundRobin is the round-robin baseline: a rotation over the
	// cluster's endpoints ignoring weights, localities and priorities.
	LBRoundRobin LBMode = "rr"
	// LBLeastRequest is the least-request baseline: the endpoint with the
	// fewest requests in flight, ignoring weights, localities and
	// priorities (ties broken at random).
	LBLeastRequest LBMode = "lr"
)

// Config holds a gateway's values. Zero fields take the documented defaults.
type Config struct {
	// Controller is the regional controller's gRPC address (host:port),
	// serving ADS and DataPlane.Report. Required.
	Controller string
	// Region is the region this gateway serves. Required. Requests sent to
	// an endpoint of another region carry HopHeader with this value.
	Region string
	// NodeID is this data plane's xDS node id and report identity. Default
	// "isobar-gateway-" + Region.
	NodeID string
	// LB is the load-balancing mode: xds (default), rr or lr.
	LB LBMode
	// MaxInflightPerEndpoint caps the requests in flight to one endpoint
	// (address); a request whose every candidate endpoint is at the cap
	// gets 429. Default 64.
	MaxInflightPerEndpoint int
	// ModelHeader is the request header naming the model; when absent the
	// JSON body's "model" is matched as if it were this header. Default
	// "x-isobar-model", as in the regional controller's xds.Config.
	ModelHeader string
	// HopHeader marks requests forwarded from another region. Default
	// "x-isobar-hop", as in the regional controller's xds.Config.
	HopHeader string
	// RouteName is the RouteConfiguration the gateway serves from. Default
	// xds.RouteName.
	RouteName string
	// MaxBodyBytes caps a request body (HTTP 413 beyond). Default 16 MiB.
	MaxBodyBytes int64
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
}

func (c Config) withDefaults() Config {
	if c.NodeID == "" && c.Region != "" {
		c.NodeID = "isobar-gateway-" + c.Region
	}
	if c.LB == "" {
		c.LB = LBXDS
	}
	if c.MaxInflightPerEndpoint == 0 {
		c.MaxInflightPerEndpoint = 64
	}
	if c.ModelHeader == "" {
		c.ModelHeader = "x-isobar-model"
	}
	if c.HopHeader == "" {
		c.HopHeader = "x-isobar-hop"
	}
	if c.RouteName == "" {
		c.RouteName = xds.RouteName
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 16 << 20
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
	for _, f := range []struct{ name, v string }{{"Region", c.Region}, {"NodeID", c.NodeID}} {
		if len(f.v) > 256 || strings.ContainsFunc(f.v, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return bad("%s %q must be 1 to 256 visible ASCII characters", f.name, f.v)
		}
	}
	switch c.LB {
	case LBXDS, LBRoundRobin, LBLeastRequest:
	default:
		return bad("LB %q is unknown; use xds, rr or lr", c.LB)
	}
	if c.MaxInflightPerEndpoint < 1 {
		return bad("MaxInflightPerEndpoint %d is below 1", c.MaxInflightPerEndpoint)
	}
	for _, h := range []struct{ name, v string }{{"ModelHeader", c.ModelHeader}, {"HopHeader", c.HopHeader}} {
		if h.v != strings.ToLower(h.v) || !validHeaderName(h.v) {
			return bad("%s %q is not a lower-case HTTP header name", h.name, h.v)
		}
	}
	if c.ModelHeader == c.HopHeader {
		return bad("ModelHeader and HopHeader are both %q; they must differ", c.ModelHeader)
	}
	if c.MaxBodyBytes < 1 {
		return bad("MaxBodyBytes %d is below 1", c.MaxBodyBytes)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"DrainTimeout", c.DrainTimeout}, {"ReportInterval", c.ReportInterval}, {"MinBackoff", c.MinBackoff}, {"MaxBackoff", c.MaxBackoff}} {
		if d.v < time.Millisecond {
			return bad("%s %v is below 1ms; leave it zero for the default", d.name, d.v)
		}
	}
	if c.MaxBackoff < c.MinBackoff {
		return bad("MaxBackoff %v is below MinBackoff %v", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
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
	return d
}
