package gossip

import (
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	summarybounds "github.com/isobar-mesh/isobar/summary"
)

// Roles a node can have.
const (
	RoleRegional = "regional"
	RoleGlobal   = "global"
)

// Timing profiles.
const (
	// ProfileWAN uses memberlist.DefaultWANConfig timings: probes every 5s
	// with a 3s timeout, push-pull every 60s. The default.
	ProfileWAN = "wan"
	// ProfileLAN uses memberlist.DefaultLANConfig timings: probes every 1s.
	ProfileLAN = "lan"
	// ProfileLocal is for tests and the single-machine lab on loopback
	// (with emulated WAN paths of up to ~200 ms round trip): probes every
	// 500ms with a 400ms ack timeout, push-pull every 1s, failures
	// confirmed within a few seconds.
	ProfileLocal = "local"
)

// Defaults.
const (
	DefaultMaxSummaryBytes = 32 << 10
	DefaultBindAddr        = "127.0.0.1"
	DefaultCluster         = "isobar"
	DefaultRTTSmoothing    = 0.2
	DefaultForgetAfter     = 24 * time.Hour
	DefaultMaxClockSkew    = summarybounds.MaxFutureSkew
)

// Config holds the values of a gossip Node. The zero value is not valid: Role
// (and Region for a regional node) must be set.
type Config struct {
	// NodeName is this member's unique name. Default: role + "/" + region for
	// a regional controller ("regional/eu-west"), and "global/" (+ region +
	// "/") + 8 random hex digits for a global controller, since a global
	// may be restarted elsewhere while its old self is still remembered.
	NodeName string
	// Role is RoleRegional or RoleGlobal. Required.
	Role string
	// Region is this controller's region. Required for RoleRegional (at most
	// 128 bytes of printable UTF-8); optional for RoleGlobal (where the
	// global runs). A regional member may only publish this region's summary.
	Region string
	// IngressAddress is advertised in the node meta: where other regions
	// send traffic forwarded to this region. Optional; at most 256 bytes.
	IngressAddress string
	// BindAddr and BindPort are where memberlist listens (UDP and TCP on the
	// same port). Defaults 127.0.0.1 and 0 (an ephemeral port; see
	// Node.Addr).
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what other members dial, when
	// different from the bind address (NAT, 0.0.0.0). Default: the bound
	// address.
	AdvertiseAddr string
	AdvertisePort int
	// Join lists seed members as host:port. Joining runs in the background:
	// while no other member is alive, the seeds are retried with jittered
	// exponential backoff (JoinBackoffMin..JoinBackoffMax). Empty: this node
	// waits for others to join it.
	Join []string
	// Profile selects memberlist's timings: ProfileWAN (default), ProfileLAN
	// or ProfileLocal.
	Profile string
	// Cluster is memberlist's label: members with a different label ignore
	// each other, so two fleets on one network cannot merge by accident.
	// Default "isobar". At most 255 bytes.
	Cluster string
	// MaxSummaryBytes caps the encoded RegionSummary this node accepts (and
	// publishes). Default 32 KiB: a summary at the proto's stated limits (64
	// models, 8 context classes each, an RTT per region of 32) encodes to
	// about 19 KB (TestMaximalSummarySize), so 16 KiB would refuse a
	// legitimate large region. Since issue 26 a summary lists only its
	// nearest RTTs (at most summary.MaxNearestRTT) and a coordinate, so its
	// size no longer grows with the regions.
	MaxSummaryBytes int
	// SecretKey enables memberlist's AES-GCM encryption of all gossip when
	// set (16, 24 or 32 bytes, the same on every member). Production should
	// set it: without it anyone who can reach the port can join the cluster.
	// Summaries are signed per member either way (see doc.go). Required
	// with Deps.Identity (a fleet with mTLS). ParseKey reads a key file.
	SecretKey []byte
	// MaxClockSkew is how far ahead of this node's clock a received
	// summary's time may be: one further in the future is refused
	// (isobar_gossip_summaries_refused_total{reason="future"}), so a
	// forged time cannot mask the region's real summaries. Default
	// summary.MaxFutureSkew, the allowance the global leader's intake
	// applies too (summary.ValidateAt): one rule for a summary's time.
	MaxClockSkew time.Duration
	// RTTSmoothing is the EWMA weight of a new probe RTT sample, in (0,1].
	// Default 0.2.
	RTTSmoothing float64
	// JoinBackoffMin and JoinBackoffMax bound the join retry backoff.
	// Defaults per profile: local 50ms..1s, lan 500ms..15s, wan 1s..30s.
	JoinBackoffMin, JoinBackoffMax time.Duration
	// LeaveTimeout bounds how long Stop waits for the leave message to go
	// out. Defaults per profile: local 1s, lan 2s, wan 5s.
	LeaveTimeout time.Duration
	// ForgetAfter is how long a member that left or died is still listed by
	// Members. Default 24h. Summaries of its region are kept regardless.
	ForgetAfter time.Duration
}

