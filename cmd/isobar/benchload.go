package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/bench/load"
)

type benchLoadFlags struct {
	cfg         load.Config
	class       string
	ndjson      string
	report      string
	quiet, list bool
}

func newBenchLoadCmd(ro *rootOpts) *cobra.Command {
	var f benchLoadFlags
	cmd := &cobra.Command{
		Use:   "load --url URL --rps N [--class NAME]",
		Short: "Drive OpenAI-compatible load and measure it at the client",
		Long: `load sends streaming completions to --url (an isobar gateway, an Envoy
listener, a vLLM engine) at --rps, with constant or Poisson arrivals, shaped
by one of the evaluation's workload classes (--list shows them), for
--duration or --max-requests, whichever ends first. TTFT is measured at the
client, from the request's start to its first streamed token.

--ndjson writes one JSON line per request (seq, class, start, ttft_ms, end,
e2e_ms, status, ok, endpoint, region, prompt_tokens, output_tokens, error);
the summary (success, TTFT and end-to-end P50/P95/P99 over the window after
--warmup and before --cooldown) is printed as a table and, with --report,
written as JSON. The same --seed sends the same requests at the same
offsets, whatever the server does.

Prompts are random words, 4 bytes per token by the estimate isobar's data
plane and simulator use, drawn per content segment: the turns of a
multiturn conversation, the questions about one rag_multidoc document and a
tenant_prompts tenant's requests share their text as a prefix (as a prefix
cache would see it), and nothing else does. The prompt length is also sent
in the x-isobar-prompt-tokens header.`,
		Example: `  isobar bench load --url http://127.0.0.1:8080 --rps 10 --duration 60s
  isobar bench load --url http://127.0.0.1:8000 --class long_context --rps 2 --arrival constant \
      --ndjson requests.ndjson --report summary.json
  isobar bench load --list`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchLoad(cmd, ro, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cfg.URL, "url", "", "base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8080 (required)")
	fl.StringVar(&f.cfg.Model, "model", "", "model to request (default: the first of URL/v1/models)")
	fl.StringVar(&f.class, "class", "baseline_mixed", "workload class (see --list)")
	fl.Float64Var(&f.cfg.RPS, "rps", 10, "steady arrival rate, requests per second")
	fl.StringVar(&f.cfg.Arrival, "arrival", load.ArrivalPoisson, "arrival process: constant or poisson")
	fl.DurationVar(&f.cfg.Duration, "duration", time.Minute, "how long to send")
	fl.IntVar(&f.cfg.MaxRequests, "max-requests", 100_000, "stop sending after this many requests")
	fl.DurationVar(&f.cfg.Warmup, "warmup", 0, "leave requests started in this first stretch out of the summary")
	fl.DurationVar(&f.cfg.Cooldown, "cooldown", 0, "leave requests started in this last stretch out of the summary")
	fl.Uint64Var(&f.cfg.Seed, "seed", 1, "seed of arrivals and prompt lengths")
	fl.DurationVar(&f.cfg.Timeout, "timeout", 2*time.Minute, "timeout per request")
	fl.IntVar(&f.cfg.MaxInFlight, "max-in-flight", 1024, "most requests in flight; arrivals beyond are counted as client-shed")
	fl.IntVar(&f.cfg.MaxOutput, "max-tokens", 0, "output tokens per request (default: the class's)")
	fl.BoolVar(&f.cfg.Chat, "chat", false, "send /v1/chat/completions instead of /v1/completions")
	fl.StringVar(&f.ndjson, "ndjson", "", "write one JSON line per request to this file (- for stdout)")
	fl.StringVar(&f.report, "report", "", "write the summary as JSON to this file")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar")
	fl.BoolVar(&f.list, "list", false, "list the workload classes and exit")
	return cmd
}

func runBenchLoad(cmd *cobra.Command, ro *rootOpts, f *benchLoadFlags) error {
	out := cmd.OutOrStdout()
	if f.list {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CLASS\tTIER-2 SLO (P95 TTFT)\tSHAPE")
		for _, c := range load.Classes() {
			fmt.Fprintf(tw, "%s\t%v\t%s\n", c.Name, c.SLO, c.Summary)
		}
		return tw.Flush()
	}
	c, err := load.LookupClass(f.class)
	if err != nil {
		return usageError{fmt.Errorf("--class: %w", err)}
	}
	f.cfg.Class = c
	if f.cfg.URL == "" {
		return usageError{errors.New("--url is required: the base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8080")}
	}
	if f.cfg.Duration <= 0 || f.cfg.MaxRequests <= 0 || f.cfg.MaxInFlight <= 0 || f.cfg.Timeout <= 0 {
		return usageError{errors.New("--duration, --max-requests, --max-in-flight and --timeout must be > 0")}
	}
	ctx := cmd.Context()
	if f.cfg.Model == "" {
		m, err := firstModel(ctx, f.cfg.URL)
		if err != nil {
			return fmt.Errorf("--model not given and %w", err)
		}
		f.cfg.Model = m
	}
	if err := f.cfg.Validate(); err != nil {
		return usageError{flagNames(err)}
	}
	summaryOut := out
	deps := load.Deps{}
	if f.ndjson != "" {
		var w io.Writer = out
		if f.ndjson != "-" {
			file, err := os.Create(f.ndjson)
			if err != nil {
				return fmt.Errorf("--ndjson: %w", err)
			}
			defer file.Close()
			w = file
		} else {
			summaryOut = ro.stderr
		}
		enc := json.NewEncoder(w)
		var werr error
		deps.OnRecord = func(r load.Record) {
			if werr == nil {
				werr = enc.Encode(r)
			}
		}
		defer func() {
			if werr != nil {
				fmt.Fprintf(ro.stderr, "isobar: --ndjson: %v\n", werr)
			}
		}()
	}
	if !f.quiet {
		deps.Progress = ro.stderr
	}
	res, err := load.Run(ctx, f.cfg, deps)
	if err != nil {
		return err
	}
	writeLoadSummary(summaryOut, res.Summary)
	if f.report != "" {
		b, _ := json.MarshalIndent(res.Summary, "", "  ")
		if err := os.WriteFile(f.report, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("--report: %w", err)
		}
	}
	return nil
}

// flagNames rewrites load.Config field names in err as the flags that set
// them.
func flagNames(err error) error {
	r := strings.NewReplacer("URL ", "--url ", "Model ", "--model ", "RPS ", "--rps ", "Arrival ", "--arrival ",
		"Duration ", "--duration ", "MaxRequests ", "--max-requests ", "Warmup ", "--warmup ", "Cooldown ", "--cooldown ",
		"Timeout ", "--timeout ", "MaxInFlight ", "--max-in-flight ", "MaxOutput ", "--max-tokens ")
	return errors.New(r.Replace(err.Error()))
}

// firstModel asks base/v1/models for the first model id.
func firstModel(ctx context.Context, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u := strings.TrimRight(base, "/") + "/v1/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", fmt.Errorf("cannot ask %s: %w", u, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("cannot ask %s: %w", u, err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s answered HTTP %d", u, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil || len(body.Data) == 0 || body.Data[0].ID == "" {
		return "", fmt.Errorf("%s lists no model (%v): give --model", u, err)
	}
	return body.Data[0].ID, nil
}

func writeLoadSummary(w io.Writer, s load.Summary) {
	pct := func(p *load.Percentiles) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f / %.0f", p.P50, p.P95, p.P99)
	}
	succ := "-"
	if s.Success != nil {
		succ = fmt.Sprintf("%.4f", *s.Success)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "class\t%s (%s, %g RPS, seed %d)\n", s.Class, s.Arrival, s.RPS, s.Seed)
	fmt.Fprintf(tw, "requests\t%d in %.1f s (%.2f RPS), %d succeeded, %d client-shed\n", s.Requests, s.WindowS, s.AchievedRPS, s.Succeeded, s.ClientShed)
	fmt.Fprintf(tw, "success\t%s\n", succ)
	fmt.Fprintf(tw, "TTFT ms p50 / p95 / p99\t%s\n", pct(s.TTFTms))
	fmt.Fprintf(tw, "E2E ms p50 / p95 / p99\t%s\n", pct(s.E2Ems))
	fmt.Fprintf(tw, "statuses\t%v\n", s.Statuses)
	_ = tw.Flush()
}
