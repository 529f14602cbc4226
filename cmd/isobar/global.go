package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/global"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/gossip"
	"github.com/isobar-mesh/isobar/summary"
)

// gossipTLS is the mTLS material a gossip member binds its identity to
// (regional/gossip Identity): empty when the controller runs --insecure.
type gossipTLS struct{ cert, key, ca string }

func (g gossipTLS) enabled() bool { return g.cert != "" }

// checkGossipKey refuses gossip without a key on a controller that runs
// with mTLS: memberlist's key is the only thing that keeps strangers out
// of the cluster (regional/gossip doc.go).
func checkGossipKey(listen, keyFile string, mtls bool) error {
	if listen == "" || keyFile != "" || !mtls {
		return nil
	}
	return usageError{errors.New("--gossip-key-file is required with mTLS (--tls-cert): without a key anyone who reaches --gossip-listen joins the gossip. " +
		"Make one with `head -c 32 /dev/urandom > gossip.key` (or `openssl rand -base64 32 > gossip.key`), keep it 0600 and give the same file to every controller")}
}

// startGossip starts a memberlist member listening on listen. With mTLS
// the member proves its identity with its certificate and accepts region
// claims only from region identities (regional/gossip identity.go), and a
// key is required.
func startGossip(ctx context.Context, cfg gossip.Config, listen string, join []string, keyFile string, tlsf gossipTLS, log *slog.Logger) (*gossip.Node, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, usageError{fmt.Errorf("--gossip-listen %q: %v", listen, err)}
	}
	if cfg.BindPort, err = strconv.Atoi(port); err != nil {
		return nil, usageError{fmt.Errorf("--gossip-listen %q: bad port", listen)}
	}
	cfg.BindAddr, cfg.Join = host, join
	if err := checkGossipKey(listen, keyFile, tlsf.enabled()); err != nil {
		return nil, err
	}
	if cfg.SecretKey, err = readGossipKey(keyFile); err != nil {
		return nil, err
	}
	deps := gossip.Deps{Logger: log, Validate: summary.Validate}
	if tlsf.enabled() {
		sc, err := certs.ServerConfig(tlsf.cert, tlsf.key, tlsf.ca)
		if err != nil {
			return nil, fmt.Errorf("gossip identity: %w", err)
		}
		deps.Identity = &gossip.Identity{Roots: sc.ClientCAs}
		if cfg.Role == gossip.RoleRegional {
			deps.Identity.Certificate = func() (*tls.Certificate, error) { return sc.GetCertificate(nil) }
		}
	}
	node, err := gossip.New(cfg, deps)
	if err != nil {
		return nil, err
	}
	if err := node.Start(ctx); err != nil {
		return nil, err
	}
	return node, nil
}

// gossipKeyHelp is the --gossip-key-file help of every controller.
const gossipKeyHelp = "file holding the gossip encryption key, the same on every controller: exactly 16, 24 or 32 raw bytes (head -c 32 /dev/urandom > gossip.key), or the key in hex or base64 on one line; required with mTLS"

// etcdFlags are the flags every etcd-using command shares: the external
// cluster's endpoints, TLS and auth. A password is read from a file, never
// taken on the command line (where ps and shell history show it).
type etcdFlags struct {
	endpoints              []string
	tls                    election.TLSFiles
	username, passwordFile string
}

func (e *etcdFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringSliceVar(&e.endpoints, "etcd-endpoints", nil, "etcd endpoints (host:port or https://host:port), comma-separated; with --etcd-ca every connection is TLS")
	f.StringVar(&e.tls.CertFile, "etcd-cert", "", "client certificate (PEM) for etcd (the user, by its common name, when etcd runs with --client-cert-auth)")
	f.StringVar(&e.tls.KeyFile, "etcd-key", "", "client key (PEM) for etcd")
	f.StringVar(&e.tls.CAFile, "etcd-ca", "", "CA bundle (PEM) for etcd's server certificate; turns TLS on")
	f.StringVar(&e.username, "etcd-username", "", "etcd user, for a cluster with auth enabled; needs --etcd-password-file and TLS (--etcd-ca)")
	f.StringVar(&e.passwordFile, "etcd-password-file", "", "file holding the etcd user's password (surrounding whitespace trimmed); never pass a password on the command line")
}

