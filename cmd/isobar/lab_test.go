package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLabClassFlagsRefused: a bad --criticality-mix, --tenants or
// --residency exits 2 with a message naming the flag, before any lab
// starts.
func TestLabClassFlagsRefused(t *testing.T) {
	res := filepath.Join(t.TempDir(), "res.json")
	if err := os.WriteFile(res, []byte(`{"sets":{"eu":["eu-central"]},"tenants":{"acme":"eu"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--criticality-mix", "urgent=1"}, "--criticality-mix urgent"},
		{[]string{"--criticality-mix", "critical=-0.2,standard=1"}, "--criticality-mix critical"},
		{[]string{"--criticality-mix", "standard=0"}, "--criticality-mix"},
		{[]string{"--criticality-mix", "critical"}, "criticality-mix"},
		{[]string{"--tenants", "quiet=0"}, "--tenants quiet"},
		{[]string{"--tenants", "quiet=x"}, "--tenants quiet"},
		{[]string{"--residency", res}, "--residency"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"lab", "--duration", "1s"}, tc.args...), &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("lab %v: exit %d, stderr %q: want %d naming %q", tc.args, code, stderr.String(), exitUsage, tc.want)
		}
	}
}
