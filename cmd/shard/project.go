package main

import (
	"context"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newProjectCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "project",
		Aliases: []string{"projects"},
		Short:   "Projects: the namespaces every object lives in",
		Long: `Every sandbox, checkpoint, snapshot, environment, ledger session, secret,
token and imported image belongs to one project. A key made for one project
('shard token create --project NAME') sees and touches only that project's
objects; another project's are not found. A key of every project
('--all-projects'), and the Unix socket, act in the project --project names
(or SHARD_PROJECT; default "default").

A project is made by using it: there is nothing to create or remove.`,
		Example: `  shard project ls
  shard --project team-a ls
  shard token create --project team-a --name agent --scope sandbox:write`,
	}
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the projects that hold anything, with their counts",
		Long: `List the projects that hold anything, with how many objects of each kind.
A key of every project, and the socket, see every project; a project's key
sees its own.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ps, err := c.Projects(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(ps)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "PROJECT\tSANDBOXES\tSESSIONS\tCHECKPOINTS\tSNAPSHOTS\tENVIRONMENTS\tSECRETS\tTOKENS\n")
			for _, p := range ps {
				termsafe.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Name, p.Sandboxes, p.Sessions, p.Checkpoints, p.Snapshots, p.Environments, p.Secrets, p.Tokens)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")
	cmd.AddCommand(ls)
	return cmd
}

// warnEmptyProject says on stderr when the project a command named (with
// --project or SHARD_PROJECT) holds nothing at all: a mistyped name acts in
// a project of its own, and its empty list would look like a real one.
func (a *app) warnEmptyProject(ctx context.Context, c *client.Client) {
	named := a.project
	if named == "" {
		named = os.Getenv("SHARD_PROJECT")
	}
	if named == "" {
		return
	}
	ps, err := c.Projects(ctx)
	if err != nil {
		return
	}
	for _, p := range ps {
		if p.Name == named && (p.Sandboxes+p.Sessions+p.Checkpoints+p.Snapshots+p.Environments+p.Secrets+p.Tokens) > 0 {
			return
		}
	}
	termsafe.Fprintf(os.Stderr, "shard: project %s holds nothing yet (is its name right? shard project ls lists those that hold something)\n", named)
}
