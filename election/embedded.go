package election

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// EmbeddedConfig describes a single-member etcd run inside this process,
// for the lab, tests and chaos drills.
type EmbeddedConfig struct {
	// Dir is the data directory. Required. Starting again on the same Dir
	// (and addresses) brings the same data back, leases included.
	Dir string
	// Name of the member. Default "isobar-etcd".
	Name string
	// ClientAddr and PeerAddr are host:port listen addresses. An empty
	// address or port 0 picks a free port on 127.0.0.1 (host kept if
	// given); Config reports the ports chosen so a restart can reuse them.
	ClientAddr, PeerAddr string
	// TLS, when set, serves clients over TLS, requiring client
	// certificates signed by TLS.CAFile. Client() then presents TLS.CertFile,
	// so that certificate must allow client authentication too.
	TLS TLSFiles
	// UnsafeNoFsync skips fsync (faster; loses data on power failure).
	// Suitable for tests and the lab only.
	UnsafeNoFsync bool
	// StartTimeout bounds StartEmbedded's wait for the member to be ready.
	// Default 30 s.
	StartTimeout time.Duration
	// Logger receives etcd's error-level logs (the rest is dropped). Nil:
	// all of etcd's logs are dropped.
	Logger *slog.Logger
}

// Embedded is a running embedded etcd member.
type Embedded struct {
	cfg      EmbeddedConfig
	etcd     *embed.Etcd
	stopping *atomic.Bool // quiets etcd's shutdown "errors"
	stopOnce sync.Once
}

// Raft timing of the embedded member. A single member elects itself at
// once, so these only set etcd's minimum lease TTL, 1.5 election timeouts
// rounded up to whole seconds: 1 s here (2 s with etcd's defaults), so that
// 1-second election TTLs are honoured in tests and the lab.
const (
	embeddedTickMs     = 50
	embeddedElectionMs = 500
)

// StartEmbedded starts a member and waits (bounded by cfg.StartTimeout and
// ctx) until it serves clients. Ports picked for empty or zero-port
// addresses are retried on a collision, up to three times.
func StartEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: EmbeddedConfig.Dir is empty: give a data directory", ErrInvalidConfig)
	}
	if cfg.Name == "" {
		cfg.Name = "isobar-etcd"
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if err := cfg.TLS.validate("EmbeddedConfig.TLS"); err != nil {
		return nil, err
	}
	if cfg.TLS.Enabled() && cfg.TLS.CAFile == "" {
		return nil, fmt.Errorf("%w: EmbeddedConfig.TLS needs CAFile to verify client certificates", ErrInvalidConfig)
	}
	var lastErr error
	for range 3 {
		run := cfg
		var picked bool
		var err error
		if run.ClientAddr, picked, err = freeAddr(cfg.ClientAddr); err != nil {
			return nil, err
		}
		var pickedPeer bool
		if run.PeerAddr, pickedPeer, err = freeAddr(cfg.PeerAddr); err != nil {
			return nil, err
		}
		e, err := startEmbedded(ctx, run)
		if err == nil {
			return e, nil
		}
		lastErr = err
		if !(picked || pickedPeer) || !addrInUse(err) {
			break
		}
	}
	return nil, lastErr
}

func startEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	scheme := "http"
	if cfg.TLS.Enabled() {
		scheme = "https"
	}
	curl := url.URL{Scheme: scheme, Host: cfg.ClientAddr}
	purl := url.URL{Scheme: "http", Host: cfg.PeerAddr}

	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{curl}
	ec.AdvertiseClientUrls = []url.URL{curl}
	ec.ListenPeerUrls = []url.URL{purl}
	ec.AdvertisePeerUrls = []url.URL{purl}
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	ec.TickMs = embeddedTickMs
	ec.ElectionMs = embeddedElectionMs
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	ec.EnableGRPCGateway = false
	ec.LogLevel = "error"
	stopping := new(atomic.Bool)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(cfg.Logger, stopping))
	if cfg.TLS.Enabled() {
		ec.ClientTLSInfo = transport.TLSInfo{
			CertFile:       cfg.TLS.CertFile,
			KeyFile:        cfg.TLS.KeyFile,
			TrustedCAFile:  cfg.TLS.CAFile,
			ClientCertAuth: true,
		}
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("election: start embedded etcd (client %s, peer %s, dir %s): %w", cfg.ClientAddr, cfg.PeerAddr, cfg.Dir, err)
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	select {
	case <-e.Server.ReadyNotify():
		return &Embedded{cfg: cfg, etcd: e, stopping: stopping}, nil
	case err := <-e.Err():
		stopping.Store(true)
		e.Close()
		return nil, fmt.Errorf("election: embedded etcd failed while starting: %w", err)
	case <-wctx.Done():
		stopping.Store(true)
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("election: embedded etcd not ready after %v: %w", cfg.StartTimeout, wctx.Err())
	}
}

func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// freeAddr resolves an empty address or port 0 to a free loopback port.
// The port is free when checked; StartEmbedded retries if it was taken in
// between.
func freeAddr(addr string) (string, bool, error) {
	host, port := "127.0.0.1", "0"
	if addr != "" {
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			return "", false, fmt.Errorf("%w: address %q: %w (want host:port)", ErrInvalidConfig, addr, err)
		}
		if h != "" {
			host = h
		}
		port = p
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", false, fmt.Errorf("%w: address %q: bad port", ErrInvalidConfig, addr)
	}
	if port != "0" {
		return net.JoinHostPort(host, port), false, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", false, fmt.Errorf("election: pick a free port on %s: %w", host, err)
	}
	a := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", false, fmt.Errorf("election: pick a free port on %s: %w", host, err)
	}
	return a, true, nil
}

// Config is the configuration the member runs with, with the addresses it
// actually listens on: pass it to StartEmbedded to restart the member on
// the same data and addresses.
func (e *Embedded) Config() EmbeddedConfig { return e.cfg }

// Endpoints are the client URLs.
func (e *Embedded) Endpoints() []string {
	scheme := "http://"
	if e.cfg.TLS.Enabled() {
		scheme = "https://"
	}
	return []string{scheme + e.cfg.ClientAddr}
}

// Client returns a new client of this member (TLS as configured); the
// caller closes it.
func (e *Embedded) Client() (*clientv3.Client, error) {
	return NewClient(ClientConfig{Endpoints: e.Endpoints(), TLS: e.cfg.TLS, Logger: e.cfg.Logger})
}

// Running reports whether Stop has not been called.
func (e *Embedded) Running() bool { return !e.stopping.Load() }

// Err reports a fatal error of the running member.
func (e *Embedded) Err() <-chan error { return e.etcd.Err() }

// Stop shuts the member down and returns when it has stopped (in-flight
// client streams are cut after etcd's request timeout). Idempotent.
func (e *Embedded) Stop() {
	e.stopOnce.Do(func() {
		e.stopping.Store(true)
		e.etcd.Close()
	})
}
