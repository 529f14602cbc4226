package main

import (
	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/lab"
)

func newLabCmd(ro *rootOpts) *cobra.Command {
	var cfg lab.Config
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Run the embedded default: a simulated fleet with traffic and a live view",
		Long: `Run a whole simulated region in one process: simulated vLLM engines with a
fake dcgm-exporter, a cellagent per cell streaming heartbeats over gRPC, a
regional controller scoring cells and serving xDS, and Poisson traffic routed
by the weights the controller publishes. A live table refreshes every second;
Ctrl-C shuts everything down cleanly.

With --duration the lab runs headless for that long; --report writes the
figures as JSON.`,
		Example: `  isobar lab
  isobar lab --cells 5 --rps 8
  isobar lab --duration 30s --report lab.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("log-level") {
				// Keep the live view readable: only warnings unless asked.
				ro.logLevel = "warn"
			}
			log, err := ro.logger()
			if err != nil {
				return err
			}
			return lab.Run(cmd.Context(), cfg, lab.Deps{Logger: log, Out: ro.stdout})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Region, "region", "local", "region name")
	f.IntVar(&cfg.Cells, "cells", 3, "cells (simulated GPUs) in the region")
	f.Float64Var(&cfg.RPS, "rps", 3, "mean request rate of the Poisson traffic")
	f.IntVar(&cfg.MaxTokens, "max-tokens", 128, "output tokens per request")
	f.DurationVar(&cfg.Duration, "duration", 0, "run this long, then stop (0: until Ctrl-C)")
	f.StringVar(&cfg.Report, "report", "", "write the figures as JSON to this file when the run ends")
	f.BoolVar(&cfg.View, "view", false, "draw the live view even with --duration")
	f.StringVar(&cfg.Profile, "profile", "", "simulated engine timing profile (default 70b-awq)")
	f.Float64Var(&cfg.TimeScale, "time-scale", 1, "multiply every simulated duration (0.1 runs 10x faster)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 0, "cellagent heartbeat interval (default 500ms)")
	return cmd
}
