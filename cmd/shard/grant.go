package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/names"
)

func newGrantCmd(a *app) *cobra.Command {
	var g client.Grant
	cmd := &cobra.Command{
		Use:   "grant SANDBOX SECRET [--env VAR | --file PATH]",
		Short: "Give a secret to a sandbox: as an env variable of its execs, or as a file",
		Long: `Give the secret SECRET (shard secret set) to SANDBOX.

By default, or with --env VAR, every later exec in the sandbox gets it as the
environment variable VAR (the secret's name by default). The value is read
at each exec, so a new value of the secret reaches the next one; it is not
stored in the sandbox's record or its ledger.

With --file PATH it is written into the sandbox as the file PATH (absolute;
mode 0400, owned by root) at once, so the sandbox must be running.

Granting a secret again replaces its grant. A fork gets a copy of its
source's grants (forking a sandbox that has grants needs a key with
secret:*). 'shard ungrant' takes one away; 'shard inspect' lists them.`,
		Example: `  shard grant base OPENAI_API_KEY
  shard grant base gh-token --env GH_TOKEN
  shard grant base tls.key --file /etc/app/tls.key`,
		Args: exactArgs(2, "a SANDBOX and a SECRET"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.Env != "" && g.File != "" {
				return fmt.Errorf("grant takes --env or --file, not both")
			}
			if g.Env != "" {
				if err := names.EnvName(g.Env); err != nil {
					return fmt.Errorf("--env: %w", err)
				}
			}
			if g.File != "" {
				if err := names.FilePath("--file", g.File); err != nil {
					return err
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			g.Secret = args[1]
			sb, err := c.Grant(cmd.Context(), args[0], g)
			if err != nil {
				return err
			}
			if a.json {
				for _, got := range sb.Grants {
					if got.Secret == g.Secret {
						return printJSON(got)
					}
				}
				return printJSON(g)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&g.Env, "env", "", "the environment variable's name (default: the secret's name)")
	cmd.Flags().StringVar(&g.File, "file", "", "write the secret as this file (an absolute path) instead")
	cmd.Flags().BoolVar(&a.json, "json", false, "print the grant as JSON")
	return cmd
}

func newUngrantCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ungrant SANDBOX SECRET",
		Short: "Take a secret away from a sandbox",
		Long: `Take the secret SECRET away from SANDBOX: later execs no longer get its
variable, and a granted file is removed (so the sandbox must be running for a
file grant). Processes already running keep what they had. Forks keep their
own grants.`,
		Example: `  shard ungrant base OPENAI_API_KEY`,
		Args:    exactArgs(2, "a SANDBOX and a SECRET"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Ungrant(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(sb)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print the sandbox as JSON")
	return cmd
}
