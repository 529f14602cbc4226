package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/isobar-mesh/isobar/sim"
)

// sweepRowJSON is one row of `isobar sim sweep --output json`.
type sweepRowJSON struct {
	Concurrency        int     `json:"concurrency"`
	Requests           int     `json:"requests"`
	TTFTP50Ms          float64 `json:"ttft_p50_ms"`
	TTFTP95Ms          float64 `json:"ttft_p95_ms"`
	TTFTMeanMs         float64 `json:"ttft_mean_ms"`
	ITLP50Ms           float64 `json:"itl_p50_ms"`
	ITLP95Ms           float64 `json:"itl_p95_ms"`
	ITLMeanMs          float64 `json:"itl_mean_ms"`
	E2EP50Ms           float64 `json:"e2e_p50_ms"`
	E2EP95Ms           float64 `json:"e2e_p95_ms"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	RequestsPerSec     float64 `json:"requests_per_s"`
	Preemptions        int64   `json:"preemptions"`
}

// sweepJSON is the document `isobar sim sweep --output json` writes.
type sweepJSON struct {
	Profile          string         `json:"profile"`
	PromptTokens     int            `json:"prompt_tokens"`
	OutputTokens     int            `json:"output_tokens"`
	MaxNumSeqs       int            `json:"max_num_seqs"`
	MaxBatchedTokens int            `json:"max_num_batched_tokens"`
	KVCacheTokens    int            `json:"kv_cache_tokens"`
	Rows             []sweepRowJSON `json:"rows"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// simSweepOpts are the flags of `isobar sim sweep`.
type simSweepOpts struct {
	ef           engineFlags
	conc         []int
	prompt, out  int
	requests     int
	outputFormat string
}

func newSimSweepCmd(_ *rootOpts) *cobra.Command {
	o := &simSweepOpts{}
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Print one simulated engine's closed-loop load curve (TTFT, ITL, throughput per concurrency)",
		Long: `sweep runs one simulated engine against a closed loop of --concurrency
clients, like vllm bench serve --max-concurrency with an unlimited request
rate: every client sends a request of --prompt-tokens tokens that generates
--output-tokens tokens, waits for its last token and sends the next, until
--requests requests (default 40 per client) have been sent. It runs in
virtual time (seconds for a whole curve) and is deterministic. The figures
cover the second half of each run minus the last round, once the start
burst has settled; TTFT includes the fixed API-server latency; ITL is over
every inter-token gap (its mean is the per-request ITL NIM and genai-perf
report); throughput is concurrency ÷ mean end-to-end latency.

The engine is the physics engine of a catalogue GPU and model (--gpu,
--model, --tp, --kv-dtype): a roofline over the GPU's spec-sheet memory
bandwidth, dense tensor-core peak and link bandwidth, with efficiencies
fitted once to NVIDIA NIM's published Llama-3.3-70B FP8 curve on 2×H100,
vLLM's scheduler defaults for the GPU and a KV cache sized as vLLM sizes it.
--profile runs a fitted profile instead.`,
		Example: `  isobar sim sweep --gpu rtx-pro-6000 --model llama-3.1-70b-awq --concurrency 1,8,32,64,128 --prompt-tokens 512 --output-tokens 128
  isobar sim sweep --gpu h100-sxm --model llama-3.3-70b-fp8 --tp 2 --kv-dtype fp8 --concurrency 1,25,50,100 --prompt-tokens 5000 --output-tokens 500 --output json
  isobar sim sweep --profile 70b-awq --concurrency 1,4,12 --prompt-tokens 512 --output-tokens 128`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := o.check(cmd.Flags())
			if err != nil {
				return err
			}
			return o.run(cmd.OutOrStdout(), p)
		},
	}
	o.register(cmd.Flags())
	return cmd
}

