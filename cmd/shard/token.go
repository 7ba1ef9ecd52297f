package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/termsafe"
)

func newTokenCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "token",
		Aliases: []string{"tokens"},
		Short:   "API keys for reaching the server over TCP: create, ls, revoke",
		Long: `The server's Unix socket (root only) is the administrator: whoever can open
it may do everything, and needs no key. Over TCP (shard serve --listen) every
request but GET /v0/version and GET /v0/openapi.json needs an API key, sent
as Authorization: Bearer KEY; the CLI and the client send SHARD_API_KEY, to
the server in SHARD_REMOTE.

A key has scopes, which say what it may do:

` + scopeHelp() + `
A fork of a sandbox with grants also needs secret:*, and of one with a
network policy policy:*.

The server keeps only a hash of each key: 'shard token create' shows the key
once.`,
		Example: `  shard token create --name ci --scope sandbox:read --scope sandbox:write
  SHARD_REMOTE=http://10.0.0.5:7070 SHARD_API_KEY=shk_... shard list
  shard token ls
  shard token revoke ci`,
	}

	var name string
	var scopes []string
	var allProjects bool
	create := &cobra.Command{
		Use:   "create --name NAME --scope SCOPE [--scope SCOPE...] [--project NAME | --all-projects]",
		Short: "Create an API key; prints the key, once",
		Long: `Create an API key named NAME with the given scopes (at least one; see
shard token --help for the list). The key is printed on stdout this once:
the server keeps only its hash, so a lost key cannot be shown again; revoke
it and create another.

A key acts in one project: --project NAME (default: the project this command
acts in, "default" unless SHARD_PROJECT says otherwise). It never sees or
touches another project's objects. --all-projects makes a key of every
project, which names its project per request (--project, SHARD_PROJECT);
only such a key, or the socket, may make one. A key makes keys only as
strong as itself: its own scopes at most, in its own project.`,
		Example: `  shard token create --name ci --scope sandbox:read --scope sandbox:write
  shard token create --project team-a --name agent --scope sandbox:write
  shard token create --name admin --scope '*' --all-projects
  export SHARD_API_KEY=$(shard token create --name agent --scope sandbox:write)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return fmt.Errorf("token create needs --name NAME")
			}
			if len(scopes) == 0 {
				return fmt.Errorf("token create needs at least one --scope, of: %s", strings.Join(auth.Known, " "))
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			req := client.TokenRequest{Name: name, Scopes: scopes, Project: a.project}
			if allProjects {
				if a.project != "" {
					return fmt.Errorf("token create takes --project NAME or --all-projects, not both")
				}
				req.Project = "*"
			}
			tok, err := c.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(tok)
			}
			termsafe.Println(tok.Key)
			termsafe.Fprintln(os.Stderr, "this key is shown once: keep it; only its hash is stored")
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "name of the token (unique in its project)")
	create.Flags().BoolVar(&allProjects, "all-projects", false, "a key of every project (an administrator's), which may choose its project per request")
	create.Flags().StringSliceVar(&scopes, "scope", nil, "a scope the key has (repeatable, or comma-separated)")
	create.Flags().BoolVar(&a.json, "json", false, "print the token and its key as JSON")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List API keys: id, name, scopes (never the keys)",
		Example: `  shard token ls`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			toks, err := c.Tokens(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(toks)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "ID\tNAME\tPROJECT\tSCOPES\tCREATED\n")
			for _, t := range toks {
				termsafe.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Project, dash(strings.Join(t.Scopes, ",")), ago(t.CreatedAt))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")

	revoke := eachArg(a, "revoke ID|NAME...", "Revoke API keys: they stop working at once", "one or more token ID or NAME",
		func(ctx context.Context, c *client.Client, id string) (any, error) {
			return map[string]string{"revoked": id}, c.RevokeToken(ctx, id)
		})
	revoke.Aliases = []string{"rm", "remove"}
	revoke.Example = `  shard token revoke ci`

	cmd.AddCommand(create, ls, revoke)
	return cmd
}

// scopeDoc says what each scope allows, for the help.
var scopeDoc = map[string]string{
	auth.SandboxRead:  "list and inspect sandboxes, images, snapshots, checkpoints, environments, the ledger",
	auth.SandboxWrite: "create, exec, stop, start, remove, fork, checkpoint, restore, resume; images; ports",
	"sandbox:*":       "both of those",
	auth.SecretRead:   "list secrets (names, never values) and a sandbox's grants",
	auth.SecretWrite:  "set and remove secrets; grant and ungrant them",
	auth.SecretAll:    "both of those",
	auth.PolicyRead:   "show a sandbox's network policy",
	auth.PolicyWrite:  "set and clear it",
	auth.PolicyAll:    "both of those",
	auth.TokenRead:    "list tokens",
	auth.TokenWrite:   "create and revoke tokens",
	auth.TokenAll:     "both of those",
	auth.MetricsRead:  "scrape GET /metrics (Prometheus; a key of every project only)",
	auth.All:          "everything",
}

// scopeHelp is the table of scopes (auth.Known) in token's help.
func scopeHelp() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, s := range auth.Known {
		termsafe.Fprintf(tw, "  %s\t%s\n", s, scopeDoc[s])
	}
	tw.Flush()
	return b.String()
}
