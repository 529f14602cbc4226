package main

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/isobar-mesh/isobar/lab"
)

func newLabCmd(ro *rootOpts) *cobra.Command {
	var cfg lab.Config
	var ef engineFlags
	var regionRPS map[string]string
	var cf labClassFlags
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Run the embedded default: a simulated multi-region fleet with traffic and a live view",
		Long:  labLong,
		Example: `  isobar lab
  isobar lab --regions us-east,eu-west --cells 2 --rps 3
  isobar lab --duration 30s --report lab.json
  isobar lab --workload multiturn --sessions 32 --duration 120s --report mt.json   # chat sessions: prefix-cache reuse
  isobar lab --gpu rtx-pro-6000 --model llama-3.1-70b-awq   # physics engine instead of the fitted 70b-awq profile
  isobar lab --duration 120s --region-rps us-east=8 --rps 1   # overload one region, the others light
  isobar lab --duration 120s --region-rps us-east=8.6 --rps 1 --criticality-mix critical=0.2,standard=0.5,sheddable=0.3 \
      --tenants quiet=1,noisy=5   # who loses under overload: the closing table is by criticality and tenant
  isobar lab --residency residency.json   # pin tenants or models to regions (package residency's JSON)
  isobar lab --dir run1 --admin-listen 127.0.0.1:9443   # then: isobar chaos run kill-cell --target 127.0.0.1:9443 \
      #   --tls-cert run1/pki/operator-lab.pem --tls-key run1/pki/operator-lab-key.pem --tls-ca run1/pki/ca.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cf.apply(&cfg); err != nil {
				return err
			}
			return runLab(cmd, ro, cfg, &ef, regionRPS)
		},
	}
	registerLabFlags(cmd.Flags(), &cfg, &ef, &regionRPS)
	cf.register(cmd.Flags(), &cfg)
	return cmd
}

// labLong is the lab command's help.
const labLong = `Run a whole simulated fleet in one process, every component real and
talking over loopback: an embedded etcd and the global HA pair; per region a
regional controller, a gateway (the region's ingress), a gossip member and
simulated vLLM engines with a fake dcgm-exporter and a cellagent per cell;
emulated WAN delay and jitter between regions; mTLS on every gRPC link from a
development CA generated for the run; steady mixed traffic from clients local
to each region. A live view refreshes every second; Ctrl-C shuts everything
down cleanly.

With --duration the lab runs headless for that long; --report writes the
figures as JSON, with each region's and the fleet's prefix-cache queries,
hits and hit rate read from the engines at the end.

--workload steady (the default) sends Poisson arrivals of single
completions, each prompt distinct random words; --workload multiturn runs
--sessions chat conversations per region at once, each of up to --turns
turns of ~256-token user messages, every turn's request carrying the whole
history (user messages and the assistant's replies), so each turn's prompt
extends the previous one's and the engines' prefix caches can reuse it.

The simulated engines follow the fitted 70b-awq profile unless --profile
names another, or --gpu and --model select the physics engine of a
catalogue GPU and model (with --tp and --kv-dtype; see isobar sim sweep
--help); the dcgm-exporters then report the catalogue GPU.

--criticality-mix and --tenants give the clients' requests a criticality
and a tenant, drawn per request from --seed and sent in the
x-isobar-criticality and x-isobar-tenant headers (the lab's gateways trust
their loopback clients); the closing table gives requests, success and
TTFT P50/P95 by criticality and tenant, as the --report JSON does
(by_criticality, by_tenant). --residency pins tenants or models to
regions (package residency's JSON); a file naming a region the lab does
not run refuses to start.

--admin-listen serves the admin API isobar chaos drives (fleet state, fault
injection) over HTTPS with mTLS, answering operator identities only; the
lab issues the operator certificate operator-lab.pem next to its CA under
--dir/pki (give --dir to keep them). Off by default.`

// runLab runs the lab with cfg completed from the flags that need
// parsing.
func runLab(cmd *cobra.Command, ro *rootOpts, cfg lab.Config, ef *engineFlags, regionRPS map[string]string) error {
	for name, v := range regionRPS {
		rps, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return usageError{fmt.Errorf("--region-rps %s=%q: not a number", name, v)}
		}
		if cfg.RegionRPS == nil {
			cfg.RegionRPS = map[string]float64{}
		}
		cfg.RegionRPS[name] = rps
	}
	if f := cmd.Flags(); ef.physics(f) {
		if _, err := ef.resolve(f); err != nil {
			return err
		}
		cfg.Physics = ef.spec()
	} else {
		cfg.Profile = ef.profile
	}
	if !cmd.Flags().Changed("log-level") {
		// Keep the live view readable: only warnings unless asked.
		ro.logLevel = "warn"
	}
	log, err := ro.logger()
	if err != nil {
		return err
	}
	if cfg.Insecure {
		log.Warn("running without TLS (--insecure): the lab's gRPC links and etcd are plain text and carry no identities")
	}
	err = lab.Run(cmd.Context(), cfg, lab.Deps{Logger: log, Out: ro.stdout})
	if errors.Is(err, lab.ErrInvalidConfig) {
		return usageError{err}
	}
	return err
}

// labClassFlags are the lab's traffic-class flags, parsed by package lab.
type labClassFlags struct {
	mix, tenants map[string]string
}

func (c *labClassFlags) register(f *pflag.FlagSet, cfg *lab.Config) {
	f.StringToStringVar(&c.mix, "criticality-mix", nil, "share of requests per criticality, e.g. critical=0.2,standard=0.5,sheddable=0.3 "+
		"(sent as x-isobar-criticality; default: all standard, no header)")
	f.StringToStringVar(&c.tenants, "tenants", nil, "tenants of the clients' requests with their weights, e.g. quiet=1,noisy=5 (sent as x-isobar-tenant; default none)")
	f.StringVar(&cfg.Residency, "residency", "", "residency config (JSON: sets, tenants, models) every region's controller and gateway enforce; "+
		"it must name only the lab's regions")
}

// apply parses the class flags into cfg; bad values are usage errors
// naming the flag.
func (c *labClassFlags) apply(cfg *lab.Config) error {
	mix, err := lab.ParseCriticalityMix(c.mix)
	if err != nil {
		return usageError{err}
	}
	tenants, err := lab.ParseTenants(c.tenants)
	if err != nil {
		return usageError{err}
	}
	cfg.CriticalityMix, cfg.Tenants = mix, tenants
	return nil
}

// registerLabFlags registers the lab command's flags into cfg, ef and
// regionRPS.
func registerLabFlags(f *pflag.FlagSet, cfg *lab.Config, ef *engineFlags, regionRPS *map[string]string) {
	f.StringSliceVar(&cfg.Regions, "regions", lab.DefaultRegions(), "region names; the first hosts the global pair")
	f.IntVar(&cfg.Cells, "cells", 3, "cells (simulated GPUs) per region")
	f.Float64Var(&cfg.RPS, "rps", 0, "mean request rate per region (default: one per cell); with --workload multiturn, the rate sessions reach when replies are quick")
	f.StringToStringVar(regionRPS, "region-rps", nil, "mean request rate of named regions, overriding --rps (e.g. us-east=8,eu-west=1)")
	f.IntVar(&cfg.MaxTokens, "max-tokens", 128, "output tokens per request")
	f.StringVar(&cfg.Workload, "workload", lab.WorkloadSteady, fmt.Sprintf("client traffic, one of %v: steady (Poisson single completions, distinct prompts) or multiturn (chat sessions whose turns extend their history)", lab.Workloads()))
	f.IntVar(&cfg.Sessions, "sessions", 16, "multiturn: conversations open at once per region; each starts its turns at --rps/--sessions on average, never before the last reply")
	f.IntVar(&cfg.Turns, "turns", 8, "multiturn: most turns of a conversation (each draws 1..--turns)")
	f.DurationVar(&cfg.Duration, "duration", 0, "run this long, then stop (0: until Ctrl-C)")
	f.StringVar(&cfg.Report, "report", "", "write the figures as JSON to this file when the run ends")
	f.BoolVar(&cfg.View, "view", false, "draw the live view even with --duration")
	ef.register(f, "")
	f.Float64Var(&cfg.TimeScale, "time-scale", 1, "multiply every simulated duration (0.1 runs 10x faster)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 0, "cellagent heartbeat interval (default 500ms)")
	f.DurationVar(&cfg.Jitter, "jitter", 0, "WAN jitter added to every inter-region path (default 2ms)")
	f.StringVar(&cfg.LB, "lb", "isobar", "gateway load balancing: isobar (least expected TTFT among the endpoints isobar's weights admit), xds (the pushed cluster policy, as Envoy runs it), rr or lr (Envoy baselines)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the traffic (arrivals, prompt sizes) and of the WAN jitter: the same seed replays the same arrivals")
	f.IntVar(&cfg.Globals, "globals", 0, "members of the global HA pair (default 2; 0 with one region)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "turn mTLS off (default: every gRPC link and etcd use mTLS with identities from a run-local CA); logs a warning")
	f.StringVar(&cfg.Dir, "dir", "", "directory for the run's certificates and etcd data (default: a temporary one)")
	f.StringVar(&cfg.AdminListen, "admin-listen", "", "serve the admin API for isobar chaos on this address (HTTPS, mTLS, operator identity "+
		"spiffe://isobar/operator/lab; its certificate is written under --dir/pki)")
}
