package main

import (
	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newRestoreCmd(a *app) *cobra.Command {
	var req client.RestoreRequest
	cmd := &cobra.Command{
		Use:   "restore [--name NAME] CHECKPOINT",
		Short: "Start a new sandbox from a checkpoint; prints its id",
		Long: `Restore a checkpoint into a new running sandbox (the API's restoreCheckpoint):
its memory, processes and files as they were at the checkpoint, its bounds
and image. The sandbox gets a new id, name and address, and its own ledger
session with a clean exec history: nothing is replayed.

Compare 'shard resume SESSION', which starts from a session's latest
checkpoint and then runs again the execs the ledger recorded after it.`,
		Example: `  shard checkpoint ls base
  shard restore --name base-again 7c1e0a9b4f2d`,
		Args: exactArgs(1, "a CHECKPOINT id (shard checkpoint ls lists them)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.RestoreCheckpoint(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(sb)
			}
			termsafe.Println(sb.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Name, "name", "", "name of the new sandbox (unique); default: its id")
	cmd.Flags().BoolVar(&a.json, "json", false, "print the sandbox as JSON instead of its id")
	return cmd
}
