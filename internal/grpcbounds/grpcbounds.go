// Package grpcbounds owns the one set of keepalive and stream bounds that
// every long-lived isobar gRPC stream uses: the client keepalive of the
// cellagent → regional heartbeat stream, the regional → global Sync stream
// and the gateway/picker → regional ADS stream, and the server keepalive,
// enforcement policy and stream caps of the regional, global and picker
// servers.
//
// Keepalive is what notices a peer that vanished without closing (a
// black-holed route, a proxy that stops forwarding, a host that lost
// power): without it such a stream stays stuck until the kernel gives up
// on its retransmissions (~15 min on Linux). A client pings after Time
// without reading anything from the connection and closes it when Timeout
// more passes without a read, so a black-holed peer is detected within
// Time + Timeout (grpc-go internal/transport/http2_client.go keepalive()).
//
// The values follow gRFC A8 (client-side keepalive,
// https://github.com/grpc/proposal/blob/master/A8-client-side-keepalive.md)
// and the grpc-go keepalive package docs:
//   - grpc-go clamps a client Time below 10 s up to 10 s
//     (grpc-go dialoptions.go WithKeepaliveParams,
//     internal.KeepaliveMinPingTime); 10 s is therefore the fastest
//     detection a client can be given, and the default here.
//   - a server answers pings more frequent than its EnforcementPolicy
//     MinTime with GOAWAY ENHANCE_YOUR_CALM ("too_many_pings") and the
//     client then doubles its Time (gRFC A8 "Server Enforcement"); the
//     server's MinTime must therefore be at most the client's Time. The
//     servers here allow every 5 s, half the client's 10 s, so a ping that
//     arrives early (it is timed from the client's last read) is never a
//     strike. ServerCompatible checks the rule.
//   - grpc-go clamps a server Time below 1 s up to 1 s
//     (server.go KeepaliveParams, internal.KeepaliveMinServerPingTime).
//
// The package holds values and builds options; it has no state and no
// goroutines, and every function is safe for concurrent use.
package grpcbounds

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Defaults, one source for every component.
const (
	// ClientTime is the client keepalive interval: grpc-go's floor (10 s).
	ClientTime = 10 * time.Second
	// ClientTimeout is how long a client waits for any read after a ping.
	ClientTimeout = 5 * time.Second
	// ServerTime and ServerTimeout: the server pings a client it has not
	// heard from for ServerTime, and closes the connection ServerTimeout
	// after an unanswered ping.
	ServerTime    = 10 * time.Second
	ServerTimeout = 5 * time.Second
	// ServerMinPingInterval is the server's EnforcementPolicy.MinTime: at
	// most ClientTime (see the package doc).
	ServerMinPingInterval = 5 * time.Second
	// MaxConcurrentStreams caps the streams one client connection may have
	// open on a server at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS,
	// RFC 9113 §6.5.2 recommends no fewer than 100). An isobar client opens
	// at most a few per connection (an agent one heartbeat stream, a
	// gateway three ADS subscriptions and a report stream).
	MaxConcurrentStreams = 100
)

// Static flow-control windows of the connections whose streams carry
// only small messages (see SmallMessages).
const (
	// SmallStreamWindow is HTTP/2's default stream window, 65,535 bytes
	// (RFC 9113 §6.9.2), rounded up to grpc-go's floor of 64 KiB.
	SmallStreamWindow = 64 << 10
	// SmallConnWindow is the connection window of a server, whose one
	// connection per client may carry a few such streams.
	SmallConnWindow = 1 << 20
)

// minClientTime mirrors grpc-go's internal.KeepaliveMinPingTime.
const minClientTime = 10 * time.Second

// ErrInvalid is wrapped by every configuration error of this package.
var ErrInvalid = errors.New("grpcbounds: invalid keepalive configuration")

// Client is a client's keepalive on a long-lived stream. Zero fields take
// the defaults (ClientTime, ClientTimeout).
type Client struct {
	// Time: ping after this long without reading from the connection.
	// grpc-go raises anything below 10 s to 10 s. Default 10 s.
	Time time.Duration
	// Timeout: close the connection when nothing is read this long after
	// a ping. Default 5 s.
	Timeout time.Duration
}

// WithDefaults fills zero fields.
func (c Client) WithDefaults() Client {
	if c.Time == 0 {
		c.Time = ClientTime
	}
	if c.Timeout == 0 {
		c.Timeout = ClientTimeout
	}
	return c
}

// Validate refuses negative values and a Time below grpc-go's 10 s floor
// (it would be raised silently, and the detection bound stated to the
// operator would be wrong).
func (c Client) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.Time < minClientTime:
		return fmt.Errorf("%w: client keepalive time %v: grpc-go pings at most every %v; give at least %v", ErrInvalid, c.Time, minClientTime, minClientTime)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: client keepalive timeout %v: want > 0", ErrInvalid, c.Timeout)
	}
	return nil
}

