package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The class, residency and queue flags: bad values are usage errors naming
// the flag; good ones get past to the next field's error (nothing starts).
func TestGatewayClassFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "residency.json")
	if err := os.WriteFile(good, []byte(`{"sets": {"eu": ["eu-west"]}, "tenants": {"acme-eu": "eu"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"sets": {"eu": ["eu-west"]}, "tenants": {"acme-eu": "nowhere"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"gateway", "--insecure", "--controller", "127.0.0.1:1", "--region", "r1"}
	next := []string{"--max-inflight-per-endpoint", "-1"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad trusted source", []string{"--trusted-sources", "10.0.0.0/99"}, "--trusted-sources"},
		{"trusted sources accepted", append([]string{"--trusted-sources", "10.0.0.0/8,127.0.0.1"}, next...), "MaxInflightPerEndpoint"},
		{"bad objective", []string{"--objective-priority", "chat=high"}, "--objective-priority"},
		{"objectives accepted", append([]string{"--objective-priority", "chat=1,batch=-1"}, next...), "MaxInflightPerEndpoint"},
		{"missing residency", []string{"--residency", filepath.Join(dir, "none.json")}, "--residency"},
		{"bad residency", []string{"--residency", bad}, "--residency"},
		{"residency accepted", append([]string{"--residency", good}, next...), "MaxInflightPerEndpoint"},
		{"bad queue length", []string{"--queue-length", "urgent=3"}, "--queue-length"},
		{"bad queue age", []string{"--queue-max-age", "critical=0s"}, "--queue-max-age"},
		{"bad queue total", []string{"--queue-total", "-2"}, "--queue-total"},
		{"queue accepted", append([]string{"--queue-length", "critical=10", "--queue-max-age", "sheddable=500ms", "--queue-total", "20"}, next...), "MaxInflightPerEndpoint"},
		{"bad newest first", []string{"--queue-newest-first", "urgent"}, "--queue-newest-first"},
		{"bad objective class", []string{"--queue-objective", "standard,standard"}, "--queue-objective"},
		{"queue policy accepted", append([]string{"--queue-newest-first", "none", "--queue-objective", "sheddable", "--queue-no-yield"}, next...), "MaxInflightPerEndpoint"},
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
