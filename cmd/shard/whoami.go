package main

import (
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/internal/termsafe"
)

func newVersionCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show this CLI's version and the server's",
		Long: `Show the version of this shard binary and of the server it reaches (GET
/v0/version, which needs no key). In a cluster every node must run the same
build for a fork to move between nodes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.ServerVersion(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(map[string]any{"client": version, "server": v})
			}
			termsafe.Fprintf(os.Stdout, "client:  %s\nserver:  %s (API %s)\n", version, v.Version, v.API)
			return nil
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}

func newWhoamiCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "whoami",
		Short: "Show the API key in use: its name, project and scopes",
		Long: `Show the API key the CLI sends (SHARD_API_KEY, to SHARD_REMOTE): its
name, the project it acts in ("*": every project) and its scopes. On the
Unix socket it is the administrator, with every scope.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			w, err := c.Whoami(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(w)
			}
			termsafe.Fprintf(os.Stdout, "name:     %s\nproject:  %s\nscopes:   %s\n", w.Name, w.Project, strings.Join(w.Scopes, " "))
			return nil
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}
