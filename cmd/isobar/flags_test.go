package main

import (
	"io"
	"testing"
)

// TestDeprecatedFlagSpellings: the old spellings still set the value the
// new flag sets.
func TestDeprecatedFlagSpellings(t *testing.T) {
	ro := &rootOpts{stdout: io.Discard, stderr: io.Discard}
	for _, tc := range []struct {
		cmd       func() (set func([]string) error, get func() string)
		old, want string
	}{
		{func() (func([]string) error, func() string) {
			c := newRegionalCmd(ro)
			return c.Flags().Parse, func() string { return c.Flags().Lookup(metricsListenFlag).Value.String() }
		}, "--http-listen", "127.0.0.1:7"},
		{func() (func([]string) error, func() string) {
			c := newGlobalCmd(ro)
			return c.Flags().Parse, func() string { return c.Flags().Lookup(metricsListenFlag).Value.String() }
		}, "--http-listen", "127.0.0.1:7"},
		{func() (func([]string) error, func() string) {
			c := newStatusCmd(ro)
			return c.Flags().Parse, func() string { return c.Flags().Lookup(statusDebugAddrFlag).Value.String() }
		}, "--controller", "[127.0.0.1:7]"},
	} {
		parse, get := tc.cmd()
		if err := parse([]string{tc.old, "127.0.0.1:7"}); err != nil {
			t.Fatalf("%s: %v", tc.old, err)
		}
		if got := get(); got != tc.want {
			t.Errorf("%s 127.0.0.1:7: new flag reads %q, want %q", tc.old, got, tc.want)
		}
	}
}
