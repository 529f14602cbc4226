package main

import "github.com/spf13/cobra"

// newSimCmd is a placeholder until the sim role is wired.
func newSimCmd(_ *rootOpts) *cobra.Command {
	return &cobra.Command{Use: "sim", Short: "sim (not wired yet)"}
}
