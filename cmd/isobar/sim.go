package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/sim"
)

// exitKilled is the status of a process killed by SIGKILL (128+9).
const exitKilled = 137

// newSimCmd builds `isobar sim engine` and `isobar sim dcgm`.
func newSimCmd(opts *rootOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulated vLLM engine and dcgm-exporter with fault injection",
		Long: `sim runs stand-ins for a vLLM engine and NVIDIA's dcgm-exporter, for
development, tests and the lab. The engine speaks the OpenAI completions and
chat API with SSE streaming, serves vLLM's /metrics, /health and /v1/models,
and follows a continuous-batching timing model.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newSimEngineCmd(opts), newSimDCGMCmd(opts))
	return cmd
}

func defaultHostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return sim.DefaultDCGMHostname
	}
	return h
}

func newSimEngineCmd(opts *rootOpts) *cobra.Command {
	var cfg sim.EngineProcessConfig
	cfg.Listen = sim.DefaultEngineListen
	cfg.DCGMListen = sim.DefaultDCGMListen
	cfg.Engine = sim.EngineConfig{
		Model:       sim.DefaultModel,
		MaxModelLen: sim.DefaultMaxModelLen,
		Profile:     sim.DefaultProfile,
		TimeScale:   1,
	}
	cfg.DCGM.Hostname = defaultHostname()
	cfg.DCGM.DriverVersion = sim.DefaultDCGMDriverVersion
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Run one simulated vLLM engine and its dcgm-exporter until SIGINT/SIGTERM",
		Long: `engine runs one simulated vLLM engine on --listen and a dcgm-exporter for its
GPU on --dcgm-listen ("" disables it). With --admin-listen and
--admin-token-file it also serves the fault-injection API
(POST/GET /admin/faults, Authorization: Bearer <token>) on a separate
listener that survives a kill.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Engine.Validate(); err != nil {
				return usageError{err}
			}
			if (cfg.AdminListen == "") != (cfg.AdminTokenFile == "") {
				return usageError{errors.New("--admin-listen and --admin-token-file go together")}
			}
			logger, err := opts.logger()
			if err != nil {
				return err
			}
			err = sim.RunEngine(cmd.Context(), cfg, sim.Deps{Logger: logger})
			if errors.Is(err, sim.ErrKilled) {
				fmt.Fprintln(opts.stderr, "isobar: sim engine killed")
				os.Exit(exitKilled)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "engine API listen address (host:port)")
	f.StringVar(&cfg.DCGMListen, "dcgm-listen", cfg.DCGMListen, `dcgm-exporter listen address; "" runs none`)
	f.StringVar(&cfg.AdminListen, "admin-listen", "", `fault-injection admin API listen address; "" disables it`)
	f.StringVar(&cfg.AdminTokenFile, "admin-token-file", "", fmt.Sprintf("file holding the admin bearer token (at least %d characters)", sim.MinAdminTokenLen))
	f.BoolVar(&cfg.ExitOnKill, "exit-on-kill", false, "make the kill fault exit the process with status 137")
	f.StringVar(&cfg.Engine.Model, "model", cfg.Engine.Model, "served model name")
	f.IntVar(&cfg.Engine.MaxModelLen, "max-model-len", cfg.Engine.MaxModelLen, "context length (prompt + max_tokens) accepted and advertised")
	f.StringVar(&cfg.Engine.Profile, "profile", cfg.Engine.Profile, fmt.Sprintf("timing profile, one of %v", sim.ProfileNames()))
	f.Float64Var(&cfg.Engine.TimeScale, "time-scale", cfg.Engine.TimeScale, "multiplies every model duration (0.05 runs 20x faster)")
	f.Int64Var(&cfg.Engine.Seed, "seed", 0, "seed of the engine's random choices and the default GPU UUID")
	f.IntVar(&cfg.Engine.GPUIndex, "gpu-index", 0, "index of the simulated GPU (dcgm label gpu)")
	f.StringVar(&cfg.Engine.GPUUUID, "gpu-uuid", "", "UUID of the simulated GPU (default derived from --seed and --gpu-index)")
	f.DurationVar(&cfg.Engine.StartupDelay, "startup-delay", 0, "time (model time) the engine stays Loading after start")
	f.StringVar(&cfg.DCGM.Hostname, "hostname", cfg.DCGM.Hostname, "dcgm-exporter Hostname label")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", sim.DefaultShutdownTimeout, "bound on the graceful shutdown")
	return cmd
}

func newSimDCGMCmd(opts *rootOpts) *cobra.Command {
	cfg := sim.DCGMProcessConfig{Listen: sim.DefaultDCGMListen, GPUs: 1}
	cfg.DCGM.Hostname = defaultHostname()
	cfg.DCGM.DriverVersion = sim.DefaultDCGMDriverVersion
	cmd := &cobra.Command{
		Use:   "dcgm",
		Short: "Run a dcgm-exporter serving idle synthetic GPUs until SIGINT/SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.GPUs < 1 || cfg.GPUs > 64 {
				return usageError{fmt.Errorf("--gpus %d: want 1-64", cfg.GPUs)}
			}
			logger, err := opts.logger()
			if err != nil {
				return err
			}
			return sim.RunDCGM(cmd.Context(), cfg, sim.Deps{Logger: logger})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "listen address (host:port)")
	f.IntVar(&cfg.GPUs, "gpus", cfg.GPUs, "number of GPUs served (1-64)")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed of the GPUs' UUIDs")
	f.StringVar(&cfg.DCGM.Hostname, "hostname", cfg.DCGM.Hostname, "Hostname label")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", sim.DefaultShutdownTimeout, "bound on the graceful shutdown")
	return cmd
}
