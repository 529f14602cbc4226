package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func runSimCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"sim"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestSimSweepJSON(t *testing.T) {
	t.Parallel()
	code, out, errOut := runSimCLI(t, "sweep", "--gpu", "h100-sxm", "--model", "llama-3.1-8b",
		"--concurrency", "1,4,16", "--prompt-tokens", "300", "--output-tokens", "32", "--output", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Profile string                       `json:"profile"`
		Rows    []map[string]json.RawMessage `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if doc.Profile != "h100-sxm/llama-3.1-8b/tp1/kv-fp16" || len(doc.Rows) != 3 {
		t.Fatalf("profile %q, %d rows: %s", doc.Profile, len(doc.Rows), out)
	}
	prevTput := 0.0
	for i, row := range doc.Rows {
		vals := map[string]float64{}
		for _, k := range []string{"concurrency", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "e2e_p50_ms", "output_tokens_per_s", "requests_per_s"} {
			raw, ok := row[k]
			if !ok {
				t.Fatalf("row %d lacks %q: %s", i, k, out)
			}
			var v float64
			if err := json.Unmarshal(raw, &v); err != nil || v <= 0 {
				t.Fatalf("row %d: %s = %s, want a positive number", i, k, raw)
			}
			vals[k] = v
		}
		if want := []float64{1, 4, 16}[i]; vals["concurrency"] != want {
			t.Errorf("row %d: concurrency %v, want %v", i, vals["concurrency"], want)
		}
		if vals["ttft_p95_ms"] < vals["ttft_p50_ms"] || vals["e2e_p50_ms"] < vals["ttft_p50_ms"] {
			t.Errorf("row %d: percentiles out of order: %v", i, vals)
		}
		if got := vals["output_tokens_per_s"] / vals["requests_per_s"]; got < 31.9 || got > 32.1 {
			t.Errorf("row %d: %v output tokens per request, want 32", i, got)
		}
		if vals["output_tokens_per_s"] <= prevTput {
			t.Errorf("row %d: throughput %v not above the lower concurrency's %v", i, vals["output_tokens_per_s"], prevTput)
		}
		prevTput = vals["output_tokens_per_s"]
	}
}

func TestSimSweepTableAndProfile(t *testing.T) {
	t.Parallel()
	code, out, errOut := runSimCLI(t, "sweep", "--profile", "70b-awq", "--concurrency", "1,12", "--prompt-tokens", "512", "--output-tokens", "16")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"70b-awq,", "concurrency", "TTFT p50 ms", "ITL mean ms", "output tok/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(strings.TrimSpace(out), "\n"); n != 4 {
		t.Errorf("table has %d lines after the title, want header + 2 rows:\n%s", n, out)
	}
}

func TestSimSweepHelp(t *testing.T) {
	t.Parallel()
	code, out, errOut := runSimCLI(t, "sweep", "--help")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"--concurrency", "--gpu", "--model", "--tp", "--kv-dtype", "--profile", "--prompt-tokens",
		"--output-tokens", "--requests", "--output", "rtx-pro-6000", "llama-3.3-70b-fp8", "closed loop"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestSimSweepUsageErrors(t *testing.T) {
	t.Parallel()
	ok := []string{"--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--prompt-tokens", "10", "--output-tokens", "10", "--concurrency", "1"}
	with := func(extra ...string) []string { return append(append([]string{"sweep"}, ok...), extra...) }
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"sweep"}, []string{"--gpu", "--profile"}},
		{[]string{"sweep", "--model", "llama-3.1-8b"}, []string{"--gpu", "rtx-pro-6000"}},
		{[]string{"sweep", "--gpu", "h100-sxm"}, []string{"--model", "llama-3.1-70b-awq"}},
		{with("--gpu", "b300"), []string{"--gpu", "unknown GPU", "a100-80gb", "h200-sxm"}},
		{with("--model", "gpt-9"), []string{"--model", "unknown model", "llama-3.3-70b-fp8"}},
		{[]string{"sweep", "--profile", "nope"}, []string{"--profile", "70b-awq-flat"}},
		{with("--profile", "70b-awq"), []string{"--profile", "exclude"}},
		{with("--concurrency", "0"), []string{"--concurrency 0"}},
		{with("--concurrency", "4,-2"), []string{"--concurrency -2"}},
		{with("--concurrency", "100000000"), []string{"--concurrency 100000000"}},
		{with("--requests", "1000000000"), []string{"--requests"}},
		{with("--concurrency", "one"), []string{"concurrency"}},
		{with("--concurrency", ""), []string{"--concurrency"}},
		{with("--prompt-tokens", "many"), []string{"prompt-tokens"}},
		{with("--prompt-tokens", "0"), []string{"--prompt-tokens"}},
		{with("--output-tokens", "-5"), []string{"--output-tokens"}},
		{with("--prompt-tokens", "131000", "--output-tokens", "1000"), []string{"--prompt-tokens", "131072"}},
		{with("--tp", "0"), []string{"--tp 0"}},
		{with("--tp", "two"), []string{"tp"}},
		{with("--kv-dtype", "int8"), []string{"--kv-dtype", "fp8"}},
		{with("--requests", "-1"), []string{"--requests"}},
		{with("--requests", "2", "--concurrency", "8"), []string{"--requests"}},
		{with("--output", "xml"), []string{"--output"}},
		{[]string{"sweep", "--gpu", "h100-sxm", "--model", "llama-3.3-70b-fp8"}, []string{"does not fit", "--tp"}},
		{with("extra"), []string{"unknown command"}},
	} {
		code, _, errOut := runSimCLI(t, tc.args...)
		if code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", tc.args, code, errOut)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr %q does not name %q", tc.args, errOut, w)
			}
		}
	}
}

func TestSimEngineEngineFlagErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"engine", "--gpu", "nope", "--model", "llama-3.1-8b"}, "--gpu"},
		{[]string{"engine", "--gpu", "h100-sxm"}, "--model"},
		{[]string{"engine", "--gpu", "h100-sxm", "--model", "served-name"}, "--model"},
		{[]string{"engine", "--profile", "tiny", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"}, "--profile"},
		{[]string{"engine", "--profile", "nope"}, "--profile"},
		{[]string{"engine", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--kv-dtype", "fp4"}, "--kv-dtype"},
		{[]string{"engine", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--tp", "-1"}, "--tp"},
		{[]string{"engine", "--tp", "2"}, "--gpu"},
	} {
		code, _, errOut := runSimCLI(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := runSimCLI(t, "engine", "--help")
	for _, want := range []string{"--gpu", "--served-model-name", "--kv-dtype", "physics engine", "--enable-prefix-caching"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("engine --help (exit %d) lacks %q", code, want)
		}
	}
}

func TestLabEngineFlagErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lab", "--gpu", "nope", "--model", "llama-3.1-8b"}, "--gpu"},
		{[]string{"lab", "--gpu", "h100-sxm"}, "--model"},
		{[]string{"lab", "--profile", "tiny", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"}, "--profile"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
