package main

import (
	"context"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
)

func newSnapshotCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Save a stopped sandbox's files to start new sandboxes from: create, ls, inspect, rm",
		Long: `A snapshot is the files of a STOPPED sandbox, kept under an id and an
optional name. 'shard create --from-snapshot SNAPSHOT' starts new sandboxes
from it, each with its own copy of those files (and the snapshot's image and
environment). A snapshot has no memory and no processes: to copy a running
sandbox with its memory, use 'shard fork', or 'shard checkpoint' and
'shard restore'.`,
		Example: `  shard stop base
  shard snapshot create --name base-v1 base
  shard create --from-snapshot base-v1 --name work
  shard snapshot ls`,
	}
	var name string
	create := &cobra.Command{
		Use:   "create [--name NAME] SANDBOX",
		Short: "Snapshot a stopped sandbox's files; prints the snapshot's id",
		Long: `Save the files of a stopped sandbox (stop it first: a running one is refused
with sandbox_running). The sandbox itself is not changed.`,
		Example: `  shard snapshot create --name base-v1 base`,
		Args:    exactArgs(1, "a SANDBOX (id or name), stopped"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			snap, err := c.CreateSnapshot(cmd.Context(), client.SnapshotRequest{Sandbox: args[0], Name: name})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(snap)
			}
			termsafe.Println(snap.ID)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "name of the snapshot (unique)")
	create.Flags().BoolVar(&a.json, "json", false, "print the snapshot as JSON instead of its id")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List snapshots",
		Example: `  shard snapshot ls`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			snaps, err := c.Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(snaps)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "ID\tNAME\tSANDBOX\tIMAGE\tDISK\tSIZE\tCREATED\n")
			for _, s := range snaps {
				termsafe.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, dash(s.Name), dash(s.SandboxName), s.Image,
					units.FormatSize(s.DiskBytes), humanSize(s.Size), ago(s.CreatedAt))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")

	inspect := inspectCmd(a, "inspect SNAPSHOT", "Show a snapshot (id or name) as JSON", `  shard snapshot inspect base-v1`, "a SNAPSHOT (id or name)",
		func(ctx context.Context, c *client.Client, id string) (any, error) { return c.GetSnapshot(ctx, id) })

	rm := eachArg(a, "rm SNAPSHOT...", "Remove snapshots", "one or more SNAPSHOT (id or name)",
		func(ctx context.Context, c *client.Client, id string) (any, error) {
			return map[string]string{"removed": id}, c.RemoveSnapshot(ctx, id)
		})
	rm.Aliases = []string{"remove"}
	rm.Example = `  shard snapshot rm base-v1`

	cmd.AddCommand(create, ls, inspect, rm)
	return cmd
}
