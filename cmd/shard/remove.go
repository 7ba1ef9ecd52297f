package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newRemoveCmd(a *app) *cobra.Command {
	var o client.RemoveOptions
	cmd := eachSandbox(a, "remove [--force] [--checkpoints] SANDBOX...", "Remove sandboxes and their files (--force for running ones)",
		func(ctx context.Context, c *client.Client, id string) (any, error) {
			res, err := c.RemoveWith(ctx, id, o)
			if err == nil && len(res.Checkpoints) > 0 && !a.json {
				termsafe.Fprintf(os.Stderr, "%s: %d checkpoint(s) removed with it, %s freed\n", id, len(res.Checkpoints), humanSize(res.FreedBytes))
			}
			return res, err
		})
	cmd.Aliases = []string{"rm"}
	cmd.Long = `Remove sandboxes and their files. A running sandbox needs --force.

Forks' checkpoints that no sandbox needs any more go with it (see shard fork
--help). --checkpoints also removes the checkpoints of the sandbox's ledger
session (those taken with shard checkpoint, its forks', kept ones); if
another sandbox's resume starts from one, or an environment is made of one,
nothing is removed (checkpoint_in_use). The ledger session stays: shard
ledger rm removes it.`
	cmd.Example = `  shard rm --force base
  shard rm --checkpoints old-base`
	cmd.Flags().BoolVarP(&o.Force, "force", "f", false, "remove a running sandbox too")
	cmd.Flags().BoolVar(&o.Checkpoints, "checkpoints", false, "also remove the checkpoints of its ledger session (refused if another sandbox needs one)")
	return cmd
}
