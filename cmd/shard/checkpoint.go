package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newCheckpointCmd(a *app) *cobra.Command {
	var req client.CheckpointRequest
	cmd := &cobra.Command{
		Use:     "checkpoint [--tag TAG] SANDBOX",
		Aliases: []string{"checkpoints"},
		Short:   "Save a running sandbox's memory, processes and files; prints the checkpoint id",
		Long: `Checkpoint a running sandbox without stopping it: its memory, its processes
and its files, from one instant. The sandbox freezes for a moment while they
are captured (an exec that starts then is refused with sandbox_frozen: run it
again), then carries on. The sandbox's ledger session gets a
sandbox.checkpoint_created event (with --tag).

'shard restore CHECKPOINT' starts a new sandbox from a checkpoint; 'shard
resume SESSION' starts from the session's latest checkpoint and replays the
execs recorded after it. Checkpoint needs a provider that can (shard
capabilities).`,
		Example: `  shard checkpoint --tag deps-installed base
  shard checkpoint ls base
  shard restore --name base-again 7c1e0a9b4f2d`,
		Args: exactArgs(1, "a running SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tagFlag(req.Tag); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ck, err := c.Checkpoint(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(ck)
			}
			termsafe.Println(ck.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Tag, "tag", "", "tag stored with the checkpoint and its ledger event: letters, digits, '_', '.', '-', at most 128")
	cmd.Flags().BoolVar(&a.json, "json", false, "print the checkpoint as JSON instead of its id")

	ls := &cobra.Command{
		Use:     "ls [SANDBOX|SESSION]",
		Aliases: []string{"list"},
		Short:   "List checkpoints: all, or one sandbox's or ledger session's",
		Long: `List checkpoints: every one on the server (taken with shard checkpoint, by
forks, and the environments'), or with an argument those of one sandbox (id
or name) or of one ledger session, also after its sandbox was removed.

SIZE is what each holds on the host's disk (its memory image and its copy of
the files). KEPT says how long it stays: "yes" until removed by hand (shard
checkpoint rm, shard rm --checkpoints): those taken with shard checkpoint,
environments', forks' made with --keep-checkpoint; "while used" for a fork's
checkpoint, removed once no sandbox's resume starts from it (the source's,
until it checkpoints or forks again; each fork's and each restore's from it,
until they checkpoint or fork themselves).`,
		Example: `  shard checkpoint ls
  shard checkpoint ls base`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return fmt.Errorf("checkpoint ls takes at most one SANDBOX or SESSION (got %d arguments); see shard checkpoint ls --help", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var cks []client.Checkpoint
			if len(args) == 1 {
				cks, err = c.Checkpoints(cmd.Context(), args[0])
			} else {
				cks, err = c.AllCheckpoints(cmd.Context())
			}
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cks)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "ID\tKIND\tTAG\tSANDBOX\tSESSION\tSIZE\tKEPT\tFREEZE\tCREATED\n")
			var total, auto int64
			for _, ck := range cks {
				kept := "yes"
				if ck.AutoRemove {
					kept, auto = "while used", auto+ck.Size
				}
				total += ck.Size
				termsafe.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ck.ID, ck.Kind, dash(ck.Tag), dash(ck.SandboxName), dash(ck.Session),
					humanSize(ck.Size), kept, time.Duration(ck.FreezeMS)*time.Millisecond, ago(ck.CreatedAt))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(cks) > 0 {
				// On stderr, so that the table alone is on stdout.
				termsafe.Fprintf(os.Stderr, "%d checkpoints, %s on disk; %s of it removed on its own once no sandbox's resume starts from it\n", len(cks), humanSize(total), humanSize(auto))
			}
			return nil
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")

	inspect := inspectCmd(a, "inspect CHECKPOINT", "Show a checkpoint as JSON", `  shard checkpoint inspect 7c1e0a9b4f2d`, "a CHECKPOINT id",
		func(ctx context.Context, c *client.Client, id string) (any, error) { return c.GetCheckpoint(ctx, id) })

	rm := eachArg(a, "rm CHECKPOINT...", "Remove checkpoints (not one an environment uses)", "one or more CHECKPOINT id",
		func(ctx context.Context, c *client.Client, id string) (any, error) {
			return map[string]string{"removed": id}, c.RemoveCheckpoint(ctx, id)
		})
	rm.Aliases = []string{"remove"}
	rm.Example = `  shard checkpoint rm 7c1e0a9b4f2d`

	cmd.AddCommand(ls, inspect, rm)
	return cmd
}
