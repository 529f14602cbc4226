package main

import "github.com/spf13/cobra"

// newRegionalCmd is a placeholder until the regional role is wired.
func newRegionalCmd(_ *rootOpts) *cobra.Command {
	return &cobra.Command{Use: "regional", Short: "regional (not wired yet)"}
}
