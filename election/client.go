package election

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/isobar-mesh/isobar/certs"
)

// TLSFiles names PEM files for TLS to etcd.
type TLSFiles struct {
	// CertFile and KeyFile: this side's certificate and key. Give both or
	// neither (neither: no client certificate is presented).
	CertFile, KeyFile string
	// CAFile: the CA that signed the other side's certificate.
	CAFile string
}

// Enabled reports whether any file is set.
func (t TLSFiles) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" }

func (t TLSFiles) validate(field string) error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("%w: %s: CertFile and KeyFile must be given together", ErrInvalidConfig, field)
	}
	return nil
}

// clientTLS loads the files into a client tls.Config.
func (t TLSFiles) clientTLS() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CertFile != "" {
		// Reloaded like isobar's own certificates (certs): each new
		// connection presents the pair on disk now, so rotating the files
		// (or renewing one about to expire) needs no restart.
		get, err := certs.ClientCertificate(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("election: load etcd client certificate %s / key %s: %w", t.CertFile, t.KeyFile, err)
		}
		tc.GetClientCertificate = get
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("election: read etcd CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("election: etcd CA file %s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// ClientConfig describes a connection to an external etcd cluster.
type ClientConfig struct {
	// Endpoints of the cluster's members: "host:port", "http://host:port"
	// or "https://host:port". Required. With TLS, bare host:port endpoints
	// are dialled over TLS; "http://" endpoints are refused.
	Endpoints []string
	// TLS: when any file is set, connections use TLS, trusting CAFile (the
	// system roots if empty) and presenting CertFile/KeyFile if given.
	TLS TLSFiles
	// Username and Password authenticate to a cluster with etcd auth
	// enabled (etcdctl auth enable). Both or neither. The password is sent
	// on every connection: use it only with TLS. Default: no auth (a
	// client certificate's common name is the user when the cluster runs
	// with --client-cert-auth).
	Username, Password string
	// DialTimeout bounds NewClient's wait for a first connection.
	// Default 5 s.
	DialTimeout time.Duration
	// KeepAliveTime and KeepAliveTimeout: gRPC keepalive pings that detect
	// a dead connection (a silently lost etcd). Defaults 10 s and 3 s
	// (etcd refuses pings more often than every 5 s).
	KeepAliveTime, KeepAliveTimeout time.Duration
	// Logger receives the client's error-level logs. Nil: dropped.
	Logger *slog.Logger
}

func (c ClientConfig) withDefaults() ClientConfig {
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.KeepAliveTime == 0 {
		c.KeepAliveTime = 10 * time.Second
	}
	if c.KeepAliveTimeout == 0 {
		c.KeepAliveTimeout = 3 * time.Second
	}
	return c
}

func (c ClientConfig) validate() error {
	if len(c.Endpoints) == 0 {
		return fmt.Errorf("%w: ClientConfig.Endpoints is empty: give at least one etcd endpoint (host:port)", ErrInvalidConfig)
	}
	for _, ep := range c.Endpoints {
		if err := checkEndpoint(ep, c.TLS.Enabled()); err != nil {
			return err
		}
	}
	if err := c.TLS.validate("ClientConfig.TLS"); err != nil {
		return err
	}
	if (c.Username == "") != (c.Password == "") {
		return fmt.Errorf("%w: ClientConfig: Username and Password must be given together", ErrInvalidConfig)
	}
	if c.Username != "" && !c.TLS.Enabled() {
		return fmt.Errorf("%w: ClientConfig: an etcd password needs TLS (set the CA file): it would cross the network in plain text", ErrInvalidConfig)
	}
	if c.DialTimeout < 0 || c.KeepAliveTime < 0 || c.KeepAliveTimeout < 0 {
		return fmt.Errorf("%w: ClientConfig: negative DialTimeout or keepalive", ErrInvalidConfig)
	}
	return nil
}

// checkEndpoint accepts host:port, http://host:port and https://host:port.
func checkEndpoint(ep string, tlsOn bool) error {
	hostport := ep
	if i := strings.Index(ep, "://"); i >= 0 {
		u, err := url.Parse(ep)
		if err != nil {
			return fmt.Errorf("%w: etcd endpoint %q: %w", ErrInvalidConfig, ep, err)
		}
		switch u.Scheme {
		case "http":
			if tlsOn {
				return fmt.Errorf("%w: etcd endpoint %q is plain http but TLS files are set: use https:// or host:port", ErrInvalidConfig, ep)
			}
		case "https":
			if !tlsOn {
				return fmt.Errorf("%w: etcd endpoint %q is https but no TLS files are set: set the CA file (and client certificate)", ErrInvalidConfig, ep)
			}
		default:
			return fmt.Errorf("%w: etcd endpoint %q: scheme %q, want http, https or none", ErrInvalidConfig, ep, u.Scheme)
		}
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
			return fmt.Errorf("%w: etcd endpoint %q: want scheme://host:port with nothing after", ErrInvalidConfig, ep)
		}
		hostport = u.Host
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("%w: etcd endpoint %q: %w (want host:port)", ErrInvalidConfig, ep, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%w: etcd endpoint %q: port %q is not in 1-65535", ErrInvalidConfig, ep, port)
	}
	if host == "" {
		return fmt.Errorf("%w: etcd endpoint %q: empty host", ErrInvalidConfig, ep)
	}
	return nil
}

// NewClient connects to etcd and returns the client once a first
// connection is up (bounded by DialTimeout). Configuration errors wrap
// ErrInvalidConfig; unreadable TLS files and unreachable endpoints return
// errors naming the files or endpoints. The caller closes the client.
func NewClient(cfg ClientConfig) (*clientv3.Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cc := clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    cfg.KeepAliveTime,
		DialKeepAliveTimeout: cfg.KeepAliveTimeout,
		Logger:               etcdLogger(cfg.Logger, nil),
		Username:             cfg.Username,
		Password:             cfg.Password,
	}
	if cfg.TLS.Enabled() {
		tc, err := cfg.TLS.clientTLS()
		if err != nil {
			return nil, err
		}
		cc.TLS = tc
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("election: connect to etcd %s within %v: %w", strings.Join(cfg.Endpoints, ","), cfg.DialTimeout, err)
	}
	// clientv3.New with a DialTimeout waits for the connection, but a TLS
	// or authentication failure can still surface only on the first call:
	// make one so that NewClient's error is the clear one.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(ctx, "\x00", clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("election: etcd %s does not answer within %v (unreachable, or TLS or authentication refused): %w", strings.Join(cfg.Endpoints, ","), cfg.DialTimeout, err)
	}
	return cli, nil
}
