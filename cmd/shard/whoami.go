package main

import (
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/internal/termsafe"
)

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