// Deps holds the collaborators of a Node. Every field may be nil.
type Deps struct {
	// Logger receives structured logs; memberlist's own log lines are
	// bridged to it at debug level. Nil: logs are discarded.
	Logger *slog.Logger
	// Registerer receives the node's metrics. Nil: metrics are not
	// registered.
	Registerer prometheus.Registerer
	// Clock stamps received summaries and member state changes and drives
	// the join backoff. Nil: the real clock. memberlist's own timers
	// (probes, gossip, suspicion) always run on real time.
	Clock clockwork.Clock
	// Validate checks every summary received from a peer and every local
	// summary, after the basic checks (region non-empty and at most 128
	// bytes, sequence > 0, time set). Nil: only the basic checks.
	Validate func(*isobarpb.RegionSummary) error
	// WrapTransport, when set, wraps memberlist's UDP/TCP transport (the
	// lab routes gossip through emulated WAN paths this way). Nil: the
	// transport is used as is.
	WrapTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// Identity binds members to their mTLS identities (identity.go): a
	// regional node proves its region with its certificate, and summaries
	// are accepted only from members whose proof names the region they
	// claim. Nil: region claims are taken from the member metadata (a
	// fleet without TLS). Needs Config.SecretKey.
	Identity *Identity
}

// FieldError reports a Config field with a bad value.
type FieldError struct {
	// Field is the Config field name, e.g. "Region".
	Field string
	// Problem says what is wrong and what to do.
	Problem string
}

