package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// isobar regional's endpoint-binding flags are documented in --help and
// refused at once when inconsistent, with the fix in the message (before
// any listener is opened).
func TestRegionalEndpointBindingFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"regional", "--help"}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "--endpoint-binding") || !strings.Contains(stdout.String(), "--endpoint-map-file") {
		t.Fatalf("--help: exit %d, missing the endpoint-binding flags:\n%s", code, stdout.String())
	}
	badMap := filepath.Join(t.TempDir(), "map")
	if err := os.WriteFile(badMap, []byte("gpu-* 10.0.0.0/33\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"regional", "--region", "r1", "--listen", "127.0.0.1:1", "--metrics-listen", "-", "--insecure"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"san without mTLS", []string{"--endpoint-binding", "san"}, "needs mTLS"},
		{"unknown mode", []string{"--endpoint-binding", "strict"}, "want one of"},
		{"bad map file", []string{"--endpoint-binding", "mapping", "--endpoint-map-file", badMap}, "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append(append([]string(nil), base...), tc.args...), &stdout, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want a refusal mentioning %q", code, stderr.String(), tc.want)
			}
		})
	}
}
