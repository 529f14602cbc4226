package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/election"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/regional/score"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// regionalOpts are the flags of `isobar regional`; cfg starts from
// regional.DefaultConfig, so every flag's default is the config's.
type regionalOpts struct {
	cfg                               regional.Config
	weights, lbPolicy, adminTokenFile string
	residencyFile                     string
	endpointBinding, endpointMapFile  string
	ef                                etcdFlags
	tf                                transportFlags
	gossip                            gossipFlags
}

func newRegionalCmd(ro *rootOpts) *cobra.Command {
	o := &regionalOpts{cfg: regional.DefaultConfig("")}
	// The binary always holds its first push (warm start); --state-dir
	// lets it end the hold as soon as the cells it last served are back.
	o.cfg.WarmStart.Hold = regional.DefaultWarmStartHold
	cmd := &cobra.Command{
		Use:   "regional",
		Short: "Run a regional controller: heartbeat registry, scoring, xDS server",
		Long: `Run one datacenter's regional controller.

Cellagents stream heartbeats to --listen (gRPC CellRegistry); the controller
tracks each cell's lifecycle, scores its pressure from 11 signals, projects
endpoint weights and serves them over ADS on the same address to the
region's Envoy (and isobar gateways, and proxyless gRPC clients).
--metrics-listen serves /metrics, /debug/cells[/ID] and the drain API
(POST /v1/cells/ID/drain, /undrain, with Content-Type: application/json).
With --tls-cert it is HTTPS, and the debug pages and drain API need an
operator client certificate (isobar certs issue --role operator) or the
--admin-token-file token; cross-origin requests are refused.`,
		Example: `  isobar regional --region us-east --listen 0.0.0.0:18000 --metrics-listen 127.0.0.1:9090 \
    --tls-cert pki/us-east.pem --tls-key pki/us-east-key.pem --tls-ca pki/ca.pem
  isobar regional --region us-east --insecure   # plain text, development only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd, ro) },
	}
	o.register(cmd)
	return cmd
}

func (o *regionalOpts) run(cmd *cobra.Command, ro *rootOpts) error {
	cfg := o.cfg
	if err := o.tf.check(cfg.TLS.Enabled()); err != nil {
		return err
	}
	if err := cfg.TLS.Validate(); err != nil {
		return usageError{err}
	}
	var err error
	if cfg.Gossip, err = o.gossip.config(cfg.TLS.Enabled()); err != nil {
		return err
	}
	log, err := ro.logger()
	if err != nil {
		return err
	}
	o.tf.warn(log)
	if err := o.apply(&cfg); err != nil {
		return err
	}
	tr, err := ro.tracing(cmd.Context(), "regional")
	if err != nil {
		return err
	}
	defer shutdownTracing(tr)
	// regional.New connects to etcd and builds the gossip node from cfg
	// (the same assembly as the lab's and the soak's), and closes both.
	deps := regional.Deps{Logger: log, GRPCServerOptions: tr.server}
	if len(o.ef.endpoints) > 0 {
		if cfg.Etcd, err = o.ef.config(log); err != nil {
			return err
		}
		if deps.GlobalDialOptions, err = regional.ClientDialOptions(cfg.TLS); err != nil {
			return err
		}
		deps.GlobalDialOptions = append(deps.GlobalDialOptions, tr.dial...)
	}
	err = regional.Run(cmd.Context(), cfg, deps)
	if errors.Is(err, election.ErrInvalidConfig) {
		return usageError{err}
	}
	return err
}

// apply sets the fields that come from files or parsed flag values.
func (o *regionalOpts) apply(cfg *regional.Config) error {
	var err error
	if cfg.Region == "" {
		return usageError{fmt.Errorf("--region is required")}
	}
	if o.weights != "" {
		if cfg.Score.Weights, err = parseWeights(cfg.Score.Weights, o.weights); err != nil {
			return usageError{err}
		}
	}
	cfg.XDS.LBPolicy = xdscontract.LBPolicy(o.lbPolicy)
	cfg.EndpointBinding = regional.EndpointBinding(o.endpointBinding)
	if o.endpointMapFile != "" {
		b, err := os.ReadFile(o.endpointMapFile)
		if err != nil {
			return fmt.Errorf("--endpoint-map-file: %w", err)
		}
		if cfg.EndpointMap, err = regional.ParseEndpointMap(string(b)); err != nil {
			return usageError{fmt.Errorf("--endpoint-map-file %s: %w", o.endpointMapFile, err)}
		}
	}
	if o.adminTokenFile != "" {
		b, err := os.ReadFile(o.adminTokenFile)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		cfg.AdminToken = strings.TrimSpace(string(b))
	}
	return o.applyResidency(cfg)
}

func (o *regionalOpts) register(cmd *cobra.Command) {
	f, cfg := cmd.Flags(), &o.cfg
	f.StringVar(&cfg.Region, "region", "", "region (datacenter) this controller serves (required)")
	f.StringVar(&cfg.Zone, "zone", "", "locality zone written into xDS (default: the region)")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC address for cellagent heartbeats and xDS (ADS)")
	f.StringVar(&cfg.HTTPListen, metricsListenFlag, cfg.HTTPListen, `address for /metrics, /debug/cells and the drain API, over TLS with --tls-cert ("-" disables); debug pages and drain API need an operator certificate or --admin-token-file's token when either is configured`)
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "heartbeat interval agents are told to use")
	f.DurationVar(&cfg.TTLGrace, "ttl-grace", cfg.TTLGrace, "a cell is Failed after heartbeat-interval + ttl-grace without a heartbeat")
	f.DurationVar(&cfg.CycleInterval, "cycle-interval", cfg.CycleInterval, "how often pressure is rescored and weights projected")
	f.DurationVar(&cfg.ProbeInterval, "probe-interval", cfg.ProbeInterval, "RTT/jitter probe interval per cell")
	// Left 0 here, the default follows --probe-interval (withDefaults).
	cfg.ProbeSteadyInterval = 0
	f.DurationVar(&cfg.ProbeSteadyInterval, "probe-steady-interval", 0, "probe interval of a cell whose RTT estimate is steady (a new cell, one whose RTT moved or whose probe failed is probed every --probe-interval); --probe-interval probes every cell every round (default 10s, or --probe-interval when longer)")
	f.IntVar(&cfg.ProbeMaxPerRound, "probe-max-per-round", cfg.ProbeMaxPerRound, "cells probed per probe round at most (those probed longest ago): bounds the probes' cost in large regions")
	f.DurationVar(&cfg.ForgetAfter, "forget-after", cfg.ForgetAfter, "how long Failed/Terminated cells stay visible before they are forgotten")
	f.Float64Var(&cfg.MassExpiry.Fraction, "mass-expiry-fraction", cfg.MassExpiry.Fraction, "share of the live cells (at least 3) past their TTL at once that this controller holds rather than fails, as its own stall is the likelier cause; in (0, 1]")
	f.DurationVar(&cfg.MassExpiry.Hold, "mass-expiry-hold", cfg.MassExpiry.Hold, "longest a mass TTL expiry is held before the cells still silent fail; negative: never hold")
	deprecatedAlias(f, oldHTTPListenFlag, metricsListenFlag)
	f.IntVar(&cfg.MaxMessageBytes, "max-heartbeat-bytes", cfg.MaxMessageBytes, "largest heartbeat message accepted")
	f.IntVar(&cfg.Limits.MaxRecvMsgBytes, "max-grpc-message-bytes", cfg.Limits.MaxRecvMsgBytes, "largest gRPC message received (heartbeats, data-plane reports, xDS requests)")
	f.IntVar(&cfg.Limits.MaxCells, "max-cells", cfg.Limits.MaxCells, "cells this region holds at most; a new cell beyond it is refused (ResourceExhausted)")
	f.Float64Var(&cfg.Limits.HeartbeatRate, "heartbeat-rate-limit", cfg.Limits.HeartbeatRate, "heartbeats/s allowed per stream; beyond it heartbeats are dropped")
	f.IntVar(&cfg.Limits.HeartbeatBurst, "heartbeat-burst", cfg.Limits.HeartbeatBurst, "per-stream heartbeat burst; drops that go on for burst/rate seconds without a pause (a sender above the rate, not a backlog read at once) close the stream (ResourceExhausted)")
	f.DurationVar(&cfg.Limits.MaxClockSkew, "max-clock-skew", cfg.Limits.MaxClockSkew, "a cell whose heartbeat send time is further off is flagged (never refused)")
	f.StringVar(&cfg.WarmStart.StateDir, "state-dir", "", "directory (on a persistent volume) where the controller keeps the cells and models it last pushed, so that after a restart it holds its first xDS push only until those cells are back (empty: the hold always runs to --warm-start-hold)")
	f.DurationVar(&cfg.WarmStart.Hold, "warm-start-hold", cfg.WarmStart.Hold, "longest a starting controller holds its first xDS push for its cells to reconnect: set it to the TTL (heartbeat-interval + ttl-grace) plus twice the agents' largest backoff (2s); negative: no hold")
	f.Float64Var(&cfg.WarmStart.Quorum, "warm-start-quorum", cfg.WarmStart.Quorum, "share of the last pushed cells whose reconnection ends the hold early (with --state-dir), in (0, 1]")
	f.IntVar(&cfg.Limits.MaxDemandKeys, "max-demand-keys", cfg.Limits.MaxDemandKeys, "(data plane, model) demand windows kept at most")
	f.StringVar(&o.weights, "score-weights", "", "override signal weights, e.g. queue=0.3,rtt=0 (signals: "+signalList()+")")
	f.StringVar(&o.lbPolicy, "lb-policy", string(xdscontract.LeastRequest), "cluster LB policy in xDS: least_request, ring_hash or round_robin")
	f.BoolVar(&cfg.XDS.LEDS, "xds-leds", false, "serve delta (incremental) xDS clients endpoints by LEDS, one LbEndpoint resource each, so one endpoint's change sends that endpoint; state-of-the-world clients (Envoy on SotW, gRPC) are unchanged")
	f.StringVar(&o.endpointBinding, "endpoint-binding", "", "how a cell's advertised endpoint is checked against its certificate: san (its IP must be an IP SAN of the cell's certificate; the default with mTLS), mapping (an IP SAN, or a prefix --endpoint-map-file lists for the cell), off (any endpoint; the default with --insecure)")
	f.StringVar(&o.endpointMapFile, "endpoint-map-file", "", "with --endpoint-binding=mapping: lines of <cell-id glob> <IP or CIDR>... (e.g. '* 10.244.0.0/16' for a pod network); '#' comments")
	f.StringVar(&o.adminTokenFile, "admin-token-file", "", "file holding a bearer token accepted by the debug pages and drain API (besides an operator certificate with TLS)")
	f.DurationVar(&cfg.FirstHeartbeatTimeout, "first-heartbeat-timeout", cfg.FirstHeartbeatTimeout, "a heartbeat stream silent this long after it opens is closed (DeadlineExceeded)")
	f.IntVar(&cfg.Limits.MaxHeartbeatStreams, "max-heartbeat-streams", 0, "heartbeat streams open at once, all connections together; one more is refused (ResourceExhausted); 0: 2 x --max-cells")
	f.StringVar(&cfg.TLS.Cert, "tls-cert", "", "certificate (PEM) with identity spiffe://isobar/region/<region> (isobar certs issue --role regional), served to cellagents and gateways and presented to the global leader")
	f.StringVar(&cfg.TLS.Key, "tls-key", "", "key (PEM) of --tls-cert")
	f.StringVar(&cfg.TLS.CA, "tls-ca", "", "CA bundle (PEM) that client certificates and the global leader's must chain to")
	f.StringVar(&cfg.Global.IngressAddress, "ingress-address", "", "IP:port where other regions send traffic for this one (advertised)")
	f.DurationVar(&cfg.Global.SummaryInterval, "summary-interval", cfg.Global.SummaryInterval, "interval between summaries to the global leader and gossip")
	f.Float64Var(&cfg.Global.NominalCellRPS, "cell-capacity-rps", cfg.Global.NominalCellRPS, "cold-start prior of one healthy cell's capacity at SLO (requests/s); the summary moves to the capacity measured from the cell's signals as evidence arrives (docs/capacity.md)")
	f.DurationVar(&cfg.Global.Capacity.TTFTSLO, "capacity-ttft-slo", cfg.Global.Capacity.TTFTSLO, "TTFT P95 SLO against which a cell's capacity is measured")
	f.StringVar(&o.gossip.listen, "gossip-listen", "", "memberlist address (host:port) for gossip among regions; empty: no gossip")
	f.StringSliceVar(&o.gossip.join, "gossip-join", nil, "gossip seeds (host:port), comma-separated")
	f.StringVar(&o.gossip.keyFile, "gossip-key-file", "", gossipKeyHelp)
	f.StringVar(&o.residencyFile, "residency", "", `data-residency config (JSON: {"sets": {name: [regions]}, "tenants": {tenant: set}, "models": {model: set}}): pinned requests are never routed outside their set's regions, whatever the plan or its absence; needs --fleet-regions when a set names another region`)
	f.StringSliceVar(&cfg.FleetRegions, "fleet-regions", nil, "the fleet's regions, comma-separated; a --residency set naming a region outside them (and this one) refuses to start")
	f.BoolVar(&cfg.StaticRetryBudget, "static-retry-budget", false, "keep every cluster's retry budget at the static 20 % instead of tightening it as the region's utilisation nears saturation")
	o.ef.add(cmd)
	o.tf.add(cmd)
}

func signalList() string {
	names := make([]string, 0, score.NumSignals)
	for s := score.Signal(0); s < score.NumSignals; s++ {
		names = append(names, s.String())
	}
	return strings.Join(names, ", ")
}

// parseWeights applies "name=value,..." overrides to base.
func parseWeights(base [score.NumSignals]float64, spec string) ([score.NumSignals]float64, error) {
	out := base
	for _, kv := range strings.Split(spec, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return base, fmt.Errorf("--score-weights: %q is not name=value", kv)
		}
		sig, found := score.Signal(0), false
		for s := score.Signal(0); s < score.NumSignals; s++ {
			if s.String() == name {
				sig, found = s, true
			}
		}
		if !found {
			return base, fmt.Errorf("--score-weights: unknown signal %q (known: %s)", name, signalList())
		}
		w, err := strconv.ParseFloat(val, 64)
		if err != nil || w < 0 {
			return base, fmt.Errorf("--score-weights: weight of %s must be a number >= 0, got %q", name, val)
		}
		out[sig] = w
	}
	return out, nil
}