func (e *FieldError) Error() string {
	return "gossip: Config." + e.Field + ": " + e.Problem
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// withDefaults returns c with zero fields set to their defaults. random
// supplies the suffix of a global's default node name.
func (c Config) withDefaults(random io.Reader) Config {
	if c.Profile == "" {
		c.Profile = ProfileWAN
	}
	if c.BindAddr == "" {
		c.BindAddr = DefaultBindAddr
	}
	if c.Cluster == "" {
		c.Cluster = DefaultCluster
	}
	if c.MaxSummaryBytes == 0 {
		c.MaxSummaryBytes = DefaultMaxSummaryBytes
	}
	if c.RTTSmoothing == 0 {
		c.RTTSmoothing = DefaultRTTSmoothing
	}
	if c.ForgetAfter == 0 {
		c.ForgetAfter = DefaultForgetAfter
	}
	if c.MaxClockSkew == 0 {
		c.MaxClockSkew = DefaultMaxClockSkew
	}
	var bmin, bmax, leave time.Duration
	switch c.Profile {
	case ProfileLocal:
		bmin, bmax, leave = 50*time.Millisecond, time.Second, time.Second
	case ProfileLAN:
		bmin, bmax, leave = 500*time.Millisecond, 15*time.Second, 2*time.Second
	default:
		bmin, bmax, leave = time.Second, 30*time.Second, 5*time.Second
	}
	if c.JoinBackoffMin == 0 {
		c.JoinBackoffMin = bmin
	}
	if c.JoinBackoffMax == 0 {
		c.JoinBackoffMax = max(bmax, c.JoinBackoffMin)
	}
	if c.LeaveTimeout == 0 {
		c.LeaveTimeout = leave
	}
	if c.NodeName == "" {
		switch c.Role {
		case RoleRegional:
			c.NodeName = RoleRegional + "/" + c.Region
		case RoleGlobal:
			var b [4]byte
			_, _ = io.ReadFull(random, b[:])
			c.NodeName = RoleGlobal + "/"
			if c.Region != "" {
				c.NodeName += c.Region + "/"
			}
			c.NodeName += hex.EncodeToString(b[:])
		}
	}
	return c
}

func (c Config) validate() error {
	switch c.Role {
	case RoleRegional:
		if c.Region == "" {
			return fieldErr("Region", "required for role %q: set the controller's region", RoleRegional)
		}
	case RoleGlobal:
	case "":
		return fieldErr("Role", "required: set %q or %q", RoleRegional, RoleGlobal)
	default:
		return fieldErr("Role", "%q unknown: use %q or %q", c.Role, RoleRegional, RoleGlobal)
	}
	if len(c.Region) > maxRegionBytes {
		return fieldErr("Region", "%d bytes, at most %d allowed", len(c.Region), maxRegionBytes)
	}
	if err := checkText([]byte(c.Region)); err != nil {
		return fieldErr("Region", "%v: use printable UTF-8", err)
	}
	if c.NodeName == "" || len(c.NodeName) > maxNameBytes {
		return fieldErr("NodeName", "must be 1..%d bytes", maxNameBytes)
	}
	if err := checkText([]byte(c.NodeName)); err != nil {
		return fieldErr("NodeName", "%v: use printable UTF-8", err)
	}
	if len(c.IngressAddress) > maxIngressBytes {
		return fieldErr("IngressAddress", "%d bytes, at most %d allowed", len(c.IngressAddress), maxIngressBytes)
	}
	if err := checkText([]byte(c.IngressAddress)); err != nil {
		return fieldErr("IngressAddress", "%v: use host:port", err)
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		return fieldErr("BindPort", "%d outside 0..65535", c.BindPort)
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fieldErr("AdvertisePort", "%d outside 0..65535", c.AdvertisePort)
	}
	switch c.Profile {
	case ProfileWAN, ProfileLAN, ProfileLocal:
	default:
		return fieldErr("Profile", "%q unknown: use %q, %q or %q", c.Profile, ProfileWAN, ProfileLAN, ProfileLocal)
	}
	if len(c.Cluster) > memberlist.LabelMaxSize {
		return fieldErr("Cluster", "%d bytes, at most %d allowed", len(c.Cluster), memberlist.LabelMaxSize)
	}
	if c.MaxSummaryBytes < 0 || c.MaxSummaryBytes > 1<<20 {
		return fieldErr("MaxSummaryBytes", "%d outside 1..%d", c.MaxSummaryBytes, 1<<20)
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return fieldErr("SecretKey", "%d bytes: use 16, 24 or 32 (AES-128/192/256)", len(c.SecretKey))
	}
	if !(c.RTTSmoothing > 0 && c.RTTSmoothing <= 1) {
		return fieldErr("RTTSmoothing", "%v outside (0,1]", c.RTTSmoothing)
	}
	if c.JoinBackoffMin < 0 || c.JoinBackoffMax < c.JoinBackoffMin {
		return fieldErr("JoinBackoffMax", "must be at least JoinBackoffMin (%v)", c.JoinBackoffMin)
	}
	if c.LeaveTimeout < 0 {
		return fieldErr("LeaveTimeout", "negative")
	}
	if c.ForgetAfter < 0 {
		return fieldErr("ForgetAfter", "negative")
	}
	if c.MaxClockSkew < 0 {
		return fieldErr("MaxClockSkew", "negative")
	}
	for i, s := range c.Join {
		if s == "" {
			return fieldErr(fmt.Sprintf("Join[%d]", i), "empty: use host:port")
		}
	}
	return nil
}

// memberlistConfig returns memberlist's configuration for the profile, with
// the node's identity filled in and no delegates set.
func (c Config) memberlistConfig() *memberlist.Config {
	var mc *memberlist.Config
	switch c.Profile {
	case ProfileLocal:
		mc = memberlist.DefaultLocalConfig()
		// The ack timeout must exceed the slowest emulated WAN round trip
		// (the lab's 70 ms one way, plus a 20 ms jitter drill): a probe
		// that times out gives no RTT sample and raises memberlist's
		// awareness score, which slows every later probe.
		// Generous on a loaded machine too (the race detector, a whole
		// lab on two cores), where acks come late.
		mc.ProbeInterval = 500 * time.Millisecond
		mc.ProbeTimeout = 400 * time.Millisecond
		mc.SuspicionMult = 2
		mc.SuspicionMaxTimeoutMult = 3
		mc.GossipInterval = 50 * time.Millisecond
		mc.PushPullInterval = time.Second
		mc.GossipToTheDeadTime = 5 * time.Second
	case ProfileLAN:
		mc = memberlist.DefaultLANConfig()
	default:
		mc = memberlist.DefaultWANConfig()
	}
	mc.Name = c.NodeName
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if c.AdvertisePort == 0 {
		mc.AdvertisePort = c.BindPort
	}
	mc.Label = c.Cluster
	mc.SecretKey = c.SecretKey
	// A controller restarted with a new address (ephemeral port, new host)
	// may take its old name back once the old self has been dead this long.
	mc.DeadNodeReclaimTime = 6 * mc.ProbeInterval
	return mc
}
