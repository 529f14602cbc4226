package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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
	cmd.AddCommand(newSimEngineCmd(opts), newSimDCGMCmd(opts), newSimSweepCmd(opts))
	return cmd
}

// engineFlags select a simulated engine's timing: a fitted profile by name
// (--profile) or the physics engine of a catalogue GPU and model (--gpu,
// --model, --tp, --kv-dtype).
type engineFlags struct {
	profile, gpu, model, kvDtype string
	tp                           int
	// servedModel is set where --model also names the served model (sim
	// engine): there --model alone does not select the physics engine.
	servedModel bool
}

// register adds --profile, --gpu, --tp and --kv-dtype, and --model unless
// servedModel is set (the caller registers it then, bound to model).
func (e *engineFlags) register(f *pflag.FlagSet, defaultProfile string) {
	f.StringVar(&e.profile, "profile", defaultProfile, fmt.Sprintf("fitted timing profile, one of %v (excludes --gpu)", sim.ProfileNames()))
	f.StringVar(&e.gpu, "gpu", "", fmt.Sprintf("physics engine: catalogue GPU, one of %v (needs --model)", sim.GPUNames()))
	if !e.servedModel {
		f.StringVar(&e.model, "model", "", fmt.Sprintf("physics engine: catalogue model, one of %v (needs --gpu)", sim.ModelNames()))
	}
	f.IntVar(&e.tp, "tp", 1, "physics engine: tensor-parallel degree (GPUs per engine)")
	f.StringVar(&e.kvDtype, "kv-dtype", "fp16", fmt.Sprintf("physics engine: KV-cache dtype, one of %v", sim.KVDtypeNames()))
}

// physics reports whether the flags select the physics engine.
func (e *engineFlags) physics(f *pflag.FlagSet) bool {
	return f.Changed("gpu") || (!e.servedModel && f.Changed("model")) || f.Changed("tp") || f.Changed("kv-dtype")
}

// resolve returns the selected profile. Every error is a usageError naming
// the flag at fault.
func (e *engineFlags) resolve(f *pflag.FlagSet) (sim.Profile, error) {
	if !e.physics(f) {
		p, err := sim.LookupProfile(e.profile)
		if err != nil {
			return sim.Profile{}, usageError{fmt.Errorf("--profile: %w", err)}
		}
		return p, nil
	}
	switch {
	case f.Changed("profile"):
		return sim.Profile{}, usageError{errors.New("--profile and --gpu/--model/--tp/--kv-dtype exclude each other: --profile selects a fitted profile, --gpu and --model the physics engine")}
	case e.gpu == "":
		return sim.Profile{}, usageError{fmt.Errorf("--gpu: the physics engine needs a GPU, one of %v", sim.GPUNames())}
	case e.model == "":
		return sim.Profile{}, usageError{fmt.Errorf("--model: the physics engine needs a catalogue model, one of %v", sim.ModelNames())}
	case e.tp < 1:
		return sim.Profile{}, usageError{fmt.Errorf("--tp %d: want >= 1", e.tp)}
	case e.kvDtype != "fp16" && e.kvDtype != "fp8":
		return sim.Profile{}, usageError{fmt.Errorf("--kv-dtype %q: want one of %v", e.kvDtype, sim.KVDtypeNames())}
	}
	p, err := sim.PhysicsProfile(e.spec())
	switch {
	case errors.Is(err, sim.ErrUnknownGPU):
		return sim.Profile{}, usageError{fmt.Errorf("--gpu: %w", err)}
	case errors.Is(err, sim.ErrUnknownModel):
		return sim.Profile{}, usageError{fmt.Errorf("--model: %w", err)}
	case err != nil:
		return sim.Profile{}, usageError{fmt.Errorf("--gpu/--model/--tp: %w", err)}
	}
	return p, nil
}

func (e *engineFlags) spec() sim.PhysicsSpec {
	return sim.PhysicsSpec{GPU: e.gpu, Model: e.model, TP: e.tp, KVDtype: e.kvDtype}
}

func defaultHostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return sim.DefaultDCGMHostname
	}
	return h
}

// simEngineOpts are the flags of `isobar sim engine`.
type simEngineOpts struct {
	cfg           sim.EngineProcessConfig
	ef            engineFlags
	served        string
	prefixCaching bool
}

func newSimEngineOpts() *simEngineOpts {
	o := &simEngineOpts{ef: engineFlags{servedModel: true}, prefixCaching: true}
	cfg := &o.cfg
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
	return o
}

