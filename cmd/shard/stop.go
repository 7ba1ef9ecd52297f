package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newStopCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stop SANDBOX...",
		Short: "Stop sandboxes: their processes end, their files stay",
		Args:  minArgs(1, "one or more SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				sb, err := c.Stop(cmd.Context(), id)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if a.json {
					printJSON(sb)
					continue
				}
				fmt.Println(id)
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print each sandbox as JSON")
	return cmd
}
