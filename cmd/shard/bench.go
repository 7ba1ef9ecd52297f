package main

import "github.com/spf13/cobra"

func newBenchCmd(a *app) *cobra.Command {
	return &cobra.Command{Use: "bench", Short: "Measure shard against the raw runtime", Hidden: true}
}
