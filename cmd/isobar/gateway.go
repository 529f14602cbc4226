package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/gateway/placement"
	"github.com/isobar-mesh/isobar/regional"
	"github.com/isobar-mesh/isobar/xdscontract"
)

// newGatewayCmd builds `isobar gateway`.
func newGatewayCmd(ro *rootOpts) *cobra.Command {
	var d dataPlaneFlags
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Go data plane: route OpenAI-compatible requests as the regional controller's xDS says",
		Long: `gateway is isobar's HTTP data plane for places without Envoy. It subscribes to
the regional controller's clusters, endpoints and routes over ADS (the same
resources Envoy gets) and serves POST /v1/completions and
/v1/chat/completions (SSE streams passed through unbuffered), GET /v1/models,
/health and /metrics on --listen.

Each request is matched against the routes as Envoy would (model header or
the body's "model", context-length class from x-isobar-prompt-tokens or the
body size at 4 bytes per token, hop header), then sent to an endpoint of the
route's cluster. --lb xds (the default) picks as stock Envoy would on the
same resources: a priority by Envoy's priority load, a locality by its EDF
schedule when the cluster is locality-weighted, then the cluster's policy
(ROUND_ROBIN, LEAST_REQUEST with its choice_count, FULL_SCAN and
active_request_bias, or RANDOM; an unknown one falls back to ROUND_ROBIN with
a warning). --lb isobar picks the endpoint with the least expected time to
first token: RTT + 2 × jitter + the prompt tokens the gateway has sent it and
not yet seen answered (less the oldest one's progress), plus this request's,
over its prefill rate + the wait for a batch slot when the engine's slots are
full + --isobar-decode-cost per request in flight; with --prefix-affinity
(on), the prompt tokens an endpoint probably holds in its prefix cache (an
index of the prompt blocks sent to it) count as saved prefill, and among the
endpoints within --affinity-band of the best the longest cached prefix wins;
it sends an engine on
probation no more than its probe budget, and an engine that refused a prompt
as too long only what it holds. --lb rr and --lb lr are Envoy's round robin and least request (two
choices) over all endpoints with equal weights, the baselines. Retries within the cluster's retry budget, passive
outlier ejection, 429 load shedding (the route's shed share, or every
endpoint at --max-inflight-per-endpoint) and the route and connect timeouts
follow the resources. Requests sent to another region carry the hop header
and a proof made with --hop-key-file so that region serves them locally; a
hop header without a valid proof is removed, and that request is routed,
shed and counted as any client's. Responses name the endpoint in
x-isobar-endpoint and x-isobar-region.

Every client is bounded: --max-inflight requests at once (then 503 before
the body is read), the headers and body within --read-timeout (then 408),
idle keep-alive connections closed after --idle-timeout, and a client that
stops reading a streamed answer is cut when its route's timeout ends.

Every second the gateway reports per-endpoint outcomes and per-model ingress
demand to the controller (DataPlane.Report). Without its controller it keeps
routing on the last configuration. On SIGINT/SIGTERM it stops accepting,
lets in-flight requests finish for up to --drain-timeout, and exits.`,
		Example: `  isobar gateway --controller 10.0.0.5:18000 --region eu-west --lb rr --metrics-listen 127.0.0.1:9091 \
    --tls-cert gw.pem --tls-key gw-key.pem --tls-ca ca.pem
  isobar gateway --controller 127.0.0.1:18000 --region us-east --listen 127.0.0.1:8080 --insecure   # plain text, development only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, dial, err := d.setup(cmd, ro)
			if err != nil {
				return err
			}
			tr, err := ro.tracing(cmd.Context(), "gateway")
			if err != nil {
				return err
			}
			defer shutdownTracing(tr)
			err = gateway.Run(cmd.Context(), d.cfg, gateway.Deps{Logger: log, DialOptions: append(dial, tr.dial...)})
			if errors.Is(err, gateway.ErrInvalidConfig) {
				return usageError{err}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&d.cfg.Listen, "listen", "127.0.0.1:8080", "HTTP address to serve the OpenAI API, /health and /metrics on")
	f.StringVar(&d.cfg.MetricsListen, "metrics-listen", "", "extra address serving only /metrics; empty: none")
	f.IntVar(&d.cfg.MaxInflightRequests, "max-inflight", 4096, "completion requests held at once; one more is answered 503 before its body is read")
	f.DurationVar(&d.cfg.ReadTimeout, "read-timeout", 60*time.Second, "time to receive a request's headers and body; a slower body is answered 408 and its connection closed")
	f.DurationVar(&d.cfg.ReadHeaderTimeout, "read-header-timeout", 0, "time to receive a request's headers, at most --read-timeout (default the lesser of 10s and --read-timeout)")
	f.DurationVar(&d.cfg.IdleTimeout, "idle-timeout", 120*time.Second, "how long a keep-alive connection may wait for its next request")
	d.add(cmd, string(gateway.LBXDS), "client certificate (PEM) with identity spiffe://isobar/gateway/<region> (isobar certs issue --role gateway) for mTLS to the controller; with --tls-key and --tls-ca")
	return cmd
}

// dataPlaneFlags are the flags `isobar gateway` and `isobar picker` share:
// the controller they read xDS from and report to, the region, the pick,
// the request limits, and the mTLS files of the region's gateway identity.
type dataPlaneFlags struct {
	cfg          gateway.Config
	lb           string
	decodeCost   time.Duration
	affinity     bool
	affinityBand float64
	tlsFiles     regional.TLSFiles
	serverName   string
	tf           transportFlags
	hopKeyFile   string
	xdsMaxCells  int
	class        classFlags
}

// add registers the shared flags on cmd: --lb defaults to lbDefault, and
// certHelp says what --tls-cert is for.
func (d *dataPlaneFlags) add(cmd *cobra.Command, lbDefault, certHelp string) {
	f := cmd.Flags()
	f.StringVar(&d.cfg.Controller, "controller", "", "regional controller gRPC address host:port (ADS and reports); required")
	f.StringVar(&d.cfg.Region, "region", "", "region this data plane serves; required")
	f.StringVar(&d.cfg.NodeID, "node-id", "", "xDS node id and report identity (default isobar-"+cmd.Name()+"-<region>)")
	f.StringVar(&d.lb, "lb", lbDefault, "load balancing: xds (as Envoy would on the pushed resources), isobar (least expected time to first token), rr (Envoy round-robin baseline) or lr (Envoy least-request baseline, two choices)")
	f.DurationVar(&d.decodeCost, "isobar-decode-cost", placement.DefaultDecodeCost, "--lb isobar: expected latency added per request in flight on an endpoint (each running sequence lengthens every step of this answer); smaller packs decodes onto the hosts with the least prefill queued, larger spreads them (gateway/placement/README.md)")
	f.BoolVar(&d.affinity, "prefix-affinity", true, "--lb isobar: keep an index of the prompt blocks sent to each endpoint and count its expected cached prefix as saved prefill (gateway/prefix)")
	f.Float64Var(&d.affinityBand, "affinity-band", placement.DefaultAffinityBand, "--lb isobar with --prefix-affinity: among endpoints whose expected TTFT is within this fraction of the best, prefer the longest expected cached prefix; 0: no preference")
	f.IntVar(&d.cfg.MaxInflightPerEndpoint, "max-inflight-per-endpoint", 64, "requests in flight per endpoint above which it takes no more (with flow control an endpoint declaring max_num_seqs gets its batch plus what frees within a round trip, at most this); all full: the request queues (429 with --no-queue)")
	f.DurationVar(&d.cfg.DrainTimeout, "drain-timeout", 0, "on shutdown, how long requests in flight may finish (default 30s)")
	f.DurationVar(&d.cfg.ReportInterval, "report-interval", 0, "period of the reports to the controller (default 1s)")
	f.Int64Var(&d.cfg.MaxBodyBytes, "max-body-bytes", 0, "largest request body accepted; larger: 413 from the gateway, a ResourceExhausted stream from the picker (default 16 MiB)")
	f.StringVar(&d.cfg.ModelHeader, "model-header", "", `request header naming the model, as in the controller (default "x-isobar-model")`)
	f.StringVar(&d.cfg.HopHeader, "hop-header", "", `header marking requests forwarded from another region, as in the controller (default "x-isobar-hop"); trusted only with a proof made with --hop-key-file, removed from every other request`)
	f.StringVar(&d.hopKeyFile, "hop-key-file", "", "file whose bytes (as they are, at least 32; e.g. head -c 32 /dev/urandom) are the key every region's gateways and pickers share to prove the requests they forward to each other; without it no request is served as forwarded (each is shed and counted as a client's)")
	f.IntVar(&d.xdsMaxCells, "xds-max-cells", xdscontract.DefaultMaxCells, "the controller's --max-cells: sizes the largest xDS response received ("+strconv.Itoa(xdscontract.EDSBytesPerCell>>10)+" KiB per cell + 4 MiB)")
	f.BoolVar(&d.cfg.XDSDelta, "xds-delta", false, "receive endpoints over delta xDS (with LEDS when the controller runs --xds-leds): one endpoint's change costs its bytes, not its cluster's")
	f.StringVar(&d.tlsFiles.Cert, "tls-cert", "", certHelp)
	f.StringVar(&d.tlsFiles.Key, "tls-key", "", "private key (PEM) of --tls-cert")
	f.StringVar(&d.tlsFiles.CA, "tls-ca", "", "CA bundle (PEM) that verifies the controller (and, for the picker, its clients)")
	f.StringVar(&d.serverName, "tls-server-name", "", "name to verify in the controller's certificate (default: host of --controller)")
	d.tf.add(cmd)
	d.class.add(cmd)
}

// setup checks the shared flags and returns the process logger and the
// dial options to the controller: mTLS pinned to the region's controller
// identity (regional.ControllerDialOptions), or plain text with
// --insecure. A bad command line is a usageError.
func (d *dataPlaneFlags) setup(cmd *cobra.Command, ro *rootOpts) (*slog.Logger, []grpc.DialOption, error) {
	if err := d.tf.check(d.tlsFiles.Enabled()); err != nil {
		return nil, nil, err
	}
	if err := checkDurationFlags(cmd.Flags()); err != nil {
		return nil, nil, err
	}
	log, err := ro.logger()
	if err != nil {
		return nil, nil, err
	}
	d.tf.warn(log)
	if err := d.tlsFiles.Validate(); err != nil {
		return nil, nil, usageError{err}
	}
	if d.serverName != "" && !d.tlsFiles.Enabled() {
		return nil, nil, usageError{errors.New("--tls-server-name needs --tls-cert, --tls-key and --tls-ca")}
	}
	d.cfg.LB = gateway.LBMode(d.lb)
	if d.decodeCost < 0 {
		return nil, nil, usageError{fmt.Errorf("--isobar-decode-cost %v: want a duration >= 0, e.g. 25ms", d.decodeCost)}
	}
	if !(d.affinityBand >= 0) || math.IsInf(d.affinityBand, 1) {
		return nil, nil, usageError{fmt.Errorf("--affinity-band %v: want a number >= 0, e.g. 0.25", d.affinityBand)}
	}
	d.cfg.Placement = placement.DefaultConfig()
	d.cfg.Placement.DecodeCost = d.decodeCost
	d.cfg.Placement.AffinityBand = d.affinityBand
	d.cfg.NoPrefixAffinity = !d.affinity
	if d.xdsMaxCells < 1 {
		return nil, nil, usageError{fmt.Errorf("--xds-max-cells %d: want the controller's --max-cells, >= 1", d.xdsMaxCells)}
	}
	d.cfg.MaxXDSMessageBytes = xdscontract.MaxXDSMessageBytes(d.xdsMaxCells)
	if err := d.class.apply(&d.cfg); err != nil {
		return nil, nil, usageError{err}
	}
	if d.hopKeyFile != "" {
		// The file's bytes as they are: a binary key is not trimmed.
		key, err := os.ReadFile(d.hopKeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--hop-key-file: %w", err)
		}
		if len(key) < gateway.MinHopKeyBytes {
			return nil, nil, usageError{fmt.Errorf("--hop-key-file %s holds %d bytes; write at least %d random bytes (head -c 32 /dev/urandom > hop.key) and give every region's gateways the same file",
				d.hopKeyFile, len(key), gateway.MinHopKeyBytes)}
		}
		d.cfg.HopKey = key
	}
	dial, err := regional.ControllerDialOptions(d.tlsFiles, d.cfg.Region)
	if err != nil {
		return nil, nil, err
	}
	if d.serverName != "" {
		dial = append(dial, grpc.WithAuthority(d.serverName))
	}
	return log, dial, nil
}
