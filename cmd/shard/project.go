package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
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

A project is made by using it: there is nothing to create or remove.
An administrator bounds what one project may hold with 'shard project set'
(sandboxes, their memory, cpu and disk, saved bytes, ledger bytes); past a
bound a request is refused (403 quota_exceeded) and nothing is made.`,
		Example: `  shard project ls
  shard --project team-a ls
  shard token create --project team-a --name agent --scope sandbox:write
  shard project set team-a --max-sandboxes 20 --max-memory 16GiB --max-cpu 8`,
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
			termsafe.Fprintf(tw, "PROJECT\tSANDBOXES\tMEMORY\tCPU\tDISK\tSAVED\tLEDGER\tSESSIONS\tCHECKPOINTS\tSNAPSHOTS\tENVIRONMENTS\tSECRETS\tTOKENS\n")
			for _, p := range ps {
				u, q := p.Use, p.Quota
				termsafe.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Name,
					ofQuota(u.Sandboxes, q.MaxSandboxes, count), ofQuota(u.MemoryBytes, q.MaxMemoryBytes, humanSize),
					ofQuota(u.CPUMillis, q.MaxCPUMillis, units.FormatCPU), ofQuota(u.DiskBytes, q.MaxDiskBytes, humanSize),
					ofQuota(u.SavedBytes, q.MaxSavedBytes, humanSize), ofQuota(u.LedgerBytes, q.MaxLedgerBytes, humanSize),
					p.Sessions, p.Checkpoints, p.Snapshots, p.Environments, p.Secrets, p.Tokens)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")
	cmd.AddCommand(ls, newProjectSetCmd(a))
	return cmd
}

// ofQuota is "use/limit", or the use alone when there is no limit.
func ofQuota(use, limit int64, f func(int64) string) string {
	if limit <= 0 {
		return f(use)
	}
	return f(use) + "/" + f(limit)
}

func newProjectSetCmd(a *app) *cobra.Command {
	var sandboxes, memory, cpu, disk, saved, ledger string
	cmd := &cobra.Command{
		Use:   "set NAME [--max-sandboxes N] [--max-memory SIZE] [--max-cpu CPU] [--max-disk SIZE] [--max-saved-bytes SIZE] [--max-ledger-bytes SIZE]",
		Short: "Set a project's quota (an administrator's act)",
		Long: `Set what project NAME may hold. Each flag given sets one bound ("none" or 0
removes it); bounds not given keep what they were.

  --max-sandboxes     sandboxes, whatever their state (forks count)
  --max-memory        memory bounds of its running sandboxes and warm spares
  --max-cpu           their cpu bounds (e.g. 4, or 500m)
  --max-disk          disk bounds of its sandboxes, whatever their state
  --max-saved-bytes   what its checkpoints (forks' and environments' too) and
                      snapshots take on disk
  --max-ledger-bytes  what its ledger's events take in the database

A request past a bound is refused with 403 quota_exceeded, naming the bound,
what the project holds and the limit, and nothing is made; what a project
already holds past a lowered bound stays. Only the socket, or a key of every
project with the scope "*", may set quotas. 'shard project ls' shows each
project's use against its quota.`,
		Example: `  shard project set team-a --max-sandboxes 20 --max-memory 16GiB --max-cpu 8
  shard project set team-a --max-disk 100GiB --max-saved-bytes 20GiB --max-ledger-bytes 1GiB
  shard project set team-a --max-memory none`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			name := args[0]
			var q client.ProjectQuota
			ps, err := c.Projects(cmd.Context())
			if err != nil {
				return err
			}
			for _, p := range ps {
				if p.Name == name {
					q = p.Quota
				}
			}
			f := cmd.Flags()
			const size = "a size such as 16GiB or 512MiB"
			for _, b := range []struct {
				flag, v string
				to      *int64
				parse   func(string) (int64, error)
				like    string
			}{
				{"max-sandboxes", sandboxes, &q.MaxSandboxes, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }, "a whole number"},
				{"max-memory", memory, &q.MaxMemoryBytes, units.ParseSize, size},
				{"max-cpu", cpu, &q.MaxCPUMillis, units.ParseCPU, "cpus such as 4 or 500m"},
				{"max-disk", disk, &q.MaxDiskBytes, units.ParseSize, size},
				{"max-saved-bytes", saved, &q.MaxSavedBytes, units.ParseSize, size},
				{"max-ledger-bytes", ledger, &q.MaxLedgerBytes, units.ParseSize, size},
			} {
				if !f.Changed(b.flag) {
					continue
				}
				if b.v == "none" {
					*b.to = 0
					continue
				}
				n, err := b.parse(b.v)
				if err != nil || n < 0 {
					return fmt.Errorf("--%s %q: give %s, or 0 or none for no bound", b.flag, b.v, b.like)
				}
				*b.to = n
			}
			p, err := c.SetProjectQuota(cmd.Context(), name, q)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(p)
			}
			termsafe.Printf("project %s: %s\n", p.Name, quotaText(p.Quota))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&sandboxes, "max-sandboxes", "", "most sandboxes (none: no bound)")
	f.StringVar(&memory, "max-memory", "", "most memory of running sandboxes, e.g. 16GiB (none: no bound)")
	f.StringVar(&cpu, "max-cpu", "", "most cpu of running sandboxes, e.g. 8 or 500m (none: no bound)")
	f.StringVar(&disk, "max-disk", "", "most disk of sandboxes, e.g. 100GiB (none: no bound)")
	f.StringVar(&saved, "max-saved-bytes", "", "most bytes of checkpoints and snapshots (none: no bound)")
	f.StringVar(&ledger, "max-ledger-bytes", "", "most bytes of ledger events (none: no bound)")
	f.BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}

func count(n int64) string { return strconv.FormatInt(n, 10) }

// quotaText says a quota in a line.
func quotaText(q client.ProjectQuota) string {
	var parts []string
	add := func(name string, v int64, f func(int64) string) {
		if v > 0 {
			parts = append(parts, name+" "+f(v))
		}
	}
	add("sandboxes", q.MaxSandboxes, count)
	add("memory", q.MaxMemoryBytes, humanSize)
	add("cpu", q.MaxCPUMillis, units.FormatCPU)
	add("disk", q.MaxDiskBytes, humanSize)
	add("saved", q.MaxSavedBytes, humanSize)
	add("ledger", q.MaxLedgerBytes, humanSize)
	if len(parts) == 0 {
		return "no quota"
	}
	return "quota: " + strings.Join(parts, ", ")
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
