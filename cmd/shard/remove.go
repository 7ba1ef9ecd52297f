package main

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
)

func newRemoveCmd(a *app) *cobra.Command {
	var force bool
	cmd := eachSandbox(a, "remove [--force] SANDBOX...", "Remove sandboxes and their files (--force for running ones)",
		func(ctx context.Context, c *client.Client, id string) (any, error) {
			return map[string]string{"removed": id}, c.Remove(ctx, id, force)
		})
	cmd.Aliases = []string{"rm"}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "remove a running sandbox too")
	return cmd
}
