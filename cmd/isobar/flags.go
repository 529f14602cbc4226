package main

import "github.com/spf13/pflag"

// Flag names every command spells the same way.
const (
	// metricsListenFlag is the address a long-running command serves its
	// /metrics (and, for controllers, debug pages) on.
	metricsListenFlag = "metrics-listen"
	// oldHTTPListenFlag is metricsListenFlag's old spelling on regional
	// and global, kept working as a deprecated alias.
	oldHTTPListenFlag = "http-listen"
)

// deprecatedAlias registers old as a second name of the already
// registered flag name, bound to the same value: it keeps working, prints
// a deprecation notice when used, and is hidden from --help.
func deprecatedAlias(f *pflag.FlagSet, old, name string) {
	nf := f.Lookup(name)
	f.AddFlag(&pflag.Flag{Name: old, Usage: nf.Usage, Value: nf.Value, DefValue: nf.DefValue})
	_ = f.MarkDeprecated(old, "use --"+name)
}