// Detection is the bound on noticing a black-holed peer: Time + Timeout.
func (c Client) Detection() time.Duration {
	c = c.WithDefaults()
	return max(c.Time, minClientTime) + c.Timeout
}

// DialOption is the keepalive dial option for a long-lived stream's
// connection. Pings are sent only while a stream is open
// (PermitWithoutStream false, gRFC A8's default): the streams these
// connections carry are always open.
func (c Client) DialOption() grpc.DialOption {
	c = c.WithDefaults()
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: c.Time, Timeout: c.Timeout})
}

// Server is a server's keepalive, ping enforcement and per-connection
// stream cap. Zero fields take the defaults above.
type Server struct {
	// Time and Timeout: the server's own pings of a silent client.
	// Defaults 10 s and 5 s.
	Time, Timeout time.Duration
	// MinPingInterval is the enforcement policy's MinTime: a client pinging
	// more often is sent GOAWAY ENHANCE_YOUR_CALM. It must be at most every
	// client's keepalive Time. Default 5 s.
	MinPingInterval time.Duration
	// MaxConcurrentStreams per client connection. Default 100.
	MaxConcurrentStreams uint32
}

// WithDefaults fills zero fields.
func (s Server) WithDefaults() Server {
	if s.Time == 0 {
		s.Time = ServerTime
	}
	if s.Timeout == 0 {
		s.Timeout = ServerTimeout
	}
	if s.MinPingInterval == 0 {
		s.MinPingInterval = ServerMinPingInterval
	}
	if s.MaxConcurrentStreams == 0 {
		s.MaxConcurrentStreams = MaxConcurrentStreams
	}
	return s
}

// Validate refuses negative durations.
func (s Server) Validate() error {
	s = s.WithDefaults()
	if s.Time < 0 || s.Timeout < 0 || s.MinPingInterval < 0 {
		return fmt.Errorf("%w: server keepalive time %v, timeout %v, min ping interval %v: want > 0", ErrInvalid, s.Time, s.Timeout, s.MinPingInterval)
	}
	return nil
}

// ServerCompatible checks that a client with keepalive c is never sent
// GOAWAY ENHANCE_YOUR_CALM by a server with policy s (gRFC A8).
func ServerCompatible(s Server, c Client) error {
	s, c = s.WithDefaults(), c.WithDefaults()
	if s.MinPingInterval > max(c.Time, minClientTime) {
		return fmt.Errorf("%w: the server refuses pings more often than every %v but the client pings every %v: lower the server's min ping interval to at most the client's keepalive time",
			ErrInvalid, s.MinPingInterval, c.Time)
	}
	return nil
}

// ServerOptions are the keepalive, enforcement and stream-cap options of a
// server that carries long-lived streams. maxRecvBytes (> 0) is the
// server-wide receive cap (grpc.MaxRecvMsgSize), checked on each message's
// length prefix before it is read.
func (s Server) ServerOptions(maxRecvBytes int) []grpc.ServerOption {
	s = s.WithDefaults()
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: s.Time, Timeout: s.Timeout}),
		// PermitWithoutStream: an idle connection between two streams (an
		// agent reconnecting) may still ping.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.MinPingInterval, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(s.MaxConcurrentStreams),
	}
	if maxRecvBytes > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(maxRecvBytes))
	}
	return opts
}

// SmallMessages are the server options of a server whose every stream
// receives small messages (a heartbeat, a report, an xDS request: at most
// a few kilobytes, each well within one window), and SmallMessagesDial the
// dial options of a client that receives only such messages (an agent,
// which reads one ack per heartbeat).
//
// They set static flow-control windows, which turns off grpc-go's
// bandwidth-delay-product estimation on those connections. Without them,
// every data frame that arrives while no BDP ping is outstanding sends one
// (grpc-go internal/transport/bdp_estimator.go add; http2_server.go and
// http2_client.go create the estimator only without StaticWindowSize).
// On a stream of one small message every half second, each heartbeat and
// each ack then cost a ping and its ack besides the message: at 2,000
// cells this was ~45 % of the senders' CPU and a fifth to a third of the
// controller's. BDP estimation grows windows for bulk transfers; these
// streams never fill the default one. Keep dynamic windows where large
// messages are read (an xDS client reading assignments).
func SmallMessages() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(SmallStreamWindow), grpc.StaticConnWindowSize(SmallConnWindow)}
}

// SmallMessagesDial: see SmallMessages.
func SmallMessagesDial() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(SmallStreamWindow), grpc.WithStaticConnWindowSize(SmallStreamWindow)}
}