// check refuses flag values no sweep could use and returns the profile.
func (o *simSweepOpts) check(f *pflag.FlagSet) (sim.Profile, error) {
	if !o.ef.physics(f) && !f.Changed("profile") {
		return sim.Profile{}, usageError{fmt.Errorf("--gpu and --model (the physics engine, GPUs %v, models %v) or --profile (one of %v) is required",
			sim.GPUNames(), sim.ModelNames(), sim.ProfileNames())}
	}
	p, err := o.ef.resolve(f)
	if err != nil {
		return sim.Profile{}, err
	}
	if len(o.conc) == 0 {
		return sim.Profile{}, usageError{errors.New("--concurrency: want a list of levels >= 1, e.g. 1,8,32")}
	}
	for _, c := range o.conc {
		if c < 1 || c > sim.MaxSweepConcurrency {
			return sim.Profile{}, usageError{fmt.Errorf("--concurrency %d: want levels of 1-%d", c, sim.MaxSweepConcurrency)}
		}
		if o.requests > 0 && o.requests < c {
			return sim.Profile{}, usageError{fmt.Errorf("--requests %d: want at least one per client (concurrency %d)", o.requests, c)}
		}
	}
	switch {
	case o.prompt < 1:
		return sim.Profile{}, usageError{fmt.Errorf("--prompt-tokens %d: want >= 1", o.prompt)}
	case o.out < 1:
		return sim.Profile{}, usageError{fmt.Errorf("--output-tokens %d: want >= 1", o.out)}
	case o.requests < 0 || o.requests > sim.MaxSweepRequests:
		return sim.Profile{}, usageError{fmt.Errorf("--requests %d: want 0-%d (0: 40 per client)", o.requests, sim.MaxSweepRequests)}
	case o.prompt+o.out > p.MaxContext():
		return sim.Profile{}, usageError{fmt.Errorf("--prompt-tokens + --output-tokens = %d exceed the context of %s (%d tokens)", o.prompt+o.out, p.Name, p.MaxContext())}
	case o.outputFormat != "table" && o.outputFormat != "json":
		return sim.Profile{}, usageError{fmt.Errorf("--output %q: want table or json", o.outputFormat)}
	}
	return p, nil
}

func (o *simSweepOpts) run(w io.Writer, p sim.Profile) error {
	rows, err := sim.Sweep(p, sim.SweepSpec{Concurrency: o.conc, PromptTokens: o.prompt, OutputTokens: o.out, Requests: o.requests})
	if err != nil {
		return err
	}
	doc := sweepJSON{Profile: p.Name, PromptTokens: o.prompt, OutputTokens: o.out,
		MaxNumSeqs: p.MaxNumSeqs, MaxBatchedTokens: p.MaxBatchedTokens, KVCacheTokens: p.KVCacheTokens}
	for _, r := range rows {
		doc.Rows = append(doc.Rows, sweepRowJSON{
			Concurrency: r.Concurrency, Requests: r.Requests,
			TTFTP50Ms: ms(r.TTFTP50), TTFTP95Ms: ms(r.TTFTP95), TTFTMeanMs: ms(r.TTFTMean),
			ITLP50Ms: ms(r.ITLP50), ITLP95Ms: ms(r.ITLP95), ITLMeanMs: ms(r.ITLMean),
			E2EP50Ms: ms(r.E2EP50), E2EP95Ms: ms(r.E2EP95),
			OutputTokensPerSec: r.OutputTokensPerSec, RequestsPerSec: r.RequestsPerSec,
			Preemptions: r.Preemptions,
		})
	}
	if o.outputFormat == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	return writeSweepTable(w, doc)
}

func (o *simSweepOpts) register(f *pflag.FlagSet) {
	o.ef.register(f, "")
	f.IntSliceVar(&o.conc, "concurrency", []int{1, 8, 32, 64, 128}, "comma-separated concurrency levels (clients)")
	f.IntVar(&o.prompt, "prompt-tokens", 512, "prompt tokens of every request")
	f.IntVar(&o.out, "output-tokens", 128, "output tokens of every request (generation runs to max_tokens)")
	f.IntVar(&o.requests, "requests", 0, "requests per concurrency level (0: 40 per client)")
	f.StringVar(&o.outputFormat, "output", "table", "table or json")
}

func writeSweepTable(w io.Writer, d sweepJSON) error {
	fmt.Fprintf(w, "%s, %d prompt / %d output tokens, max_num_seqs %d, max_num_batched_tokens %d, KV cache %d tokens\n\n",
		d.Profile, d.PromptTokens, d.OutputTokens, d.MaxNumSeqs, d.MaxBatchedTokens, d.KVCacheTokens)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "concurrency\tTTFT p50 ms\tTTFT p95 ms\tITL p50 ms\tITL mean ms\tE2E p50 ms\toutput tok/s\treq/s\tpreemptions\t")
	for _, r := range d.Rows {
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.1f\t%.1f\t%.0f\t%.0f\t%.2f\t%d\t\n",
			r.Concurrency, r.TTFTP50Ms, r.TTFTP95Ms, r.ITLP50Ms, r.ITLMeanMs, r.E2EP50Ms, r.OutputTokensPerSec, r.RequestsPerSec, r.Preemptions)
	}
	return tw.Flush()
}
