package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newForkCmd(a *app) *cobra.Command {
	var req client.ForkRequest
	cmd := &cobra.Command{
		Use:   "fork [--name NAME] [--count N] SOURCE",
		Short: "Copy a running sandbox: files, memory and processes; prints the new id",
		Long: `Fork a running sandbox. The fork starts with what SOURCE held at that moment:
its files as its own copy, its memory and processes continuing where they
were, its memory, cpu and disk bounds. It gets a new id, name and address.
The source freezes for a moment, then carries on with the same processes.

--count N makes N forks from one freeze (with --name, named NAME-1 ... NAME-N).
Fork needs a provider that can (shard capabilities): gvisor here.

A fork knows it was forked: it gets its own host name (its name), address,
/etc/machine-id (if the image has one) and /run/shard/fork (JSON: id, name,
parent_id, parent_name, checkpoint, generation, forked_at). Then the
executables in /etc/shard/on-fork.d run in it, in name order, before the
fork is answered (to reseed a random generator, drop a lease, get a new
client id); their output and exit codes go to the fork's ledger. A hook that
fails refuses the fork (fork_hook_failed) unless --hook-errors=ignore.

A fork goes through a checkpoint of SOURCE (listed by shard checkpoint ls;
about the source's memory in size). It is removed once no sandbox's resume
starts from it: when the source has checkpointed or forked again, or is
removed, and the forks are removed (or have checkpointed or forked
themselves). --keep-checkpoint keeps it until shard checkpoint rm, so that
shard resume of a removed fork's ledger session still works.`,
		Example: `  shard fork --name try-a base
  shard fork --count 3 --name try base`,
		Args: exactArgs(1, "a SOURCE sandbox (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := countFlag(req.Count); err != nil {
				return err
			}
			if err := tagFlag(req.Tag); err != nil {
				return err
			}
			last := req.Name
			if req.Count > 1 && last != "" {
				last = fmt.Sprintf("%s-%d", req.Name, req.Count)
			}
			if err := nameFlag("fork", last); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			forks, err := c.ForkMany(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if a.json {
				if req.Count <= 1 {
					return printJSON(forks[0])
				}
				return printJSON(forks)
			}
			for _, f := range forks {
				termsafe.Println(f.ID)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Name, "name", "", "name of the fork (a prefix with --count)")
	cmd.Flags().IntVar(&req.Count, "count", 1, "how many forks to make from one freeze, 1 to 64")
	cmd.Flags().StringVar(&req.Tag, "tag", "", "tag stored with the checkpoint in the source's ledger")
	cmd.Flags().StringVar(&req.HookTimeout, "hook-timeout", "", "how long each on-fork hook may run (default 30s, at most 10m)")
	cmd.Flags().StringVar(&req.HookErrors, "hook-errors", "", "fail (default: a failing hook refuses the fork) or ignore")
	cmd.Flags().BoolVar(&req.KeepCheckpoint, "keep-checkpoint", false, "keep the fork's checkpoint until shard checkpoint rm (default: removed once no sandbox needs it)")
	cmd.Flags().BoolVar(&req.HooksInSource, "hooks-in-source", false, "run the on-fork hooks in the source too (SHARD_FORK_ROLE=source), after the forks'")
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}
