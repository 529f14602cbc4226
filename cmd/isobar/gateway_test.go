package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --lb takes xds, rr, lr and isobar; anything else is a usage error naming
// the choices, and the help names every mode.
func TestGatewayLBFlag(t *testing.T) {
	base := []string{"gateway", "--insecure", "--controller", "127.0.0.1:1", "--region", "r1"}
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr; exit code 2
	}{
		{"unknown mode", []string{"--lb", "weighted-random"}, "use xds, rr, lr or isobar"},
		// A valid mode gets past the LB check to the next field's error,
		// so that nothing is started.
		{"isobar accepted", []string{"--lb", "isobar", "--max-inflight-per-endpoint", "-1"}, "MaxInflightPerEndpoint"},
		{"xds accepted", []string{"--lb", "xds", "--max-inflight-per-endpoint", "-1"}, "MaxInflightPerEndpoint"},
		{"negative decode cost", []string{"--lb", "isobar", "--isobar-decode-cost", "-1ms"}, "isobar-decode-cost"},
		{"decode cost accepted", []string{"--lb", "isobar", "--isobar-decode-cost", "20ms", "--max-inflight-per-endpoint", "-1"}, "MaxInflightPerEndpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append(append([]string(nil), base...), tc.args...), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"gateway", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, mode := range []string{"xds (as Envoy would", "isobar (least expected time to first token)", "rr (Envoy round-robin", "lr (Envoy least-request"} {
		if !strings.Contains(stdout.String(), mode) {
			t.Errorf("gateway --help does not describe --lb %s", mode)
		}
	}
}

// --hop-key-file must hold at least 32 bytes, taken as they are (a binary
// key is not trimmed); --xds-max-cells and --max-inflight want >= 1.
func TestGatewayBoundsAndHopKeyFlags(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("too short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// 31 bytes and a trailing space: trimming would make it too short.
	spaced := filepath.Join(dir, "spaced.key")
	if err := os.WriteFile(spaced, []byte(strings.Repeat("k", 31)+" "), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"gateway", "--insecure", "--controller", "127.0.0.1:1", "--region", "r1"}
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr; exit code 2
	}{
		{"short hop key", []string{"--hop-key-file", short}, "holds 10 bytes; write at least 32"},
		// A key that passes gets to the next field's error: nothing starts.
		{"hop key kept whole", []string{"--hop-key-file", spaced, "--max-inflight-per-endpoint", "-1"}, "MaxInflightPerEndpoint"},
		{"xds max cells", []string{"--xds-max-cells", "0"}, "--xds-max-cells 0"},
		{"max inflight", []string{"--max-inflight", "-1"}, "MaxInflightRequests -1"},
		{"read header above read", []string{"--read-timeout", "1s", "--read-header-timeout", "2s"}, "ReadHeaderTimeout 2s is above ReadTimeout 1s"},
		// A short --read-timeout alone shortens the header timeout with it.
		{"read timeout alone", []string{"--read-timeout", "1s", "--max-inflight-per-endpoint", "-1"}, "MaxInflightPerEndpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append(append([]string(nil), base...), tc.args...), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}