// config is the etcd client configuration the flags describe (the
// password read from its file); the role's New connects with it.
func (e *etcdFlags) config(log *slog.Logger) (election.ClientConfig, error) {
	cc := election.ClientConfig{Endpoints: e.endpoints, TLS: e.tls, Logger: log, Username: e.username}
	switch {
	case e.username != "" && e.passwordFile == "":
		return cc, usageError{fmt.Errorf("--etcd-username needs --etcd-password-file")}
	case e.username == "" && e.passwordFile != "":
		return cc, usageError{fmt.Errorf("--etcd-password-file needs --etcd-username")}
	case e.passwordFile != "":
		b, err := os.ReadFile(e.passwordFile)
		if err != nil {
			return cc, fmt.Errorf("--etcd-password-file: %w", err)
		}
		if cc.Password = strings.TrimSpace(string(b)); cc.Password == "" {
			return cc, usageError{fmt.Errorf("--etcd-password-file %s is empty", e.passwordFile)}
		}
	}
	return cc, nil
}

// globalOpts are the flags of `isobar global`; cfg starts from
// global.DefaultConfig, so every flag's default is the config's.
type globalOpts struct {
	cfg                                  global.Config
	ef                                   etcdFlags
	tf                                   transportFlags
	regions, gossipListen, gossipKeyFile string
	gossipJoin                           []string
}

