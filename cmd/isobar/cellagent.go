package main

import "github.com/spf13/cobra"

// newCellagentCmd is a placeholder until the cellagent role is wired.
func newCellagentCmd(_ *rootOpts) *cobra.Command {
	return &cobra.Command{Use: "cellagent", Short: "cellagent (not wired yet)"}
}
