package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
)

func newEnvCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "env",
		Aliases: []string{"environment", "environments"},
		Short:   "Named environments, set up once, that sandboxes start from warm: create, ls, inspect, rm",
		Long: `An environment is a named sandbox state set up once: a sandbox of an image,
with bounds and environment variables, in which a setup command ran; its
checkpoint (memory, processes and files) is what 'shard create --env-from
NAME' starts new sandboxes from, warm, without running the setup again.

'shard env create' with the same definition again does nothing (unchanged);
a changed one (image, bounds, variables, provider or setup) rebuilds it.`,
		Example: `  shard env create py-deps --memory 1GiB python:3.12-slim -- pip install --quiet requests
  shard create --env-from py-deps --name job-1
  shard env ls`,
	}
	var memory, cpu, disk, provider string
	var env []string
	var quiet bool
	create := &cobra.Command{
		Use:   "create NAME [flags] IMAGE [-- SETUP-CMD...]",
		Short: "Build an environment (or leave it unchanged); prints its name and fingerprint",
		Long: `Build the environment NAME: a sandbox of IMAGE with the given bounds and
variables, in which SETUP-CMD (everything after --, one command with its
arguments; use sh -c '...' for several) runs and must exit 0; then the
sandbox is checkpointed, and that checkpoint is the environment. A setup
command that fails is reported with its exit code and the end of its output
(setup_failed).

The answer is NAME, its fingerprint, and "built", or "unchanged" when an
environment of that name already has the same definition (nothing ran).`,
		Example: `  shard env create py-deps python:3.12-slim -- pip install --quiet requests
  shard env create py-deps --memory 1GiB --env PIP_NO_CACHE_DIR=1 python:3.12-slim -- sh -c 'pip install --quiet requests && python3 -c "import requests"'
  shard env create bare busybox`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, image, setup, err := splitEnvArgs(args, cmd.ArgsLenAtDash())
			if err != nil {
				return err
			}
			req := client.EnvironmentRequest{Name: name, Image: image, Provider: provider}
			if setup != nil {
				req.Setup = [][]string{setup}
			}
			if req.Memory, req.CPU, req.Disk, err = sizeFlags(memory, cpu, disk); err != nil {
				return err
			}
			if req.Env, err = envList(env); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if err := ensureImage(ctx, c, image, quiet || a.json); err != nil {
				return err
			}
			e, built, err := c.BuildEnvironment(ctx, req)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(e)
			}
			how := "built"
			if !built {
				how = "unchanged"
			}
			termsafe.Println(e.Name, e.Fingerprint, how)
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&memory, "memory", "", "memory bound, e.g. 1GiB (default 512MiB)")
	f.StringVar(&cpu, "cpu", "", "cpu bound in cpus, e.g. 1, 0.5 or 500m (default 1)")
	f.StringVar(&disk, "disk", "", "disk bound, e.g. 4GiB (default 2GiB; reserved in full on the server)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&provider, "provider", "", "isolation provider; it must be able to checkpoint (shard capabilities)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar while pulling")
	f.BoolVar(&a.json, "json", false, "print the environment as JSON")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List environments",
		Example: `  shard env ls`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			envs, err := c.Environments(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(envs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "NAME\tIMAGE\tMEMORY\tCPU\tCHECKPOINT\tCREATED\n")
			for _, e := range envs {
				termsafe.Fprintf(tw, "%s\t%s\t%s\t%g\t%s\t%s\n", e.Name, e.Image, units.FormatSize(e.MemoryBytes), e.CPU, dash(e.Checkpoint), ago(e.CreatedAt))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")

	inspect := inspectCmd(a, "inspect NAME", "Show an environment as JSON", `  shard env inspect py-deps`, "an environment NAME",
		func(ctx context.Context, c *client.Client, id string) (any, error) { return c.GetEnvironment(ctx, id) })

	rm := eachArg(a, "rm NAME...", "Remove environments", "one or more environment NAME",
		func(ctx context.Context, c *client.Client, name string) (any, error) {
			return map[string]string{"removed": name}, c.RemoveEnvironment(ctx, name)
		})
	rm.Aliases = []string{"remove"}
	rm.Example = `  shard env rm py-deps`

	cmd.AddCommand(create, ls, inspect, rm)
	return cmd
}

// splitEnvArgs splits env create's arguments: NAME and IMAGE before --,
// the setup command after it (nil without --). dash is
// cmd.ArgsLenAtDash(): how many arguments came before --, or -1.
func splitEnvArgs(args []string, dash int) (name, image string, setup []string, err error) {
	before := args
	if dash >= 0 {
		before, setup = args[:dash], args[dash:]
		if len(setup) == 0 {
			return "", "", nil, fmt.Errorf("env create: nothing after --: give the setup command there, or leave out --")
		}
	}
	if len(before) != 2 {
		where := ""
		if dash >= 0 {
			where = " before --"
		}
		return "", "", nil, fmt.Errorf("env create takes a NAME and an IMAGE, then optionally -- and a setup command (got %d arguments%s); see shard env create --help", len(before), where)
	}
	return before[0], before[1], setup, nil
}