func newGlobalCmd(ro *rootOpts) *cobra.Command {
	o := &globalOpts{cfg: global.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "global",
		Short: "Run a global controller: one member of the HA pair that routes between regions",
		Long: `Run one member of the global HA pair. Both members campaign on an etcd
election; the leader accepts GlobalControl.Sync streams from regional
controllers, solves the cross-region routing problem every --cycle-interval
(see 'isobar global plan --help' for the model), writes each plan to etcd in a
transaction guarded by its election key's revision, and sends every region
its part. A standby refuses Sync with FailedPrecondition naming the leader.
Regions whose summaries are older than --region-ttl are treated as down.`,
		Example: `  isobar global --name g1 --listen 0.0.0.0:19000 --advertise 10.0.0.5:19000 \
    --tls-cert pki/g1.pem --tls-key pki/g1-key.pem --tls-ca pki/ca.pem \
    --etcd-endpoints https://10.0.0.9:2379 --etcd-ca pki/etcd-ca.pem --etcd-username isobar --etcd-password-file /run/secrets/etcd-password
  isobar global --name g1 --etcd-endpoints 127.0.0.1:2379 --insecure   # plain text, development only
  isobar global plan --input whatif.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd, ro) },
	}
	o.register(cmd)
	cmd.AddCommand(newGlobalPlanCmd(ro))
	return cmd
}

func (o *globalOpts) run(cmd *cobra.Command, ro *rootOpts) error {
	cfg := o.cfg
	if err := o.tf.check(cfg.TLSCert != "" || cfg.TLSKey != "" || cfg.TLSCA != ""); err != nil {
		return err
	}
	if !o.tf.insecure && (cfg.TLSCert == "" || cfg.TLSKey == "" || cfg.TLSCA == "") {
		return usageError{errors.New("--tls-cert, --tls-key and --tls-ca must be given together")}
	}
	if err := checkGossipKey(o.gossipListen, o.gossipKeyFile, cfg.TLSCert != ""); err != nil {
		return err
	}
	log, err := ro.logger()
	if err != nil {
		return err
	}
	o.tf.warn(log)
	if len(o.ef.endpoints) == 0 {
		return usageError{fmt.Errorf("--etcd-endpoints is required")}
	}
	if o.regions != "" {
		cfg.Regions = strings.Split(o.regions, ",")
	}
	// global.New connects to etcd from the config and closes the client
	// on Stop.
	if cfg.Etcd, err = o.ef.config(log); err != nil {
		return err
	}
	if o.gossipListen != "" {
		node, err := startGossip(cmd.Context(), gossip.Config{Role: gossip.RoleGlobal}, o.gossipListen, o.gossipJoin, o.gossipKeyFile,
			gossipTLS{cfg.TLSCert, cfg.TLSKey, cfg.TLSCA}, log)
		if err != nil {
			return err
		}
		defer node.Stop()
	}
	tr, err := ro.tracing(cmd.Context(), "global")
	if err != nil {
		return err
	}
	defer shutdownTracing(tr)
	err = global.Run(cmd.Context(), cfg, global.Deps{Logger: log, GRPCServerOptions: tr.server})
	if errors.Is(err, election.ErrInvalidConfig) {
		return usageError{err}
	}
	return err
}

func (o *globalOpts) register(cmd *cobra.Command) {
	f, cfg := cmd.Flags(), &o.cfg
	f.StringVar(&cfg.Name, "name", cfg.Name, "member name (default hostname-pid)")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC address for GlobalControl.Sync")
	f.StringVar(&cfg.Advertise, "advertise", cfg.Advertise, "address regions dial, published in the election (default: the bound --listen address)")
	f.StringVar(&cfg.HTTPListen, metricsListenFlag, cfg.HTTPListen, `address for /metrics and /debug/plan ("-" disables)`)
	deprecatedAlias(f, oldHTTPListenFlag, metricsListenFlag)
	f.StringVar(&cfg.ElectionPrefix, "election-prefix", cfg.ElectionPrefix, "etcd election prefix")
	f.StringVar(&cfg.PlanKey, "plan-key", cfg.PlanKey, "etcd key plans are written to (fenced)")
	f.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "election lease TTL: a crashed leader is replaced within about this")
	f.DurationVar(&cfg.CycleInterval, "cycle-interval", cfg.CycleInterval, "time between plans")
	f.DurationVar(&cfg.RegionTTL, "region-ttl", cfg.RegionTTL, "a region whose summary is older is down")
	f.DurationVar(&cfg.PlanTTL, "plan-ttl", cfg.PlanTTL, "plans are valid this long; regions fall back after")
	f.StringVar(&o.regions, "regions", "", "comma-separated allowlist of region names (default: any)")
	f.IntVar(&cfg.Limits.MaxRegions, "max-regions", cfg.Limits.MaxRegions, "regions held at most; a new region beyond it is refused (ResourceExhausted)")
	f.DurationVar(&cfg.Limits.RegionForgetAfter, "region-forget-after", cfg.Limits.RegionForgetAfter, "a region silent this long may be forgotten to admit a new one")
	f.IntVar(&cfg.Limits.MaxRecvMsgBytes, "max-grpc-message-bytes", cfg.Limits.MaxRecvMsgBytes, "largest gRPC message received")
	f.DurationVar(&cfg.Limits.MaxClockSkew, "max-clock-skew", cfg.Limits.MaxClockSkew, "a region whose summary time is further off is flagged (never refused)")
	f.Float64Var(&cfg.Plan.Headroom, "headroom", cfg.Plan.Headroom, "plan each region to at most capacity × headroom")
	f.Float64Var(&cfg.Plan.DampStep, "damp-step", cfg.Plan.DampStep, "share of the way to the new optimum taken per cycle")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "server certificate (PEM) with identity spiffe://isobar/global/<name> (isobar certs issue --role global): regions accept plans only from it")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "key (PEM) of --tls-cert")
	f.StringVar(&cfg.TLSCA, "tls-ca", "", "CA bundle (PEM) region certificates must chain to")
	f.StringVar(&o.gossipListen, "gossip-listen", "", "memberlist address (host:port) to join the regions' gossip as a global member; empty: none")
	f.StringSliceVar(&o.gossipJoin, "gossip-join", nil, "gossip seeds (host:port), comma-separated")
	f.StringVar(&o.gossipKeyFile, "gossip-key-file", "", gossipKeyHelp)
	o.ef.add(cmd)
	o.tf.add(cmd)
}

// gossipFlags are a controller's --gossip-listen, --gossip-join and
// --gossip-key-file.
type gossipFlags struct {
	listen, keyFile string
	join            []string
}

// config checks the flags and reads the key into the region's gossip
// configuration (empty Listen: no gossip).
func (g gossipFlags) config(mtls bool) (regional.GossipConfig, error) {
	gc := regional.GossipConfig{Listen: g.listen, Join: g.join}
	if err := checkGossipKey(g.listen, g.keyFile, mtls); err != nil || g.listen == "" {
		return gc, err
	}
	_, port, err := net.SplitHostPort(g.listen)
	if err != nil {
		return gc, usageError{fmt.Errorf("--gossip-listen %q: %v", g.listen, err)}
	}
	if _, err := strconv.Atoi(port); err != nil {
		return gc, usageError{fmt.Errorf("--gossip-listen %q: bad port", g.listen)}
	}
	if gc.SecretKey, err = readGossipKey(g.keyFile); err != nil {
		return gc, err
	}
	return gc, nil
}

// readGossipKey reads --gossip-key-file ("" : no key).
func readGossipKey(keyFile string) ([]byte, error) {
	if keyFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file: %w", err)
	}
	key, err := gossip.ParseKey(b)
	if err != nil {
		return nil, usageError{fmt.Errorf("--gossip-key-file %s: %w", keyFile, err)}
	}
	return key, nil
}