func newSimEngineCmd(opts *rootOpts) *cobra.Command {
	o := newSimEngineOpts()
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Run one simulated vLLM engine and its dcgm-exporter until SIGINT/SIGTERM",
		Long: `engine runs one simulated vLLM engine on --listen and a dcgm-exporter for its
GPU on --dcgm-listen ("" disables it). With --admin-listen and
--admin-token-file it also serves the fault-injection API
(POST/GET /admin/faults, Authorization: Bearer <token>) on a separate
listener that survives a kill.

Timing: --profile selects a fitted profile (default 70b-awq). --gpu with
--model selects the physics engine instead: the roofline of a catalogue GPU
and model (see isobar sim sweep --help), with --tp GPUs per engine and the
--kv-dtype KV cache; the dcgm-exporter then reports the catalogue GPU.
Without --gpu, --model is only the served model name; with it, --model
names the catalogue model, which is also the served name unless
--served-model-name is given.

Automatic prefix caching is on, as in vLLM v1: a prompt's token ids come
from its text (one token per 4 bytes), and full 16-token blocks a previous
prompt computed are reused; vllm:prefix_cache_queries_total and
vllm:prefix_cache_hits_total count the prompt tokens looked up and found.
--enable-prefix-caching=false turns it off (vLLM's
--no-enable-prefix-caching).`,
		Example: `  isobar sim engine --listen 127.0.0.1:8000
  isobar sim engine --gpu rtx-pro-6000 --model llama-3.1-70b-awq
  isobar sim engine --gpu h100-sxm --model llama-3.3-70b-fp8 --tp 2 --kv-dtype fp8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd, opts) },
	}
	o.register(cmd.Flags())
	return cmd
}

func (o *simEngineOpts) run(cmd *cobra.Command, opts *rootOpts) error {
	f := cmd.Flags()
	if f.Changed("model") {
		o.ef.model = o.cfg.Engine.Model
	}
	if o.ef.physics(f) {
		p, err := o.ef.resolve(f)
		if err != nil {
			return err
		}
		o.cfg.Engine.CustomProfile = &p
		if !f.Changed("served-model-name") {
			o.served = o.ef.model
		}
	} else {
		if _, err := o.ef.resolve(f); err != nil {
			return err
		}
		o.cfg.Engine.Profile = o.ef.profile
	}
	if f.Changed("served-model-name") || o.cfg.Engine.CustomProfile != nil {
		o.cfg.Engine.Model = o.served
	}
	o.cfg.Engine.DisablePrefixCaching = !o.prefixCaching
	if err := o.cfg.Engine.Validate(); err != nil {
		return usageError{err}
	}
	if (o.cfg.AdminListen == "") != (o.cfg.AdminTokenFile == "") {
		return usageError{errors.New("--admin-listen and --admin-token-file go together")}
	}
	logger, err := opts.logger()
	if err != nil {
		return err
	}
	err = sim.RunEngine(cmd.Context(), o.cfg, sim.Deps{Logger: logger})
	if errors.Is(err, sim.ErrKilled) {
		// Deferred shutdown has run; the process ends as a killed
		// engine would.
		return exitStatusError{errors.New("sim engine killed"), exitKilled}
	}
	return err
}

func (o *simEngineOpts) register(f *pflag.FlagSet) {
	f.StringVar(&o.cfg.Listen, "listen", o.cfg.Listen, "engine API listen address (host:port)")
	f.StringVar(&o.cfg.DCGMListen, "dcgm-listen", o.cfg.DCGMListen, `dcgm-exporter listen address; "" runs none`)
	f.StringVar(&o.cfg.AdminListen, "admin-listen", "", `fault-injection admin API listen address; "" disables it`)
	f.StringVar(&o.cfg.AdminTokenFile, "admin-token-file", "", fmt.Sprintf("file holding the admin bearer token (at least %d characters)", sim.MinAdminTokenLen))
	f.BoolVar(&o.cfg.ExitOnKill, "exit-on-kill", false, "make the kill fault exit the process with status 137")
	f.StringVar(&o.cfg.Engine.Model, "model", o.cfg.Engine.Model, "served model name; with --gpu, the catalogue model of the physics engine")
	f.StringVar(&o.served, "served-model-name", "", "served model name (default: --model)")
	f.IntVar(&o.cfg.Engine.MaxModelLen, "max-model-len", o.cfg.Engine.MaxModelLen, "context length (prompt + max_tokens) accepted and advertised")
	o.ef.register(f, sim.DefaultProfile)
	f.Float64Var(&o.cfg.Engine.TimeScale, "time-scale", o.cfg.Engine.TimeScale, "multiplies every model duration (0.05 runs 20x faster)")
	f.Int64Var(&o.cfg.Engine.Seed, "seed", 0, "seed of the engine's random choices and the default GPU UUID")
	f.IntVar(&o.cfg.Engine.GPUIndex, "gpu-index", 0, "index of the simulated GPU (dcgm label gpu)")
	f.StringVar(&o.cfg.Engine.GPUUUID, "gpu-uuid", "", "UUID of the simulated GPU (default derived from --seed and --gpu-index)")
	f.DurationVar(&o.cfg.Engine.StartupDelay, "startup-delay", 0, "time (model time) the engine stays Loading after start")
	f.BoolVar(&o.prefixCaching, "enable-prefix-caching", true, "automatic prefix caching, on as in vLLM v1; =false turns it off (vLLM's --no-enable-prefix-caching)")
	f.StringVar(&o.cfg.DCGM.Hostname, "hostname", o.cfg.DCGM.Hostname, "dcgm-exporter Hostname label")
	f.DurationVar(&o.cfg.ShutdownTimeout, "shutdown-timeout", sim.DefaultShutdownTimeout, "bound on the graceful shutdown")
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
