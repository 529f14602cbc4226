package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/gateway/extproc"
)

// newPickerCmd builds `isobar picker`.
// pickerLong is the picker's --help.
const pickerLong = `picker lets a stock Envoy pick endpoints per request as isobar's gateway
does. It is an Envoy external processor (envoy.filters.http.ext_proc, gRPC
on --listen) speaking the Gateway API Inference Extension's Endpoint Picker
Protocol: for each completion request (POST /v1/completions,
/v1/chat/completions) it reads the headers and, when Envoy sends it, the
body (request_body_mode BUFFERED, or FULL_DUPLEX_STREAMED as the
extension's picker uses), matches the route as the gateway does (model
header or the body's "model", size class, hop header), picks the endpoint
with the gateway's own pick (--lb; isobar by default: least expected time
to first token) and counts the request on it as the gateway's proxy does.
It names the endpoint, as ip:port, in the request header
x-gateway-destination-endpoint and in the dynamic metadata envoy.lb /
x-gateway-destination-endpoint; Envoy sends the request there through an
ORIGINAL_DST cluster that reads the header. A subset hint (filter metadata
envoy.lb.subset_hint / x-gateway-destination-endpoint-subset) restricts the
pick to its endpoints. No eligible endpoint: an immediate 503 with a JSON
error; the route's shed share or every endpoint full: 429. Other requests
pass through untouched.

The picker subscribes to the regional controller's xDS as the gateway does
and reports demand and endpoint outcomes (from the response headers, when
Envoy sends them) like a gateway. With mTLS (--tls-*) only this region's
gateway identity (spiffe://isobar/gateway/<region>) may open a stream: its
certificate both dials the controller and serves Envoy, so issue it with
--server --client and a SAN for the address Envoy dials. gRPC health
(liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor) turns
SERVING once the configuration has arrived; --metrics-listen serves /health
and /metrics.

Configure Envoy with failure_mode_allow: a picker that is down, slow or
refuses a stream leaves the request without the header, and a route on the
header's absence sends it to the weighted clusters from xDS
(deploy/envoy/picker.yaml, docs/picker.md). On SIGINT/SIGTERM the picker
stops taking streams, lets open ones finish for up to --drain-timeout, and
exits.`

const pickerExample = `  isobar picker --controller 10.0.0.5:18000 --region eu-west --listen 0.0.0.0:9002 \
    --tls-cert pki/picker.pem --tls-key pki/picker-key.pem --tls-ca pki/ca.pem
  isobar picker --controller 127.0.0.1:18000 --region us-east --insecure   # plain text, development only`

func newPickerCmd(ro *rootOpts) *cobra.Command {
	var (
		d          dataPlaneFlags
		listen     string
		httpListen string
	)
	cmd := &cobra.Command{
		Use:     "picker",
		Short:   "Endpoint picker for stock Envoy: the Gateway API Inference Extension's protocol over ext_proc",
		Long:    pickerLong,
		Example: pickerExample,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("picker takes no arguments, got %q", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, dial, err := d.setup(cmd, ro)
			if err != nil {
				return err
			}
			tr, err := ro.tracing(cmd.Context(), "picker")
			if err != nil {
				return err
			}
			defer shutdownTracing(tr)
			cfg := extproc.Config{Gateway: d.cfg, Listen: listen,
				TLS: extproc.TLSFiles{Cert: d.tlsFiles.Cert, Key: d.tlsFiles.Key, CA: d.tlsFiles.CA}}
			cfg.Gateway.Listen = httpListen
			err = extproc.Run(cmd.Context(), cfg, extproc.Deps{
				Gateway:           gateway.Deps{Logger: log, DialOptions: append(dial, tr.dial...)},
				GRPCServerOptions: tr.server,
			})
			if errors.Is(err, gateway.ErrInvalidConfig) {
				return usageError{err}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:9002", "gRPC address serving ext_proc and gRPC health to Envoy")
	f.StringVar(&httpListen, "metrics-listen", "127.0.0.1:9003", "HTTP address serving /health and /metrics")
	d.add(cmd, string(gateway.LBIsobar), "certificate (PEM) with identity spiffe://isobar/gateway/<region>, for client and server use (isobar certs issue --role gateway --server --client --ip/--dns <address Envoy dials>): it dials the controller and serves Envoy; with --tls-key and --tls-ca")
	return cmd
}
